// Backward attention on the GPU (sm_90a): docs/kernels/bwd_sm90.md.
//
// Gradients of the exp2 recipes (fp8, nvfp4, nvfp4-hx, mxfp4, nvfp4-all) and of the exp-free
// nvfp4-fast and fp4-direct with the arithmetic of golden_attention_backward(...,
// BackwardArithmetic:: kEmulatedFp8) (docs/numerics.md §8): S is rebuilt from the forward's E4M3
// Q/K operands, P = exp2(S * scale * log2 e - LSE * log2 e) (exp2 recipes) or the forward's code of
// z - m over its denominator (nvfp4-fast's E4M3 codes, fp4-direct's E2M1 codes per 32-key block: m
// from the forward's row_max output), every GEMM operand is FP8 (E4M3 Q, K, V, P lifted by 2^8, dS;
// E5M2 dO) with per-(batch, head) power-of-two scales, FP32 accumulation, D = rowsum(dO * O) from
// the forward's O (default) or, with BackwardCudaOptions::d_source = kHighPrecisionO, D = sum_j
// p_ij dP_ij.
//
// Two entry points, as the forward's:
//  * attention_backward_operands_cuda: on the kernel operands the forward ran on
//    (ForwardOperands, operands.h layouts);
//  * attention_backward_cuda: BF16/FP16 q/k/v in, quantized again into stream-ordered scratch
//    (the same bytes as the forward's quantization, so the same operands).
// Both validate every argument first and return a Status naming the bad one; nothing is launched
// on bad input. Scratch memory (about 3 * b * h * s_q * d bytes plus an FP32 dQ accumulator of
// 4 * b * h * s_q * d bytes) comes from the stream-ordered allocator; nothing synchronizes.
#pragma once

#include <cuda_runtime_api.h>

#include "fp4attn/attention.h"
#include "fp4attn/attention_bwd.h"

namespace fp4attn {

// in, opt: what the forward ran on (opt.recipe one of the engine's: fp8, nvfp4, nvfp4-hx, mxfp4,
// nvfp4-all, nvfp4-fast, fp4-direct).
// row_max: the forward's row_max output (attention_cuda.h), required for nvfp4-fast and
// fp4-direct, ignored otherwise.
// o: the forward's output [b, s_q, h, d] BF16/FP16 (d contiguous); lse: FP32 [b, h, s_q] (natural
// log, +inf for rows without keys), required; dout: [b, s_q, h, d] BF16/FP16 (d contiguous).
// dq [b, s_q, h, d], dk and dv [b, s_k, h_kv, d]: F32 or BF16 (each on its own), d contiguous,
// other strides free but not overlapping. GQA: dk/dv summed over each group's query heads.
Status attention_backward_operands_cuda(const ForwardOperands& in, const ForwardOptions& opt,
                                        const TensorView& o, const TensorView& lse,
                                        const TensorView& dout, const TensorView& dq,
                                        const TensorView& dk, const TensorView& dv,
                                        const BackwardCudaOptions& bopt, cudaStream_t stream,
                                        const TensorView& row_max = {});

// q [b, s_q, h, d], k/v [b, s_k, h_kv, d]: BF16/FP16 BSHD as attention_forward_cuda takes them.
Status attention_backward_cuda(const TensorView& q, const TensorView& k, const TensorView& v,
                               const ForwardOptions& opt, const TensorView& o,
                               const TensorView& lse, const TensorView& dout, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv,
                               const BackwardCudaOptions& bopt, cudaStream_t stream,
                               const TensorView& row_max = {});

}  // namespace fp4attn
