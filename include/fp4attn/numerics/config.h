// Host/device function qualifiers shared by the header-only numerics.
#pragma once

#if defined(__CUDACC__)
#define FP4ATTN_HD __host__ __device__ __forceinline__
#else
#define FP4ATTN_HD inline
#endif
