// The forward kernel with the P dump (fwd_dump_p.h): its only instantiations, kept out of
// fwd_launch.cu so that the library's kernels are compiled without it.
#include <cuda_runtime.h>

#include <string>

#include "cuda/fwd/kernel.cuh"
#include "cuda/fwd/setup.h"
#include "fp4attn/attention_cuda.h"
#include "support/fwd_dump_p.h"
#include "support/p_dump.cuh"
#include "validate/validate_forward.h"

namespace fp4attn {
namespace sm90 {

template <int D, int PM, int N>
__global__ void __launch_bounds__(kThreads, 1)
    fwd_p_dump_kernel(const __grid_constant__ FwdParams p, const __grid_constant__ PDump dump) {
  fwd_body<D, PM, N>(p, dump);
}

}  // namespace sm90

namespace detail {
namespace {

template <int D, int PM, int N>
Status launch_dump(const sm90::FwdParams& p, const sm90::PDump& dump, cudaStream_t stream) {
  auto kernel = sm90::fwd_p_dump_kernel<D, PM, N>;
  constexpr int smem = sm90::fwd_smem_bytes<D, PM, N>();
  FP4ATTN_RETURN_IF_ERROR(sm90::set_forward_smem(reinterpret_cast<const void*>(kernel), smem));
  dim3 grid;
  FP4ATTN_RETURN_IF_ERROR(sm90::forward_grid(p, &grid));
  kernel<<<grid, sm90::kThreads, smem, stream>>>(p, dump);
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::Ok();
  return Status::Invalid(std::string("fwd P-dump kernel launch: ") + cudaGetErrorString(e));
}

}  // namespace

Status attention_forward_p_dump_cuda(const ForwardOperands& in, const ForwardOptions& opt,
                                     const TensorView& o, const TensorView& lse, uint8_t* p_dump,
                                     float* m_dump, cudaStream_t stream) {
  ForwardShape sh;
  FP4ATTN_RETURN_IF_ERROR(validate_forward_operands(in, opt, o, lse, &sh));
  FP4ATTN_RETURN_IF_ERROR(check_forward_device());
  if (sh.b == 0 || sh.h == 0 || sh.s_q == 0) return Status::Ok();
  const bool exp2 = opt.recipe == Recipe::kFp8 || opt.recipe == Recipe::kNvfp4 ||
                    opt.recipe == Recipe::kNvfp4Hx || opt.recipe == Recipe::kMxfp4;
  if (sh.d == 64 && !exp2) {
    return Status::Unsupported("P dump: d = 64 is instantiated for the exp2 recipes only");
  }
  if (p_dump == nullptr || m_dump == nullptr) return Status::Invalid("P dump: null buffer");
  const PDumpLayout l = p_dump_layout(sh.d, sh.s_k);
  sm90::FwdParams p;
  FP4ATTN_RETURN_IF_ERROR(
      sm90::make_forward_params(in, opt, sh, o, lse, TensorView{}, l.block_keys, &p));
  const sm90::PDump dump{p_dump, m_dump, l.key_stride(), int(l.blocks)};
  if (sh.d == 64) return launch_dump<64, sm90::kPExp2, sm90::kWideN>(p, dump, stream);
  switch (opt.recipe) {
    case Recipe::kNvfp4Fast:
      return launch_dump<128, sm90::kPCodes, sm90::kNarrowN>(p, dump, stream);
    case Recipe::kFp4Direct:
      return launch_dump<128, sm90::kPDirect, sm90::kNarrowN>(p, dump, stream);
    case Recipe::kNvfp4All:
      return launch_dump<128, sm90::kPAll, sm90::kNarrowN>(p, dump, stream);
    default:
      return launch_dump<128, sm90::kPExp2, sm90::kNarrowN>(p, dump, stream);
  }
}

}  // namespace detail
}  // namespace fp4attn
