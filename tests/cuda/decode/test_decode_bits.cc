// The integer side of the GPU paged decode kernel (src/cuda/decode/decode_bits.h), on the CPU:
// the E2M1 -> BF16 bit trick for every code in every nibble position, the exactness of the
// E2M1 x E4M3 product in BF16 with the kernel's 2^118 scale bias for every scale, and an
// emulation of the kernel's MMA fragments (mma.m16n8k16 row.col, the PTX register layouts)
// built with the kernel's own helpers from real packed codes: S = Q K^T and O = P V through the
// permuted channel and key maps must equal the plain products, for d = 64 and 128, NVFP4 and FP8.
// This is what can be checked without a GPU; the GPU tests (tests/cuda/test_paged_decode_gpu.cu)
// check the kernel itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/decode/decode_bits.h"
#include "fp4attn/numerics/formats.h"

namespace fp4attn::paged {
namespace {

double bf16_lo(uint32_t w) { return bits_float(w << 16); }
double bf16_hi(uint32_t w) { return bits_float(w & 0xFFFF0000u); }

// Round-to-nearest-even of a double to BF16 (finite inputs in the normal/subnormal FP32 range).
double round_bf16(double x) {
  float f = static_cast<float>(x);  // exact for the values used here (checked by the callers)
  uint32_t u = float_bits(f);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return bits_float(u & 0xFFFF0000u);
}

TEST(DecodeBits, E2m1ToBf16EveryCodeInEveryPosition) {
  std::mt19937 rng(1);
  for (int pos = 0; pos < 8; ++pos) {
    for (uint32_t code = 0; code < 16; ++code) {
      for (int trial = 0; trial < 8; ++trial) {
        uint32_t x = rng();
        x = (x & ~(0xFu << (4 * pos))) | (code << (4 * pos));
        uint32_t w[4];
        e2m1x8_to_bf16(x, w);
        for (int q = 0; q < 4; ++q) {
          const double lo = bf16_lo(w[q]), hi = bf16_hi(w[q]);
          const double want_lo = std::ldexp(e2m1_to_float((x >> (4 * q)) & 0xF), -126);
          const double want_hi = std::ldexp(e2m1_to_float((x >> (4 * (q + 4))) & 0xF), -126);
          ASSERT_EQ(lo, want_lo) << std::hex << "x " << x << " q " << q;
          ASSERT_EQ(hi, want_hi) << std::hex << "x " << x << " q " << q;
          // The sign of -0 too.
          ASSERT_EQ(std::signbit(lo), ((x >> (4 * q + 3)) & 1) != 0);
        }
      }
    }
  }
}

TEST(DecodeBits, E2m1TimesE4m3ScaleIsExactInBf16) {
  const double bias = std::ldexp(1.0, 118);
  for (int sc = 0; sc < 0x7F; ++sc) {  // every finite non-negative E4M3 scale
    const double s = e4m3_to_float(static_cast<uint8_t>(sc));
    const double s_biased = s * bias;
    ASSERT_EQ(round_bf16(s_biased), s_biased) << "scale " << sc << " is not exact in BF16";
    ASSERT_LT(s_biased, std::ldexp(1.0, 127));
    for (uint32_t code = 0; code < 16; ++code) {
      uint32_t w[4];
      e2m1x8_to_bf16(code, w);
      const double product = bf16_lo(w[0]) * s_biased;  // exact in double
      const double want = std::ldexp(e2m1_to_float(static_cast<uint8_t>(code)) * s, -8);
      ASSERT_EQ(product, want) << "code " << code << " scale " << sc;
      ASSERT_EQ(round_bf16(product), product) << "code " << code << " scale " << sc;
      // Normal BF16 (or zero): no subnormal output, far from the top of the range.
      ASSERT_TRUE(product == 0 || std::fabs(product) >= std::ldexp(1.0, -126));
      ASSERT_LE(std::fabs(product), 10.5);
    }
  }
}

TEST(DecodeBits, ChannelMapsArePermutations) {
  auto check = [](int d, auto phys) {
    std::vector<int> seen(d, 0);
    for (int ks = 0; ks < d / 16; ++ks) {
      for (int kk = 0; kk < 16; ++kk) {
        const int c = phys(ks, kk);
        ASSERT_GE(c, 0);
        ASSERT_LT(c, d);
        ++seen[c];
        // Inside the chunk of the lane that holds k index kk (t' = (kk & 7) / 2).
        const int t = (kk & 7) >> 1;
        ASSERT_GE(c, (d / 4) * t);
        ASSERT_LT(c, (d / 4) * (t + 1));
      }
    }
    for (int c = 0; c < d; ++c) ASSERT_EQ(seen[c], 1) << "channel " << c;
  };
  check(64, phys_k_nvfp4<64>);
  check(128, phys_k_nvfp4<128>);
  check(64, phys_k_fp8<64>);
  check(128, phys_k_fp8<128>);
  for (int d : {64, 128}) {
    std::vector<int> seen(d, 0);
    for (int j = 0; j < d / 8; ++j) {
      for (int col = 0; col < 8; ++col) ++seen[d == 64 ? phys_o<64>(j, col) : phys_o<128>(j, col)];
    }
    for (int c = 0; c < d; ++c) ASSERT_EQ(seen[c], 1);
  }
  std::vector<int> keys(16, 0);
  for (int t = 0; t < 4; ++t) {
    for (int j = 0; j < 4; ++j) ++keys[v_key(t, j)];
  }
  for (int k = 0; k < 16; ++k) ASSERT_EQ(keys[k], 1);
}

// ---- fragment emulation ------------------------------------------------------------------------

using Frag = uint32_t[4];

// The PTX layouts of mma.m16n8k16 (.row.col, 16-bit inputs, FP32 accumulators), lane = 4 g + t:
// A reg r: row g + 8 (r & 1), columns 2t + 8 (r >> 1) + {0, 1} (low half first); B reg r: rows
// 2t + 8 r + {0, 1}, column g; C element e: row g + 8 (e >> 1), column 2t + (e & 1).
struct Mma {
  double a[16][16], b[16][8];
  void set_a(int lane, int reg, double lo, double hi) {
    const int g = lane >> 2, t = lane & 3, row = g + 8 * (reg & 1), col = 2 * t + 8 * (reg >> 1);
    a[row][col] = lo;
    a[row][col + 1] = hi;
  }
  void set_b(int lane, int reg, double lo, double hi) {
    const int g = lane >> 2, t = lane & 3, k = 2 * t + 8 * reg;
    b[k][g] = lo;
    b[k + 1][g] = hi;
  }
  void run(double (&c)[16][8]) const {
    for (int i = 0; i < 16; ++i) {
      for (int n = 0; n < 8; ++n) {
        for (int k = 0; k < 16; ++k) c[i][n] += a[i][k] * b[k][n];
      }
    }
  }
};

// One 16-key tile: the kernel's S and O fragments against plain products. K and V are random
// codes (NVFP4: packed E2M1 nibbles, unit scales; FP8: E4M3 bytes), Q random.
template <int D, bool kFp4>
void emulate_tile(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int row_bytes = kFp4 ? D / 2 : D;
  std::vector<uint8_t> kb(16 * row_bytes), vb(16 * row_bytes);
  for (auto& x : kb) x = static_cast<uint8_t>(rng());
  for (auto& x : vb) x = static_cast<uint8_t>(rng());
  if (!kFp4) {  // no NaN codes
    for (auto& x : kb) x = (x & 0x7F) == 0x7F ? 0 : x;
    for (auto& x : vb) x = (x & 0x7F) == 0x7F ? 0 : x;
  }
  // The values the codes stand for (NVFP4: e2m1 * 2^-126 as the bit trick reads them).
  auto value = [&](const std::vector<uint8_t>& m, int key, int c) -> double {
    if (kFp4) {
      const uint8_t byte = m[key * row_bytes + c / 2];
      return std::ldexp(e2m1_to_float((c & 1) ? byte >> 4 : byte & 0xF), -126);
    }
    return e4m3_to_float(m[key * row_bytes + c]);
  };
  double q[16][D];
  for (auto& row : q) {
    for (auto& x : row) x = normal(rng);
  }
  auto word = [&](const std::vector<uint8_t>& m, int key, int byte_off) {
    uint32_t w;
    std::memcpy(&w, m.data() + key * row_bytes + byte_off, 4);
    return w;
  };
  auto fp8_pair = [](uint32_t two) {  // cvt.rn.f16x2.e4m3x2: low byte -> low half
    return std::pair<double, double>(e4m3_to_float(two & 0xFF), e4m3_to_float((two >> 8) & 0xFF));
  };

  // S = Q K^T: n-tile j holds keys 8 j + g.
  double s[2][16][8] = {};
  for (int j = 0; j < 2; ++j) {
    for (int ks = 0; ks < D / 16; ++ks) {
      Mma m{};
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        for (int reg = 0; reg < 4; ++reg) {
          const int row = g + 8 * (reg & 1), kk = 2 * t + 8 * (reg >> 1);
          const int c0 = kFp4 ? phys_k_nvfp4<D>(ks, kk) : phys_k_fp8<D>(ks, kk);
          const int c1 = kFp4 ? phys_k_nvfp4<D>(ks, kk + 1) : phys_k_fp8<D>(ks, kk + 1);
          m.set_a(lane, reg, q[row][c0], q[row][c1]);
        }
        const int key = g + 8 * j;
        if (kFp4) {  // word ks / 2 of the lane's chunk at byte t d/8; k-step 2i + u
          uint32_t w[4];
          e2m1x8_to_bf16(word(kb, key, t * (D / 8) + 4 * (ks >> 1)), w);
          const int u = ks & 1;
          m.set_b(lane, 0, bf16_lo(w[2 * u]), bf16_hi(w[2 * u]));
          m.set_b(lane, 1, bf16_lo(w[2 * u + 1]), bf16_hi(w[2 * u + 1]));
        } else {  // word ks of the lane's chunk at byte t d/4
          const uint32_t x = word(kb, key, t * (D / 4) + 4 * ks);
          const auto a = fp8_pair(x & 0xFFFF), b = fp8_pair(x >> 16);
          m.set_b(lane, 0, a.first, a.second);
          m.set_b(lane, 1, b.first, b.second);
        }
      }
      m.run(s[j]);
    }
  }
  for (int r = 0; r < 16; ++r) {
    for (int key = 0; key < 16; ++key) {
      double want = 0, mag = 0;
      for (int c = 0; c < D; ++c) {
        want += q[r][c] * value(kb, key, c);
        mag += std::fabs(q[r][c] * value(kb, key, c));
      }
      ASSERT_NEAR(s[key / 8][r][key % 8], want, 1e-12 * mag + 1e-300)
          << "S row " << r << " key " << key;
    }
  }

  // P (here S itself, rescaled to O(1)) from the C fragments to the A fragment, O = P V.
  const double p_scale = kFp4 ? std::ldexp(1.0, 126) : 1.0;
  double o[D / 8][16][8] = {};
  for (int n = 0; n < D / 8; ++n) {
    Mma m{};
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      auto c = [&](int j, int e) { return p_scale * s[j][g + 8 * (e >> 1)][2 * t + (e & 1)]; };
      m.set_a(lane, 0, c(0, 0), c(0, 1));
      m.set_a(lane, 1, c(0, 2), c(0, 3));
      m.set_a(lane, 2, c(1, 0), c(1, 1));
      m.set_a(lane, 3, c(1, 2), c(1, 3));
      // The lane's keys v_key(t, 0..3), its channels from g d/8; n-tile n = local channel n.
      if (kFp4) {
        const int i = n / 8, half = (n / 4) & 1, qn = n & 3;
        uint32_t w0[4], w1[4];
        const int off = g * (D / 16) + 4 * i;
        e2m1x8_to_bf16(nvfp4_key_pair(word(vb, v_key(t, 0), off), word(vb, v_key(t, 1), off), half),
                       w0);
        e2m1x8_to_bf16(nvfp4_key_pair(word(vb, v_key(t, 2), off), word(vb, v_key(t, 3), off), half),
                       w1);
        m.set_b(lane, 0, bf16_lo(w0[qn]), bf16_hi(w0[qn]));
        m.set_b(lane, 1, bf16_lo(w1[qn]), bf16_hi(w1[qn]));
      } else {
        const int i = n / 4, half = (n / 2) & 1, xy = n & 1;
        const int off = g * (D / 8) + 4 * i;
        double v4[4];
        for (int k = 0; k < 4; ++k) {
          const auto pr = fp8_pair(word(vb, v_key(t, k), off) >> (16 * half));
          v4[k] = xy ? pr.second : pr.first;
        }
        m.set_b(lane, 0, v4[0], v4[1]);
        m.set_b(lane, 1, v4[2], v4[3]);
      }
    }
    m.run(o[n]);
  }
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < D; ++c) {
      double want = 0, mag = 0;
      for (int key = 0; key < 16; ++key) {
        const double p = p_scale * s[key / 8][r][key % 8];
        want += p * value(vb, key, c);
        mag += std::fabs(p * value(vb, key, c));
      }
      // Output column col of n-tile n is channel phys_o(n, col).
      const int col = c / (D / 8), n = c % (D / 8);
      ASSERT_EQ(phys_o<D>(n, col), c);
      ASSERT_NEAR(o[n][r][col], want, 1e-12 * mag + 1e-300) << "O row " << r << " channel " << c;
    }
  }
}

// movmatrix.sync.aligned.m8n8.trans.b16 over the warp: lane (g, t) holds row g, columns 2t (low
// half) and 2t + 1 of an 8x8 matrix; the result holds the transpose in the same layout.
void movmatrix_trans(const uint32_t (&in)[32], uint32_t (&out)[32]) {
  uint16_t m[8][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    m[g][2 * t] = static_cast<uint16_t>(in[lane] & 0xFFFF);
    m[g][2 * t + 1] = static_cast<uint16_t>(in[lane] >> 16);
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    out[lane] = uint32_t{m[2 * t][g]} | uint32_t{m[2 * t + 1][g]} << 16;
  }
}

uint32_t bf16_bits_of(double x) {  // exact BF16 values only (checked)
  const uint32_t u = float_bits(static_cast<float>(x));
  EXPECT_EQ(bits_float(u & 0xFFFF0000u), x);
  return u >> 16;
}

// The transposed form (<= 8 rows, decode.md 7.8): S^T = K Q^T (keys as M, rows as N) from the
// same words as the 16-row form through kt_a_frag / qt_b_kidx, P^T moved from the S^T
// accumulators to the B operand by movmatrix, O^T = V^T P^T through vt_a_frag / phys_ot. Rows
// beyond `rows` are zero queries (padding).
template <int D, bool kFp4>
void emulate_tile_t(uint32_t seed, int rows) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int row_bytes = kFp4 ? D / 2 : D;
  std::vector<uint8_t> kb(16 * row_bytes), vb(16 * row_bytes);
  for (auto& x : kb) x = static_cast<uint8_t>(rng());
  for (auto& x : vb) x = static_cast<uint8_t>(rng());
  if (!kFp4) {
    for (auto& x : kb) x = (x & 0x7F) == 0x7F ? 0 : x;
    for (auto& x : vb) x = (x & 0x7F) == 0x7F ? 0 : x;
  }
  auto value = [&](const std::vector<uint8_t>& m, int key, int c) -> double {
    if (kFp4) {
      const uint8_t byte = m[key * row_bytes + c / 2];
      return std::ldexp(e2m1_to_float((c & 1) ? byte >> 4 : byte & 0xF), -126);
    }
    return e4m3_to_float(m[key * row_bytes + c]);
  };
  double q[8][D] = {};
  for (int r = 0; r < rows; ++r) {
    for (auto& x : q[r]) x = normal(rng);
  }
  auto word = [&](const std::vector<uint8_t>& m, int key, int byte_off) {
    uint32_t w;
    std::memcpy(&w, m.data() + key * row_bytes + byte_off, 4);
    return w;
  };
  auto fp8_pair = [](uint32_t two) {
    return std::pair<double, double>(e4m3_to_float(two & 0xFF), e4m3_to_float((two >> 8) & 0xFF));
  };
  // The 16-row form's B registers of key slot j (key g + 8 j) at k-step ks: (lo, hi).
  auto k_regs = [&](int g, int t, int j, int ks, uint32_t* lo, uint32_t* hi) {
    const int key = g + 8 * j;
    if (kFp4) {
      uint32_t w[4];
      e2m1x8_to_bf16(word(kb, key, t * (D / 8) + 4 * (ks >> 1)), w);
      *lo = w[2 * (ks & 1)];
      *hi = w[2 * (ks & 1) + 1];
    } else {
      const uint32_t x = word(kb, key, t * (D / 4) + 4 * ks);
      const auto a = fp8_pair(x & 0xFFFF), b = fp8_pair(x >> 16);
      *lo = bf16_bits_of(a.first) | bf16_bits_of(a.second) << 16;
      *hi = bf16_bits_of(b.first) | bf16_bits_of(b.second) << 16;
    }
  };

  // S^T [16 keys][8 rows].
  double st[16][8] = {};
  for (int ks = 0; ks < D / 16; ++ks) {
    Mma m{};
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      uint32_t lo0, hi0, lo1, hi1, a[4];
      k_regs(g, t, 0, ks, &lo0, &hi0);
      k_regs(g, t, 1, ks, &lo1, &hi1);
      kt_a_frag(lo0, hi0, lo1, hi1, a);
      for (int reg = 0; reg < 4; ++reg) m.set_a(lane, reg, bf16_lo(a[reg]), bf16_hi(a[reg]));
      for (int reg = 0; reg < 2; ++reg) {
        const int kk = qt_b_kidx(t, reg);
        const int c0 = kFp4 ? phys_k_nvfp4<D>(ks, kk) : phys_k_fp8<D>(ks, kk);
        const int c1 = kFp4 ? phys_k_nvfp4<D>(ks, kk + 1) : phys_k_fp8<D>(ks, kk + 1);
        m.set_b(lane, reg, q[g][c0], q[g][c1]);
      }
    }
    double c[16][8] = {};
    m.run(c);
    for (int i = 0; i < 16; ++i) {
      for (int n = 0; n < 8; ++n) st[i][n] += c[i][n];
    }
  }
  for (int key = 0; key < 16; ++key) {
    for (int r = 0; r < 8; ++r) {
      double want = 0, mag = 0;
      for (int c = 0; c < D; ++c) {
        want += q[r][c] * value(kb, key, c);
        mag += std::fabs(q[r][c] * value(kb, key, c));
      }
      // Lane (g, t) element e holds key st_key(g, e), row st_row(t, e).
      bool found = false;
      for (int lane = 0; lane < 32 && !found; ++lane) {
        for (int e = 0; e < 4; ++e) {
          if (st_key(lane >> 2, e) == key && st_row(lane & 3, e) == r) {
            ASSERT_NEAR(st[(lane >> 2) + 8 * (e >> 1)][2 * (lane & 3) + (e & 1)], want,
                        1e-12 * mag + 1e-300)
                << "S^T key " << key << " row " << r;
            found = true;
          }
        }
      }
      ASSERT_TRUE(found);
    }
  }

  // P = S scaled to O(1) and rounded to BF16 (what the kernel's pack does), from the C fragments
  // (C layout: element e of lane (g, t) at M row g + 8 (e >> 1), column 2t + (e & 1)) through
  // movmatrix into the B fragment of O^T = V^T P^T.
  const double p_scale = kFp4 ? std::ldexp(1.0, 126) : 1.0;
  auto p_of = [&](int key, int r) { return round_bf16(p_scale * st[key][r] / 64.0); };
  uint32_t lo_in[32], hi_in[32], b0[32], b1[32];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    double c[4];
    for (int e = 0; e < 4; ++e) c[e] = p_of(g + 8 * (e >> 1), 2 * t + (e & 1));
    lo_in[lane] = bf16_bits_of(c[0]) | bf16_bits_of(c[1]) << 16;
    hi_in[lane] = bf16_bits_of(c[2]) | bf16_bits_of(c[3]) << 16;
  }
  movmatrix_trans(lo_in, b0);
  movmatrix_trans(hi_in, b1);
  double o[D / 16][16][8] = {};
  for (int i = 0; i < D / 16; ++i) {
    Mma m{};
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      m.set_b(lane, 0, bf16_lo(b0[lane]), bf16_hi(b0[lane]));
      m.set_b(lane, 1, bf16_lo(b1[lane]), bf16_hi(b1[lane]));
      // The 16-row form's B registers of n-tiles 2i and 2i + 1, as the kernel builds them.
      uint32_t lo[2], hi[2];
      for (int u = 0; u < 2; ++u) {
        const int n = 2 * i + u;
        if (kFp4) {
          const int wi = n / 8, half = (n / 4) & 1, qn = n & 3;
          uint32_t w0[4], w1[4];
          const int off = g * (D / 16) + 4 * wi;
          e2m1x8_to_bf16(
              nvfp4_key_pair(word(vb, v_key(t, 0), off), word(vb, v_key(t, 1), off), half), w0);
          e2m1x8_to_bf16(
              nvfp4_key_pair(word(vb, v_key(t, 2), off), word(vb, v_key(t, 3), off), half), w1);
          lo[u] = w0[qn];
          hi[u] = w1[qn];
        } else {
          const int wi = n / 4, half = (n / 2) & 1, xy = n & 1;
          const int off = g * (D / 8) + 4 * wi;
          double v4[4];
          for (int k = 0; k < 4; ++k) {
            const auto pr = fp8_pair(word(vb, v_key(t, k), off) >> (16 * half));
            v4[k] = xy ? pr.second : pr.first;
          }
          lo[u] = bf16_bits_of(v4[0]) | bf16_bits_of(v4[1]) << 16;
          hi[u] = bf16_bits_of(v4[2]) | bf16_bits_of(v4[3]) << 16;
        }
      }
      uint32_t a[4];
      vt_a_frag(lo[0], hi[0], lo[1], hi[1], a);
      for (int reg = 0; reg < 4; ++reg) m.set_a(lane, reg, bf16_lo(a[reg]), bf16_hi(a[reg]));
    }
    m.run(o[i]);
  }
  for (int r = 0; r < 8; ++r) {
    for (int c = 0; c < D; ++c) {
      double want = 0, mag = 0;
      for (int key = 0; key < 16; ++key) {
        want += p_of(key, r) * value(vb, key, c);
        mag += std::fabs(p_of(key, r) * value(vb, key, c));
      }
      // Channel c is M index m of M-tile i with phys_ot(i, m) == c; lane (g, t) element e holds
      // m = g + 8 (e >> 1), row ot_row(t, e).
      int hits = 0;
      for (int i = 0; i < D / 16; ++i) {
        for (int lane = 0; lane < 32; ++lane) {
          for (int e = 0; e < 4; ++e) {
            const int mi = (lane >> 2) + 8 * (e >> 1);
            if (phys_ot<D>(i, mi) != c || ot_row(lane & 3, e) != r) continue;
            ASSERT_EQ(ot_row(lane & 3, e), 2 * (lane & 3) + (e & 1));
            ASSERT_NEAR(o[i][mi][ot_row(lane & 3, e)], want, 1e-12 * mag + 1e-300)
                << "O^T row " << r << " channel " << c;
            ++hits;
          }
        }
      }
      ASSERT_EQ(hits, 1) << "channel " << c << " row " << r;
    }
  }
}

TEST(DecodeBits, TransposedMapsArePermutations) {
  for (int d : {64, 128}) {
    std::vector<int> seen(d, 0);
    for (int i = 0; i < d / 16; ++i) {
      for (int m = 0; m < 16; ++m) ++seen[d == 64 ? phys_ot<64>(i, m) : phys_ot<128>(i, m)];
    }
    for (int c = 0; c < d; ++c) ASSERT_EQ(seen[c], 1);
  }
  // S^T / O^T accumulators: every (key or M index, row) once over the warp.
  int cover[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 4; ++e) ++cover[st_key(lane >> 2, e)][st_row(lane & 3, e)];
  }
  for (auto& k : cover) {
    for (int x : k) ASSERT_EQ(x, 1);
  }
}

TEST(DecodeBits, FragmentEmulationTransposed) {
  for (int rows : {1, 4, 8}) {
    emulate_tile_t<64, true>(10 + rows, rows);
    emulate_tile_t<128, true>(20 + rows, rows);
    emulate_tile_t<64, false>(30 + rows, rows);
    emulate_tile_t<128, false>(40 + rows, rows);
  }
}

TEST(DecodeBits, FragmentEmulationNvfp4) {
  emulate_tile<64, true>(1);
  emulate_tile<128, true>(2);
}

TEST(DecodeBits, FragmentEmulationFp8) {
  emulate_tile<64, false>(3);
  emulate_tile<128, false>(4);
}

}  // namespace

namespace {

// The NVFP4 ring (decode_bits.h, decode.md 7.10): every lane's copies of a tile into a stage,
// then every lane's reads from it, must give each lane the bytes the register path loads from the
// cache rows (K chunk t of keys g, g + 8; V bytes [g d/16, ...) of keys v_key(t, j); the scale
// bytes of the lane's blocks), the copies must not overlap or leave the stage, and the V reads of
// one instruction (LDS, one key slot j across the warp) must be free of bank conflicts beyond the
// minimum wavefronts.
template <int D>
void ring_round_trip() {
  using L = RingLayout<D>;
  constexpr int kRow = D / 2, kSc = D / 16;
  std::mt19937 rng(D);
  // Source rows of the tile's 16 keys: [key][bytes], K and V, data and scales.
  std::vector<uint8_t> kd(16 * kRow), vd(16 * kRow), ks(16 * kSc), vs(16 * kSc);
  for (auto* v : {&kd, &vd, &ks, &vs}) {
    for (auto& x : *v) x = static_cast<uint8_t>(rng());
  }
  std::vector<int> owner(L::kStage, -1);
  std::vector<uint8_t> stage(L::kStage, 0);
  auto put = [&](int dst, const uint8_t* src, int n, int lane) {
    ASSERT_GE(dst, 0);
    ASSERT_LE(dst + n, L::kStage);
    ASSERT_EQ(dst % n, 0) << "cp.async destination alignment";
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(owner[dst + i], -1) << "stage byte " << dst + i << " copied twice";
      owner[dst + i] = lane;
      stage[dst + i] = src[i];
    }
  };
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int j = 0; j < 2; ++j) {
      const int key = g + 8 * j;
      put(ring_data_dst<D>(false, g, t, j), &kd[key * kRow + t * (D / 8)], D / 8, lane);
      put(ring_data_dst<D>(true, g, t, j), &vd[key * kRow + t * (D / 8)], D / 8, lane);
    }
    const int key = lane & 15;
    put(ring_scale_dst<D>(lane), lane >= 16 ? &vs[key * kSc] : &ks[key * kSc], kSc, lane);
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int j = 0; j < 2; ++j) {
      const int key = g + 8 * j;
      for (int i = 0; i < D / 8; ++i) {
        ASSERT_EQ(stage[ring_k_src<D>(g, t, j) + i], kd[key * kRow + t * (D / 8) + i])
            << "K lane " << lane << " slot " << j;
      }
      for (int i = 0; i < (D == 128 ? 2 : 1); ++i) {
        ASSERT_EQ(stage[ring_ks_src<D>(g, t, j) + i], ks[key * kSc + (D == 128 ? 2 * t : t) + i])
            << "K scale lane " << lane << " slot " << j;
      }
    }
    for (int j = 0; j < 4; ++j) {
      const int key = v_key(t, j);
      for (int i = 0; i < D / 16; ++i) {
        ASSERT_EQ(stage[ring_v_src<D>(g, t, j) + i], vd[key * kRow + g * (D / 16) + i])
            << "V lane " << lane << " key slot " << j;
      }
      ASSERT_EQ(stage[ring_vs_src<D>(g, t, j)], vs[key * kSc + (D == 128 ? g : g / 2)])
          << "V scale lane " << lane << " key slot " << j;
    }
  }
  // V reads: 32 lanes x d/16 bytes per instruction; 32 banks of 4 bytes. Wavefronts = the most
  // distinct 4-byte words any one bank serves; the minimum is bytes / 128.
  for (int j = 0; j < 4; ++j) {
    std::vector<std::vector<int>> words(32);
    for (int lane = 0; lane < 32; ++lane) {
      for (int i = 0; i < D / 16; i += 4) {
        const int w = (ring_v_src<D>(lane >> 2, lane & 3, j) + i) / 4;
        auto& b = words[w % 32];
        if (std::find(b.begin(), b.end(), w) == b.end()) b.push_back(w);
      }
    }
    size_t worst = 0;
    for (const auto& b : words) worst = std::max(worst, b.size());
    EXPECT_EQ(worst, static_cast<size_t>(32 * (D / 16) / 128)) << "V read slot " << j;
  }
}

}  // namespace

TEST(DecodeBits, RingCopiesAndReadsGiveTheRegisterPathsBytes) {
  ring_round_trip<64>();
  ring_round_trip<128>();
}

}  // namespace fp4attn::paged
