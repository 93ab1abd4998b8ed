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
};

}  // namespace fp4attn
