// Prints fp4attn's codec results for a deterministic set of inputs, for the ml_dtypes cross-check
// (tests/python/test_ml_dtypes.py). Every line is whitespace-separated hex:
//   dec <format> <code> <float bits>                       decoders, every code
//   enc <x bits> <e2m1> <e4m3> <e5m2> <ue8m0 floor> <ue8m0 ceil>
//   nv <rule> <s_enc bits> <scale> <n> <x bits>... <code>...   NVFP4 blocks (nearest, round-up)
//   mx <rule> <scale> <n> <x bits>... <code>...                MXFP4 blocks (both rules)
// The inputs are built with integer arithmetic from a fixed seed, so they are the same everywhere.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"

namespace fp4attn {
namespace {

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A float with a random sign and mantissa and a biased exponent in [lo, hi].
float random_float(uint64_t* state, int lo, int hi) {
  const uint64_t r = splitmix64(state);
  const uint32_t exp = static_cast<uint32_t>(lo + static_cast<int>(r % (hi - lo + 1)));
  const uint32_t bits = (static_cast<uint32_t>(r >> 32) & 0x807FFFFFu) | (exp << 23);
  return bits_float(bits);
}

// Every value of the format, the midpoints between neighbours, one ulp around both, both signs.
void add_code_neighbourhoods(float (*decode)(uint8_t), int codes, std::vector<float>* out) {
  std::vector<float> values;
  for (int c = 0; c < codes; ++c) {
    const float v = decode(static_cast<uint8_t>(c));
    if (std::isfinite(v)) values.push_back(v);
  }
  for (size_t i = 0; i < values.size(); ++i) {
    std::vector<float> around = {values[i]};
    if (i + 1 < values.size()) around.push_back((values[i] + values[i + 1]) / 2);
    for (float v : std::vector<float>(around)) {
      around.push_back(std::nextafter(v, INFINITY));
      around.push_back(std::nextafter(v, 0.f));
    }
    for (float v : around) {
      out->push_back(v);
      out->push_back(-v);
    }
  }
}

std::vector<float> encoder_inputs() {
  std::vector<float> in;
  add_code_neighbourhoods(e2m1_to_float, 8, &in);
  add_code_neighbourhoods(e4m3_to_float, 128, &in);
  add_code_neighbourhoods(e5m2_to_float, 128, &in);
  for (int k = -149; k <= 127; ++k) {  // powers of two and their neighbours (UE8M0)
    const float p = std::ldexp(1.f, k);
    for (float v : {p, std::nextafter(p, INFINITY), std::nextafter(p, 0.f), 1.5f * p}) {
      in.push_back(v);
    }
  }
  const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                               0xFFC00000u, 0x7F800001u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x00000001u,
                               0x80000001u, 0x00800000u, 0x007FFFFFu};
  for (uint32_t s : specials) in.push_back(bits_float(s));
  for (float v : {464.f, 480.f, 1e4f, 61440.f, 65536.f, 1e6f, 7.f, 100.f}) {
    in.push_back(v);
    in.push_back(-v);
  }
  uint64_t state = 20261129;
  for (int i = 0; i < 100000; ++i)
    in.push_back(bits_float(static_cast<uint32_t>(splitmix64(&state))));
  for (int i = 0; i < 200000; ++i) in.push_back(random_float(&state, 127 - 20, 127 + 18));
  for (int i = 0; i < 20000; ++i) in.push_back(random_float(&state, 0, 0));  // float subnormals
  return in;
}

void print_decoders() {
  for (int c = 0; c < 16; ++c) std::printf("dec e2m1 %x %x\n", c, float_bits(e2m1_to_float(c)));
  for (int c = 0; c < 256; ++c) {
    const uint8_t b = static_cast<uint8_t>(c);
    std::printf("dec e4m3 %x %x\n", c, float_bits(e4m3_to_float(b)));
    std::printf("dec e5m2 %x %x\n", c, float_bits(e5m2_to_float(b)));
    std::printf("dec e8m0 %x %x\n", c, float_bits(ue8m0_to_float(b)));
  }
}

void print_encoders() {
  for (float x : encoder_inputs()) {
    std::printf("enc %x %x %x %x %x %x\n", float_bits(x), float_to_e2m1(x), float_to_e4m3(x),
                float_to_e5m2(x), float_to_ue8m0(x, Ue8m0Round::kFloor),
                float_to_ue8m0(x, Ue8m0Round::kCeil));
  }
}

void print_block(const char* head, const float* x, int n, const uint8_t* codes) {
  std::printf("%s %x", head, n);
  for (int i = 0; i < n; ++i) std::printf(" %x", float_bits(x[i]));
  for (int i = 0; i < n; ++i) std::printf(" %x", codes[i]);
  std::printf("\n");
}

// Blocks whose values are random floats of a random magnitude; s_enc is 1 or the tensor scale of
// an amax at least the block's (so the E4M3 scale stays in range, where ml_dtypes agrees).
void print_blocks() {
  uint64_t state = 42;
  char head[64];
  for (int b = 0; b < 4000; ++b) {
    const int n = 1 + static_cast<int>(splitmix64(&state) % kMxfp4Block);
    const int center = 127 - 60 + static_cast<int>(splitmix64(&state) % 120);
    float x[kMxfp4Block];
    for (int i = 0; i < n; ++i) x[i] = random_float(&state, center - 3, center);
    uint8_t codes[kMxfp4Block];
    for (MxScaleRule r : {MxScaleRule::kOcpFloor, MxScaleRule::kRoundUp}) {
      const uint8_t scale = mxfp4_quantize_block(x, n, r, codes);
      std::snprintf(head, sizeof(head), "mx %d %x", static_cast<int>(r), scale);
      print_block(head, x, n, codes);
    }
    const int m = n < kNvfp4Block ? n : kNvfp4Block;
    const float amax = block_amax(x, m);
    for (Nvfp4ScaleRule r : {Nvfp4ScaleRule::kNearest, Nvfp4ScaleRule::kRoundUp}) {
      const float s_enc = b % 2 ? 1.f : nvfp4_tensor_scale(amax * (1 + b % 5), r);
      if (s_enc == 1.f && amax / 6.f > 448.f) continue;
      const uint8_t scale = nvfp4_quantize_block(x, m, s_enc, r, codes);
      std::snprintf(head, sizeof(head), "nv %d %x %x", static_cast<int>(r), float_bits(s_enc),
                    scale);
      print_block(head, x, m, codes);
    }
  }
}

}  // namespace
}  // namespace fp4attn

int main() {
  fp4attn::print_decoders();
  fp4attn::print_encoders();
  fp4attn::print_blocks();
  return 0;
}
