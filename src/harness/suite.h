// The pinned, seeded input suite on which every recipe's accuracy is judged (DESIGN.md:
// near-uniform Gaussian attention is a weak test, so the suite adds outlier channels, attention
// sinks with large logits and peaked rows).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "fp4attn/status.h"

namespace fp4attn {

enum class InputKind { kGaussian, kOutlierChannels, kLargeLogits, kNearUniform };

constexpr InputKind kAllInputKinds[] = {InputKind::kGaussian, InputKind::kOutlierChannels,
                                        InputKind::kLargeLogits, InputKind::kNearUniform};

// Names: "gaussian", "outliers", "large-logits", "near-uniform".
const char* input_kind_name(InputKind kind);
bool parse_input_kind(std::string_view name, InputKind* out);

// Contiguous BSHD tensors: q [b, s_q, h, d], k and v [b, s_k, h_kv, d]. Every value is exactly
// representable in BF16 (rounded to nearest even from double), so that GPU and CPU see identical
// inputs whichever of f32/bf16 they read.
struct SuiteInputs {
  std::vector<float> q, k, v;
  int64_t b, s_q, s_k, h, h_kv, d;
};

// Deterministic across platforms and thread counts: an element is a pure function of (seed,
// tensor, its BSHD coordinates) through a counter-based hash (splitmix64) and our own Box-Muller,
// plus the inner shape (h, h_kv, d; and s_k for the peaked rows of kLargeLogits). So a tensor
// with more batches, or with b = 1 and a longer sequence, starts with the smaller one's values.
// With the default softmax scale 1/sqrt(d):
//  * kGaussian: q, k, v ~ N(0, 1).
//  * kOutlierChannels: heavy-tailed values t = N(0,1) * exp(N(0,1) / 2) everywhere; 4 outlier
//    channels (d/8, 3d/8, 5d/8, 7d/8) where q is 10 t and k is +-20 + t/2 (sign alternating by
//    channel); the other key channels have a per-head mean ~ N(0, 0.25); v = t. Rows are more
//    peaked than Gaussian ones and LSEs are large (q outliers times the key mean).
//  * kLargeLogits: attention sinks: keys at positions 0, 256, 512, ... are 150 u + N(0, 1) for a
//    unit direction u per kv head, and queries carry sqrt(d) (1 + 0.2 N(0,1)) u, so sink logits
//    are ~150 (> 100 for most rows). One query row in 8 is instead peaked: 1.5 times one
//    (non-sink, where possible) key's component orthogonal to u, plus 0.1 N(0, 1).
//  * kNearUniform: q ~ 0.01 N(0, 1), k, v ~ N(0, 1): each row's logits lie within ~0.1.
// Negative sizes are treated as 0. h_kv should divide h (query head i uses kv head i / (h/h_kv)).
// Throws std::length_error with suite_sizes's message when the sizes overflow int64 or the
// tensors exceed host_memory_limit() (core/checked_size.h); call suite_sizes first to get it as
// a Status.
SuiteInputs make_inputs(InputKind kind, int64_t b, int64_t s_q, int64_t s_k, int64_t h,
                        int64_t h_kv, int64_t d, uint64_t seed);

// What make_inputs allocates for these sizes (negative ones read as 0): the elements of q
// [b, s_q, h, d] and of k and of v [b, s_k, h_kv, d], and the bytes of all three (float32).
struct SuiteSizes {
  int64_t q_elements, kv_elements, bytes;
};
// An error naming the sizes (b, s_q, s_k, h, h_kv, d) when a product overflows int64 or the
// bytes exceed host_memory_limit().
Status suite_sizes(int64_t b, int64_t s_q, int64_t s_k, int64_t h, int64_t h_kv, int64_t d,
                   SuiteSizes* out);

// The suite's N(0, 1) generator, for other seeded tensors (e.g. an upstream gradient): a pure
// function of (seed, stream, index), the same on every platform. Streams 1-7 are the suite's own
// tensors; use another.
double suite_normal(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace fp4attn
