// Options of the GPU backward (include/fp4attn/attention_bwd_cuda.h); a host header (no CUDA
// types) so that the host-side validation is tested on machines without a GPU.
#pragma once

namespace fp4attn {

struct BackwardCudaOptions {
  // dQ gathers one contribution per key block. false: FP32 atomic adds in whatever order the
  // CTAs reach them (run-to-run differences in the last bits). true: the key blocks of each
  // query block add in key-block order (a per-query-block turn counter): repeated runs are
  // bit-identical, at the cost of waiting for the turn.
  bool deterministic = false;
  // The main kernel (docs/kernels/bwd_sm90.md), for A/B measurements and as a fallback: 0 = the
  // environment variable FP4ATTN_BWD_KERNEL ("v1" or "v2") when set, else v2; 1 = v1 (mma.sync);
  // 2 = v2 (wgmma). Both compute the same numerics (they differ in FP32 summation order only).
  int kernel = 0;
};

}  // namespace fp4attn
