// Testing only (not the public API): the forward kernel with a P dump, for the GPU test of P
// codes against the golden model (tests/cuda/test_p_dump_gpu.cu, docs/numerics.md "GPU P codes
// vs the golden model"). Instantiated in fwd_dump_p.cu only, so the library's kernels carry none
// of it.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "fp4attn/attention.h"
#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn::detail {

// Dump layout of a problem (b, h, s_q, s_k): N-key blocks, blocks = ceil(s_k / N) per row.
//   p: uint8 [b, h, s_q, blocks * N]: the E4M3 byte the PV wgmma multiplies with key j's V row,
//      in real key order (the V^T key permutation undone), keys past s_k included (masked: 0).
//   m: float [b, h, s_q, blocks]: the row's integer running reference after block j's update,
//      the m that block's P was made with (-inf while no key was visible).
// Only the blocks the kernel processes for the row's 128-row tile are written
// (p_dump_written_blocks); the rest keep whatever the caller put there (poison).
struct PDumpLayout {
  int block_keys = 128;  // N
  int64_t blocks = 0;
  int64_t key_stride() const { return blocks * block_keys; }
};

// N of the dump kernel: 128 at d = 128 (every P path), 256 at d = 64 (exp2 recipes only: the
// wide kernel, whatever causal and s_k; its P rule is the narrow one's).
inline PDumpLayout p_dump_layout(int64_t d, int64_t s_k) {
  PDumpLayout l;
  l.block_keys = d == 64 ? 256 : 128;
  l.blocks = (s_k + l.block_keys - 1) / l.block_keys;
  return l;
}

// Blocks the kernel runs for query row `row` (key_blocks in fwd_kernel.cuh: every block of the
// row's 128-row tile up to its last row's diagonal when causal, bottom-right aligned).
inline int64_t p_dump_written_blocks(const PDumpLayout& l, int64_t s_q, int64_t s_k, bool causal,
                                     int64_t row) {
  int64_t n = l.blocks;
  if (causal) {
    const int64_t m0 = row / 128 * 128;
    const int64_t last_key = std::min(s_q, m0 + 128) - 1 + s_k - s_q;
    n = last_key < 0 ? 0 : std::min(n, last_key / l.block_keys + 1);
  }
  return n;
}

// attention_forward_operands_cuda with the dump: same validation, same kernel body. Recipes:
// every recipe at d = 128; at d = 64 the exp2 ones (fp8, nvfp4, nvfp4-hx, mxfp4). p_dump and
// m_dump: device memory of the layout above.
Status attention_forward_p_dump_cuda(const ForwardOperands& in, const ForwardOptions& opt,
                                     const TensorView& o, const TensorView& lse, uint8_t* p_dump,
                                     float* m_dump, cudaStream_t stream);

}  // namespace fp4attn::detail
