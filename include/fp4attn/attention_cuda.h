// Forward attention on the GPU (sm_90a): the Hopper engine of docs/kernels/fwd_sm90.md.
//
// Two entry points:
//  * attention_forward_operands_cuda: runs on kernel operands the caller quantized already
//    (quantize_operand_cuda, include/fp4attn/operands.h), e.g. K/V quantized once and reused;
//  * attention_forward_cuda: BF16/FP16 q/k/v in, quantizes them into stream-ordered scratch
//    memory, then runs the engine.
// Both validate every argument first and return a Status naming the bad one; nothing is launched
// on bad input.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fp4attn/attention.h"

namespace fp4attn {

// o: [b, s_q, h, d] BF16 or FP16 (BSHD, d contiguous; other strides free).
// lse: FP32 [b, h, s_q] (natural log; +inf for rows without keys) or undefined.
// row_max: FP32 [b, h, s_q] or undefined: each row's integer log2 reference m = ceil(max_j z_j)
// (z = the scores times softmax_scale * log2 e; -inf for rows without keys). The backward of the
// exp-free recipes nvfp4-fast and fp4-direct rebuilds their P codes from it (attention_bwd_cuda.h).
Status attention_forward_operands_cuda(const ForwardOperands& in, const ForwardOptions& opt,
                                       const TensorView& o, const TensorView& lse,
                                       cudaStream_t stream, const TensorView& row_max = {});

// q [b, s_q, h, d], k/v [b, s_k, h_kv, d]: BF16 or FP16 BSHD (d contiguous), h % h_kv == 0,
// d 64 or 128. o, lse and row_max as above.
Status attention_forward_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                              const ForwardOptions& opt, const TensorView& o, const TensorView& lse,
                              cudaStream_t stream, const TensorView& row_max = {});

// Varlen batches in FlashAttention's convention: q [total_q, h, d], k/v [total_k, h_kv, d]
// (BF16/FP16, d contiguous), sequence i = tokens [cu_seqlens[i], cu_seqlens[i + 1]). The offsets
// are HOST int32 arrays of batch + 1 entries (starting at 0, non-decreasing): this first version
// quantizes and runs each sequence on its own (one set of launches per sequence; an in-kernel
// varlen schedule is planned). o [total_q, h, d]; lse FP32 [h, total_q] (any strides with the last
// one 1) or undefined. Per-sequence scales, as the dense path's per-(batch, head) ones.
Status attention_forward_varlen_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                     int64_t batch, const ForwardOptions& opt, const TensorView& o,
                                     const TensorView& lse, cudaStream_t stream);

// Whether the current CUDA device can run the engine (compute capability 9.0); the message says
// why not.
Status check_forward_device();

}  // namespace fp4attn
