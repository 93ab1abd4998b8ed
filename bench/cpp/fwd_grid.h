// The forward grid of issue 4 (BACKGROUND.md §4): 16k tokens in total (b = 16384 / s), hidden
// 2048 (h = 2048 / d), d in {64, 128}, s in {1k .. 16k}, causal off and on, h_kv = h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp4attn::bench {

struct FwdPoint {
  int64_t b = 0, h = 0, h_kv = 0, s_q = 0, s_k = 0, d = 0;
  bool causal = false;

  std::string name() const;  // "d128-s8192-causal" (bench/peers.py's names)
  // 4 b h s_q s_k d, halved for causal (the convention of the peers and of FlashAttention).
  double flops() const;
  int64_t tokens_q() const { return b * s_q; }
};

constexpr int64_t kFwdTokens = 16384;
constexpr int64_t kFwdHidden = 2048;

// dims/seqlens empty: the full grid (quick: d = 128, s in {4k, 16k}). Ordered d, s, causal.
std::vector<FwdPoint> fwd_grid(bool quick, const std::vector<int64_t>& dims,
                               const std::vector<int64_t>& seqlens);

// The shape of FlashAttention-3's FP8 accuracy figure (cos 0.9986, rel-L2 0.053 on N(0, 1)).
FwdPoint fa3_accuracy_point();

}  // namespace fp4attn::bench
