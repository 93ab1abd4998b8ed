// The paged KV cache's host helpers under the tests' name (src/reference/paged_host_cache.h).
#pragma once

#include "harness/paged_host_cache.h"

namespace fp4attn {
namespace paged_test = paged_host;
}  // namespace fp4attn
