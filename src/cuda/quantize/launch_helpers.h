// Launch helpers shared by the GPU quantizers' launchers (host): the device's SM count, the grid
// of a grid-stride kernel, and the status of the last launch.
#pragma once

#include <cstdint>

#include "fp4attn/status.h"

namespace fp4attn::packed {

// Multiprocessors of the current device, queried once (132, an H100/H200's, if the query fails).
int sm_count();

// CTAs for a grid-stride loop over `items` with `threads` per CTA: enough for one item per
// thread, at most `waves` CTAs per SM, at least 1.
int grid_for(int64_t items, int threads, int waves = 8);

// Status of the last launch on this thread: Ok, or "<what>: CUDA error: <text>".
Status launch_status(const char* what);

}  // namespace fp4attn::packed
