// Names of the paged KV cache's formats (paged_kv.h).
#include "fp4attn/paged_kv.h"

namespace fp4attn {

const char* kv_cache_format_name(KvCacheFormat f) {
  switch (f) {
    case KvCacheFormat::kNvfp4:
      return "nvfp4";
    case KvCacheFormat::kFp8:
      return "fp8";
  }
  return "unknown";
}

}  // namespace fp4attn
