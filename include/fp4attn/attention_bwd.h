// Options of the GPU backward (include/fp4attn/attention_bwd_cuda.h); a host header (no CUDA
// types) so that the host-side validation is tested on machines without a GPU.
#pragma once

namespace fp4attn {

// Which O enters D = rowsum(dO * O) (docs/numerics.md §8, "D from the forward's O or from a
// high-precision O"); the golden backward's BackwardOptions and the GPU's BackwardCudaOptions.
enum class DSource {
  // The `o` argument: the quantized forward's output (the default).
  kForwardO,
  // O rebuilt from the backward's own P and V, sum_j p_ij v_j (Attn-QAT's high-precision O): then
  // every row of dS sums to zero. Same as kForwardO for nvfp4-fast and fp4-direct. With the GPU's
  // FP8 arithmetic (kEmulatedFp8, the GPU backward): D_i = sum_j p_ij dP_ij of the p and the FP8
  // product's dP that form dS (numerics.md §8), so the rows of dS sum to zero up to FP32 rounding.
  kHighPrecisionO,
};

struct BackwardCudaOptions {
  // dQ gathers one contribution per key block. false: FP32 atomic adds in whatever order the
  // CTAs reach them (run-to-run differences in the last bits). true: the key blocks of each
  // query block add in key-block order (a per-query-block turn counter): repeated runs are
  // bit-identical, at the cost of waiting for the turn.
  bool deterministic = false;
  // The D of dS = p (dP - D). kHighPrecisionO (training: a key bias gets no spurious gradient)
  // sums p dP per query row in the backward's amax pass (FP32 atomics, in key-block turns when
  // deterministic).
  DSource d_source = DSource::kForwardO;
};

}  // namespace fp4attn
