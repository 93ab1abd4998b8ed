// Host checks shared by the paged kernels' launchers (decode.cu, prefill.cu).
#pragma once

#include <cstdint>
#include <string>

#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn::paged {

// A host copy (I32) of a device index tensor: same shape, readable.
inline Status check_host_copy_like(const TensorView& host, const TensorView& dev,
                                   const char* name) {
  FP4ATTN_RETURN_IF_ERROR(check_dtype(host, name, {DType::kI32}));
  FP4ATTN_RETURN_IF_ERROR(check_strides(host, name));
  bool same = host.rank == dev.rank;
  for (int i = 0; same && i < dev.rank; ++i) same = host.shape[i] == dev.shape[i];
  if (!same) {
    return Status::Invalid(std::string(name) + ": expected shape " + dev.shape_str() +
                           " like the device tensor, got " + host.shape_str());
  }
  return check_not_null(host, name);
}

// A cache data view that `kernel` reads in `bytes`-byte vectors: address and outer strides
// multiples of `bytes`.
inline Status check_vector_view(const TensorView& t, const char* name, int bytes,
                                const char* kernel) {
  bool ok = reinterpret_cast<uintptr_t>(t.data) % bytes == 0;
  for (int i = 0; i < 3; ++i) ok = ok && (t.shape[i] <= 1 || t.stride[i] % bytes == 0);
  if (ok) return Status::Ok();
  return Status::Unsupported(std::string(name) + ": the " + kernel + " kernel reads " +
                             std::to_string(bytes) +
                             "-byte vectors: the data address and the page, token and head "
                             "strides must be multiples of " +
                             std::to_string(bytes) + " bytes");
}

}  // namespace fp4attn::paged
