// Host block drivers for the quantizers: visit each block once for its amax, derive its scale with
// the shared rule, then encode its elements with that scale.
#include <algorithm>
#include <string>

#include "mok/error.hpp"
#include "mok/formats.hpp"

namespace mok {
namespace {

void check_shape(const char* format, int64_t rows, int64_t cols, BlockShape block,
                 std::initializer_list<BlockShape> allowed) {
  if (rows < 0 || cols < 0) {
    throw Error(ErrorCode::invalid_argument, std::string(format) + ": negative shape [" +
                                                 std::to_string(rows) + ", " +
                                                 std::to_string(cols) + "]");
  }
  std::string names;
  for (const BlockShape& b : allowed) {
    if (b == block) return;
    names += (names.empty() ? "" : ", ") + std::to_string(b.rows) + "x" + std::to_string(b.cols);
  }
  throw Error(ErrorCode::invalid_argument,
              std::string(format) + ": block " + std::to_string(block.rows) + "x" +
                  std::to_string(block.cols) + " is not allowed (allowed: " + names + ")");
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Calls f(block_row, block_col, r0, r1, c0, c1) for every block.
template <class F>
void for_each_block(int64_t rows, int64_t cols, BlockShape b, F&& f) {
  for (int64_t br = 0; br < ceil_div(rows, b.rows); ++br) {
    for (int64_t bc = 0; bc < ceil_div(cols, b.cols); ++bc) {
      const int64_t r0 = br * b.rows, c0 = bc * b.cols;
      f(br, bc, r0, std::min(rows, r0 + b.rows), c0, std::min(cols, c0 + b.cols));
    }
  }
}

fmt::BlockAmax block_amax(const float* x, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
                          int64_t c1) {
  fmt::BlockAmax a;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) a.add(x[r * cols + c]);
  return a;
}

}  // namespace

Mxfp8Tensor quantize_mxfp8(const float* x, int64_t rows, int64_t cols, BlockShape block,
                           MxScaleRule rule) {
  check_shape("MXFP8", rows, cols, block, {{1, 32}, {32, 1}});
  Mxfp8Tensor t{
      rows, cols, block, std::vector<uint8_t>(size_t(rows * cols)),
      std::vector<uint8_t>(size_t(ceil_div(rows, block.rows) * ceil_div(cols, block.cols)))};
  const int64_t scale_cols = ceil_div(cols, block.cols);
  for_each_block(rows, cols, block,
                 [&](int64_t br, int64_t bc, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
                   const fmt::BlockAmax a = block_amax(x, cols, r0, r1, c0, c1);
                   const uint8_t s = rule == MxScaleRule::rceil ? fmt::mx_scale_rceil(a.amax)
                                                                : fmt::mx_scale_floor(a.amax);
                   t.scales[size_t(br * scale_cols + bc)] = fmt::mx_stored_scale(a, s);
                   for (int64_t r = r0; r < r1; ++r)
                     for (int64_t c = c0; c < c1; ++c)
                       t.data[size_t(r * cols + c)] = fmt::mx_element_in_block(x[r * cols + c], s);
                 });
  return t;
}

Nvfp4Tensor quantize_nvfp4(const float* x, int64_t rows, int64_t cols, BlockShape block) {
  check_shape("NVFP4", rows, cols, block, {{1, 16}, {16, 16}});
  if (cols % 2 != 0) {
    throw Error(ErrorCode::invalid_argument,
                "NVFP4: the column count must be even (two elements per byte), got " +
                    std::to_string(cols));
  }
  Nvfp4Tensor t;
  t.rows = rows;
  t.cols = cols;
  t.block = block;
  t.data.assign(size_t(rows * cols / 2), 0);
  t.scales.assign(size_t(ceil_div(rows, block.rows) * ceil_div(cols, block.cols)), 0);
  t.global_amax = block_amax(x, cols, 0, rows, 0, cols).amax;
  const fmt::Nvfp4Global g = fmt::nvfp4_global(t.global_amax);
  t.s_dec = g.s_dec;
  const int64_t scale_cols = ceil_div(cols, block.cols);
  for_each_block(rows, cols, block,
                 [&](int64_t br, int64_t bc, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
                   const fmt::BlockAmax a = block_amax(x, cols, r0, r1, c0, c1);
                   const uint8_t s = fmt::nvfp4_block_scale(a.amax, g);
                   const float enc = fmt::nvfp4_block_encode_factor(s, g);
                   t.scales[size_t(br * scale_cols + bc)] = fmt::nvfp4_stored_scale(a, s);
                   for (int64_t r = r0; r < r1; ++r) {
                     for (int64_t c = c0; c < c1; ++c) {
                       const uint8_t q = fmt::nvfp4_element(x[r * cols + c], enc);
                       uint8_t& byte = t.data[size_t((r * cols + c) / 2)];
                       byte =
                           uint8_t(c % 2 == 0 ? ((byte & 0xF0) | q) : ((byte & 0x0F) | (q << 4)));
                     }
                   }
                 });
  return t;
}

Fp8BlockTensor quantize_fp8_block(const float* x, int64_t rows, int64_t cols, BlockShape block,
                                  bool ue8m0) {
  check_shape("FP8 block", rows, cols, block, {{1, 128}, {128, 1}, {128, 128}});
  Fp8BlockTensor t{
      rows,
      cols,
      block,
      ue8m0,
      std::vector<uint8_t>(size_t(rows * cols)),
      std::vector<float>(size_t(ceil_div(rows, block.rows) * ceil_div(cols, block.cols)))};
  const int64_t scale_cols = ceil_div(cols, block.cols);
  for_each_block(rows, cols, block,
                 [&](int64_t br, int64_t bc, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
                   const fmt::BlockAmax a = block_amax(x, cols, r0, r1, c0, c1);
                   const fmt::Fp8BlockScale s = fmt::fp8_block_scale(a.amax, ue8m0);
                   t.scales[size_t(br * scale_cols + bc)] = fmt::fp8_block_stored_scale(a, s);
                   for (int64_t r = r0; r < r1; ++r)
                     for (int64_t c = c0; c < c1; ++c)
                       t.data[size_t(r * cols + c)] = fmt::fp8_block_element(x[r * cols + c], s);
                 });
  return t;
}

namespace {
// Before any element is read: the block is one the format allows, and data and scales hold
// exactly the tensor's codes and its blocks' scales.
template <class Tensor>
void check_stored(const char* format, const Tensor& t, int64_t data_bytes,
                  std::initializer_list<BlockShape> allowed) {
  check_shape(format, t.rows, t.cols, t.block, allowed);
  const int64_t scales = ceil_div(t.rows, t.block.rows) * ceil_div(t.cols, t.block.cols);
  auto fail = [&](const char* what, int64_t want, size_t got) {
    std::string m(format);  // appended piece by piece: GCC 12 misjudges chains of operator+
    m.append(": a [").append(std::to_string(t.rows)).append(", ").append(std::to_string(t.cols));
    m.append("] tensor in ").append(std::to_string(t.block.rows)).append("x");
    m.append(std::to_string(t.block.cols)).append(" blocks has ").append(std::to_string(want));
    m.append(" ").append(what).append("; the tensor holds ").append(std::to_string(got));
    throw Error(ErrorCode::invalid_argument, m);
  };
  if (int64_t(t.data.size()) != data_bytes) fail("code bytes (data)", data_bytes, t.data.size());
  if (int64_t(t.scales.size()) != scales) fail("scales", scales, t.scales.size());
}

// out[r, c] = decode(element index r*cols + c, its block's scale).
template <class Tensor, class Decode>
std::vector<float> dequantize_blocks(const Tensor& t, Decode decode) {
  std::vector<float> out(size_t(t.rows * t.cols));
  const int64_t scale_cols = ceil_div(t.cols, t.block.cols);
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < t.cols; ++c)
      out[size_t(r * t.cols + c)] = decode(
          r * t.cols + c, t.scales[size_t((r / t.block.rows) * scale_cols + c / t.block.cols)]);
  return out;
}
}  // namespace

std::vector<float> dequantize(const Mxfp8Tensor& t) {
  check_stored("MXFP8", t, t.rows * t.cols, {{1, 32}, {32, 1}});
  return dequantize_blocks(t, [&](int64_t i, uint8_t s) {
    return fmt::e4m3_to_float(t.data[size_t(i)]) * fmt::e8m0_to_float(s);
  });
}

std::vector<float> dequantize(const Nvfp4Tensor& t) {
  if (t.cols % 2 != 0)
    throw Error(ErrorCode::invalid_argument,
                "NVFP4: cols = " + std::to_string(t.cols) + " must be even (two codes per byte)");
  check_stored("NVFP4", t, t.rows * t.cols / 2, {{1, 16}, {16, 16}});
  return dequantize_blocks(t, [&](int64_t i, uint8_t s) {
    const uint8_t byte = t.data[size_t(i / 2)];  // cols is even: element i is in byte i / 2
    return fmt::nvfp4_decode(uint8_t(i % 2 == 0 ? byte & 0xF : byte >> 4), s, t.s_dec);
  });
}

std::vector<float> dequantize(const Fp8BlockTensor& t) {
  check_stored("FP8 block", t, t.rows * t.cols, {{1, 128}, {128, 1}, {128, 128}});
  return dequantize_blocks(
      t, [&](int64_t i, float s) { return fmt::e4m3_to_float(t.data[size_t(i)]) * s; });
}

void encode_e4m3(const float* x, uint8_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = fmt::e4m3_from_float(x[i]);
}
void encode_e5m2(const float* x, uint8_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = fmt::e5m2_from_float(x[i]);
}
void encode_e2m1(const float* x, uint8_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = fmt::e2m1_from_float(x[i]);
}
void encode_bf16(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = fmt::bf16_from_float(x[i]);
}

}  // namespace mok
