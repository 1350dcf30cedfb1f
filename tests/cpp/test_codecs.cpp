// Element codecs against the definitions of formats.md, checked with std::ldexp and midpoints
// (an implementation independent of the bit procedures). ml_dtypes checks are in tests/python.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "mok/formats/codecs.hpp"
#include "mok/formats/mxfp8_widen.hpp"
#include "mok/formats/nvfp4_widen.hpp"

using namespace mok::fmt;

namespace {

// Value of a sign/exponent/mantissa code from its fields.
double field_value(unsigned code, int ebits, int mbits, int bias) {
  const unsigned mag = code & ((1u << (ebits + mbits)) - 1u);
  const int e = int(mag >> mbits);
  const unsigned m = mag & ((1u << mbits) - 1u);
  const double v = e == 0 ? std::ldexp(double(m), 1 - bias - mbits)
                          : std::ldexp(double((1u << mbits) | m), e - bias - mbits);
  return (code >> (ebits + mbits)) & 1u ? -v : v;
}

// For consecutive positive codes c and c+1: the midpoint rounds to the even code, points just
// beside it to the nearer one.
template <class Encode>
void check_midpoints(Encode encode, double lo, double hi, uint8_t c) {
  const float mid = float((lo + hi) / 2);
  ASSERT_EQ(double(mid), (lo + hi) / 2) << "midpoint must be exact in FP32";
  EXPECT_EQ(encode(mid), (c & 1) ? c + 1 : c) << "midpoint " << mid;
  EXPECT_EQ(encode(std::nextafter(mid, 0.0f)), c) << "below " << mid;
  EXPECT_EQ(encode(std::nextafter(mid, INFINITY)), c + 1) << "above " << mid;
}

}  // namespace

TEST(E4M3, EveryCodePointDecodesAndRoundTrips) {
  for (unsigned c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(uint8_t(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(double(v), field_value(c, 4, 3, 7)) << c;
    EXPECT_EQ(e4m3_from_float(v), c) << c;  // -0.0 included: 0x80
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
}

TEST(E4M3, RoundsToNearestEvenBetweenEveryPairOfCodes) {
  for (uint8_t c = 0; c < 0x7E; ++c)
    check_midpoints(e4m3_from_float, e4m3_to_float(c), e4m3_to_float(uint8_t(c + 1)), c);
}

TEST(E4M3, SaturatesAndKeepsNaN) {
  EXPECT_EQ(e4m3_from_float(448.0f), 0x7E);
  EXPECT_EQ(e4m3_from_float(464.0f), 0x7E);  // the midpoint to the (absent) next code
  EXPECT_EQ(e4m3_from_float(1e30f), 0x7E);
  EXPECT_EQ(e4m3_from_float(INFINITY), 0x7E);
  EXPECT_EQ(e4m3_from_float(-INFINITY), 0xFE);
  EXPECT_EQ(e4m3_from_float(-500.0f), 0xFE);
  EXPECT_EQ(e4m3_from_float(NAN), 0x7F);
  EXPECT_EQ(e4m3_from_float(-NAN), 0x7F);
  EXPECT_EQ(e4m3_from_float(-0.0f), 0x80);
  EXPECT_EQ(e4m3_from_float(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: even
  EXPECT_EQ(e4m3_from_float(std::ldexp(1.0f, -10) * 1.001f), 0x01);
  EXPECT_EQ(e4m3_from_float(std::numeric_limits<float>::denorm_min()), 0x00);
}

TEST(E5M2, EveryCodePointDecodesAndRoundTrips) {
  for (unsigned c = 0; c < 256; ++c) {
    const float v = e5m2_to_float(uint8_t(c));
    const unsigned mag = c & 0x7F;
    if (mag > 0x7C) {
      EXPECT_TRUE(std::isnan(v)) << c;
    } else if (mag == 0x7C) {
      EXPECT_TRUE(std::isinf(v)) << c;
      EXPECT_EQ(e5m2_from_float(v), c);
    } else {
      EXPECT_EQ(double(v), field_value(c, 5, 2, 15)) << c;
      EXPECT_EQ(e5m2_from_float(v), c) << c;
    }
  }
}

TEST(E5M2, RoundsToNearestEvenAndSaturatesFiniteValues) {
  for (uint8_t c = 0; c < 0x7B; ++c)
    check_midpoints(e5m2_from_float, e5m2_to_float(c), e5m2_to_float(uint8_t(c + 1)), c);
  EXPECT_EQ(e5m2_from_float(57344.0f), 0x7B);
  EXPECT_EQ(e5m2_from_float(1e9f), 0x7B);
  EXPECT_EQ(e5m2_from_float(-1e9f), 0xFB);
  EXPECT_EQ(e5m2_from_float(INFINITY), 0x7C);
  EXPECT_EQ(e5m2_from_float(-INFINITY), 0xFC);
  EXPECT_EQ(e5m2_from_float(NAN), 0x7F);
}

TEST(E2M1, EveryCodePointAndTheThresholdTable) {
  const float values[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (unsigned c = 0; c < 16; ++c) {
    const float v = e2m1_to_float(uint8_t(c));
    EXPECT_EQ(std::fabs(v), values[c & 7]) << c;
    EXPECT_EQ(double(v), field_value(c, 2, 1, 1)) << c;
    EXPECT_EQ(e2m1_from_float(v), c) << c;
  }
  // formats.md: <=0.25 -> 0, <0.75 -> 0.5, <=1.25 -> 1, <1.75 -> 1.5, <=2.5 -> 2, <3.5 -> 3,
  // <=5 -> 4, else 6.
  struct Case {
    float x;
    uint8_t code;
  };
  const Case cases[] = {{0.25f, 0}, {0.2500001f, 1}, {0.7499999f, 1}, {0.75f, 2},
                        {1.25f, 2}, {1.2500001f, 3}, {1.7499999f, 3}, {1.75f, 4},
                        {2.5f, 4},  {2.5000002f, 5}, {3.4999998f, 5}, {3.5f, 6},
                        {5.0f, 6},  {5.0000005f, 7}, {100.0f, 7}};
  for (const Case& k : cases) {
    EXPECT_EQ(e2m1_from_float(k.x), k.code) << k.x;
    EXPECT_EQ(e2m1_from_float(-k.x), k.code | 8) << -k.x;
  }
  EXPECT_EQ(e2m1_from_float(-0.1f), 0x8);  // negative values rounding to zero keep the sign
  EXPECT_EQ(e2m1_from_float(NAN), 0x0);
  EXPECT_EQ(e2m1_from_float(INFINITY), 0x7);
  EXPECT_EQ(e2m1_from_float(-INFINITY), 0xF);
}

TEST(E8M0, EveryCodePoint) {
  for (unsigned c = 0; c < 255; ++c)
    EXPECT_EQ(e8m0_to_float(uint8_t(c)), std::ldexp(1.0f, int(c) - 127)) << c;
  EXPECT_GT(e8m0_to_float(0), 0.0f);  // 2^-127, an FP32 subnormal
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xFF)));
}

TEST(UE4M3, IsE4M3WithoutSign) {
  for (unsigned c = 0; c < 0x7F; ++c)
    EXPECT_EQ(ue4m3_to_float(uint8_t(c)), e4m3_to_float(uint8_t(c)));
  EXPECT_EQ(ue4m3_from_float(1000.0f), 0x7E);
  EXPECT_EQ(ue4m3_from_float(1.0f), 0x38);
}

TEST(BF16, EveryCodeRoundTripsAndMidpointsGoToEven) {
  for (unsigned c = 0; c < 65536; ++c) {
    const float v = bf16_to_float(uint16_t(c));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(bf16_from_float(v))));
      continue;
    }
    EXPECT_EQ(bf16_from_float(v), c) << c;
    if ((c & 0x7FFF) < 0x7F7F) {  // finite neighbour above
      const double lo = v, hi = bf16_to_float(uint16_t(c + 1));
      const float mid = float((lo + hi) / 2);
      EXPECT_EQ(bf16_from_float(mid), (c & 1) ? c + 1 : c) << c;
    }
  }
  EXPECT_EQ(bf16_from_float(3.4e38f), 0x7F80);  // RNE overflows to Inf, as ml_dtypes does
}

// The NVFP4 widening (nvfp4_widen.hpp) as the kernel computes it, in exact arithmetic: each pair's
// bits read as BF16 (value * 2^-126, subnormal for e = 0) times the block's factor S * 2^118 is
// E2M1 * UE4M3 * 2^-8 for every element code, position and scale code (field_value's
// definitions), NaN for a NaN scale; the product is exact, so BF16 rounding changes nothing, and
// the epilogue's kNvfp4WidenUnscale restores the value.
TEST(Nvfp4Widen, EveryCodeAndScaleWidensExactly) {
  const double unscale = std::ldexp(1.0, 8);
  ASSERT_EQ(double(kNvfp4WidenUnscale), unscale);
  for (unsigned scale = 0; scale < 256; ++scale) {
    const double factor = double(bf16_to_float(nvfp4_widen_factor(uint8_t(scale))));
    const double s = field_value(scale & 0x7Fu, 4, 3, 7);
    if ((scale & 0x7Fu) == 0x7Fu) {
      EXPECT_TRUE(std::isnan(factor)) << scale;
      continue;
    }
    ASSERT_EQ(factor, std::ldexp(s, 118)) << scale;
    for (unsigned code = 0; code < 16; ++code) {
      for (int k = 0; k < 8; ++k) {
        const uint32_t word = uint32_t(code) << (4 * nvfp4_packed_nibble(k));
        const uint32_t pair = nvfp4_widen_pair_bits(word, k / 2);
        const uint16_t lane = uint16_t(k % 2 ? pair >> 16 : pair & 0xFFFFu);
        const uint16_t other = uint16_t(k % 2 ? pair & 0xFFFFu : pair >> 16);
        ASSERT_EQ(other, 0u) << "element " << k << " leaked into its neighbour";
        const double widened = double(bf16_to_float(lane)) * factor;
        const double want = field_value(code, 2, 1, 1) * s / unscale;
        ASSERT_EQ(widened, want) << "code " << code << " element " << k << " scale " << scale;
        ASSERT_EQ(double(round_to_bf16(float(widened))), widened);  // exact in BF16
        ASSERT_EQ(std::signbit(widened), (code & 8u) != 0) << code;
      }
    }
  }
}

TEST(Nvfp4Widen, PackedNibblesAreAPermutationAndFactorsTileTheStage) {
  bool seen[8] = {};
  for (int k = 0; k < 8; ++k) seen[nvfp4_packed_nibble(k)] = true;
  for (bool b : seen) EXPECT_TRUE(b);
  // 256 rows: a stage's factors are 16 row blocks x 4, contiguous, the next k-block after them.
  EXPECT_EQ(nvfp4_widen_factor_offset(256, 0, 1, 0), 16 * 4 * 2);
  EXPECT_EQ(nvfp4_widen_factor_offset(256, 255, 0, 3), (15 * 4 + 3) * 2);
  EXPECT_EQ(nvfp4_widen_factor_offset(256, 17, 2, 1), ((2 * 16 + 1) * 4 + 1) * 2);
}

// The MXFP8 widening (mxfp8_widen.hpp) in exact arithmetic: each pair's bits read as BF16 (value *
// 2^-120, subnormal for E4M3's subnormals), times 2^120, times the block's factor 2^(scale - 127),
// is the E4M3 value times the scale for every finite code, byte position and scale whose product
// stays in BF16's normal range, where both products are exact; NaN for the NaN scale.
TEST(Mxfp8Widen, EveryFiniteCodeAndScaleWidensExactly) {
  const double pre = std::ldexp(1.0, 120);
  ASSERT_EQ(double(bf16_to_float(kMxfp8WidenPre)), pre);
  for (unsigned scale = 0; scale < 256; ++scale) {
    const double factor = double(bf16_to_float(mxfp8_widen_factor(uint8_t(scale))));
    if (scale == 255) {
      EXPECT_TRUE(std::isnan(factor));
      continue;
    }
    ASSERT_EQ(factor, std::ldexp(1.0, int(scale) - 127)) << scale;
    for (unsigned code = 0; code < 256; ++code) {
      if ((code & 0x7Fu) == 0x7Fu) continue;  // NaN: only in NaN-scale blocks
      for (int k = 0; k < 4; ++k) {
        const uint32_t word = mxfp8_packed_word(uint32_t(code) << (8 * k));
        const uint32_t pair = mxfp8_widen_pair_bits(word, k / 2);
        const uint16_t lane = uint16_t(k % 2 ? pair >> 16 : pair & 0xFFFFu);
        ASSERT_EQ(uint16_t(k % 2 ? pair & 0xFFFFu : pair >> 16), 0u) << "byte " << k << " leaked";
        ASSERT_EQ(mxfp8_widen_pair_bits(word, 1 - k / 2), 0u) << "byte " << k << " leaked";
        const double value = field_value(code, 4, 3, 7);
        ASSERT_EQ(double(bf16_to_float(lane)) * pre, value) << "code " << code;
        const double want = value * factor;
        const double a = std::fabs(want);
        if (a != 0 && (a < std::ldexp(1.0, -126) || a > 3.3895313892515355e38)) continue;
        const double widened =
            double(round_to_bf16(float(double(bf16_to_float(lane)) * pre))) * factor;
        ASSERT_EQ(double(round_to_bf16(float(widened))), want) << code << " " << scale;
        ASSERT_EQ(std::signbit(widened), (code & 0x80u) != 0) << code;
      }
    }
  }
  // The packing moves every bit once: a permutation of the word's 32 bits.
  uint32_t seen = 0;
  for (int bit = 0; bit < 32; ++bit) {
    const uint32_t moved = mxfp8_packed_word(1u << bit);
    ASSERT_EQ(moved & (moved - 1), 0u) << bit;
    seen |= moved;
  }
  EXPECT_EQ(seen, 0xFFFFFFFFu);
  EXPECT_EQ(mxfp8_widen_factor_offset(128, 0, 1, 0), 128 * 2 * 2);
  EXPECT_EQ(mxfp8_widen_factor_offset(128, 5, 0, 1), (5 * 2 + 1) * 2);
}
