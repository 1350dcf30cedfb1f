// The Python module: reference layer, routers, quantizers and codecs on NumPy arrays (DLPack
// through nanobind; no dependency on PyTorch's C++ ABI).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <utility>

#include "bindings.hpp"
#include "numpy_args.hpp"
#include "mok/build_info.hpp"
#include "mok/error.hpp"
#include "mok/formats.hpp"
#include "mok/layer.hpp"
#include "mok/router.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using mok_py::Arg;
using mok_py::In;
using mok_py::Out;
using mok_py::take;

// Hands a vector to NumPy without copying; the capsule frees it with the array.
template <class T>
Out<T> to_numpy(std::vector<T> v, std::vector<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return Out<T>(heap->data(), shape.size(), shape.data(), owner);
}

template <class T>
std::vector<T> to_vector(const In<T>& a) {
  return std::vector<T>(a.data(), a.data() + a.size());
}

std::pair<int64_t, int64_t> matrix_shape(const char* name, const In<float>& a) {
  if (a.ndim() != 2) {
    throw mok::Error(mok::ErrorCode::invalid_argument,
                     std::string(name) + " must be 2-D, got " + std::to_string(a.ndim()) + "-D");
  }
  return {int64_t(a.shape(0)), int64_t(a.shape(1))};
}

mok::BlockShape block_of(std::tuple<int, int> b) { return {std::get<0>(b), std::get<1>(b)}; }

// Throws naming the array unless its shape is exactly `want` (`dims` names the dimensions, e.g.
// "[E, I, H]"): a transposed matrix of the right element count is an error, not a wrong answer.
template <class T>
void require_shape(const std::string& name, const In<T>& a, const std::vector<int64_t>& want,
                   const char* dims) {
  std::vector<int64_t> got(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) got[i] = int64_t(a.shape(i));
  if (got != want)
    throw mok::Error(mok::ErrorCode::invalid_argument,
                     name + " must be " + dims + " = " + mok_py::shape_text(want) + "; got shape " +
                         mok_py::shape_text(got));
}

// The scale grid of a [rows, cols] tensor in blocks of b: [ceil(rows / br), ceil(cols / bc)].
std::vector<int64_t> scale_grid(int64_t rows, int64_t cols, mok::BlockShape b) {
  if (b.rows < 1 || b.cols < 1)
    throw mok::Error(
        mok::ErrorCode::invalid_argument,
        "block " + std::to_string(b.rows) + "x" + std::to_string(b.cols) + " must be positive");
  return {(rows + b.rows - 1) / b.rows, (cols + b.cols - 1) / b.cols};
}

// data must be 2-D [rows, stored cols]; returns (rows, stored cols).
std::pair<int64_t, int64_t> codes_shape(const In<uint8_t>& data) {
  if (data.ndim() != 2)
    throw mok::Error(mok::ErrorCode::invalid_argument,
                     "data must be 2-D, got " + std::to_string(data.ndim()) + "-D");
  return {int64_t(data.shape(0)), int64_t(data.shape(1))};
}

}  // namespace

std::string mok_py::shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

namespace {
using mok_py::config_from;

nb::dict config_to(const mok::Config& c) {
  nb::dict d;
  d["hidden"] = c.hidden;
  d["intermediate"] = c.intermediate;
  d["num_experts"] = c.num_experts;
  d["top_k"] = c.top_k;
  d["num_shared_experts"] = c.num_shared_experts;
  d["shared_intermediate"] = c.shared_intermediate;
  d["max_tokens_per_rank"] = c.max_tokens_per_rank;
  d["ep_size"] = c.ep_size;
  d["ep_rank"] = c.ep_rank;
  d["precision"] = std::string(mok::precision_name(c.precision));
  d["tile_rows"] = c.tile_rows;
  d["routed_capacity_rows"] = c.routed_capacity_rows;
  d["ring_rows"] = c.ring_rows;
  return d;
}

mok::OperandQuant quant_from(const std::string& s) {
  for (mok::OperandQuant q :
       {mok::OperandQuant::none, mok::OperandQuant::bf16, mok::OperandQuant::fp8_block,
        mok::OperandQuant::mxfp8, mok::OperandQuant::nvfp4, mok::OperandQuant::nvfp4_weights})
    if (s == mok::operand_quant_name(q)) return q;
  throw mok::Error(mok::ErrorCode::invalid_argument,
                   "quant '" + s +
                       "' is unknown (allowed: none, bf16, fp8_block, mxfp8, nvfp4, "
                       "nvfp4_weights)");
}

mok::MxScaleRule rule_from(const std::string& s) {
  if (s == "rceil") return mok::MxScaleRule::rceil;
  if (s == "floor") return mok::MxScaleRule::floor;
  throw mok::Error(mok::ErrorCode::invalid_argument,
                   "rule '" + s + "' is unknown (allowed: rceil, floor)");
}

nb::dict reference_layer(const nb::dict& config, const nb::dict& params, const Arg<double>& x_arg,
                         const Arg<int32_t>& ids_arg, const Arg<double>& weights_arg,
                         const std::optional<Arg<double>>& d_out_arg, const std::string& numerics,
                         const std::string& quant, const std::string& mx_scale_rule,
                         bool fp8_ue8m0) {
  const mok::Config c = config_from(config);
  const In<double> x = take(x_arg, "x");
  const In<int32_t> topk_ids = take(ids_arg, "topk_ids");
  const In<double> topk_weights = take(weights_arg, "topk_weights");
  std::optional<In<double>> d_out;
  if (d_out_arg) d_out = take(*d_out_arg, "d_out");
  mok::LayerParams p;
  const std::pair<const char*, std::vector<double>*> fields[] = {{"shared_gate", &p.shared_gate},
                                                                 {"shared_up", &p.shared_up},
                                                                 {"shared_down", &p.shared_down},
                                                                 {"gate", &p.gate},
                                                                 {"up", &p.up},
                                                                 {"down", &p.down}};
  const int64_t H = c.hidden, I = c.intermediate, S = c.shared_width(), L = c.experts_per_rank();
  const std::vector<int64_t> shapes[] = {{S, H}, {S, H}, {H, S}, {L, I, H}, {L, I, H}, {L, H, I}};
  const char* dims[] = {"[S, H]", "[S, H]", "[H, S]", "[E, I, H]", "[E, I, H]", "[E, H, I]"};
  for (auto [key, value] : params) {  // a misspelt name would otherwise go unread
    bool known = false;
    for (auto [name, dst] : fields)
      known = known || (nb::isinstance<nb::str>(key) && nb::cast<std::string>(key) == name);
    if (!known)
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       "params has an unknown key " + std::string(nb::repr(key).c_str()) +
                           " (allowed: shared_gate, shared_up, shared_down, gate, up, down)");
  }
  int i = 0;
  for (auto [name, dst] : fields) {
    if (!params.contains(name))
      throw mok::Error(mok::ErrorCode::invalid_argument,
                       std::string("params has no '") + name + "'");
    const std::string arg = std::string("params['") + name + "']";
    const In<double> a = take<double>(params[name], arg);
    require_shape(arg, a, shapes[i], dims[i]);
    *dst = to_vector(a);
    ++i;
  }
  mok::Batch b;
  if (x.ndim() != 2)
    throw mok::Error(mok::ErrorCode::invalid_argument,
                     "x must be [T, H]; got " + std::to_string(x.ndim()) + " dimensions");
  b.tokens = int64_t(x.shape(0));
  const int64_t T = b.tokens, K = c.top_k;
  require_shape("x", x, {T, H}, "[T, H]");
  require_shape("topk_ids", topk_ids, {T, K}, "[T, K]");
  require_shape("topk_weights", topk_weights, {T, K}, "[T, K]");
  if (d_out) require_shape("d_out", *d_out, {T, H}, "[T, H]");
  b.x = to_vector(x);
  b.topk_ids = to_vector(topk_ids);
  b.topk_weights = to_vector(topk_weights);
  mok::ReferenceOptions o;
  if (numerics != "fp32" && numerics != "fp64")
    throw mok::Error(mok::ErrorCode::invalid_argument, "numerics must be 'fp32' or 'fp64'");
  o.numerics = numerics == "fp64" ? mok::Numerics::fp64 : mok::Numerics::fp32;
  o.quant = quant_from(quant);
  o.mx_scale_rule = rule_from(mx_scale_rule);
  o.fp8_ue8m0 = fp8_ue8m0;

  nb::dict result;
  mok::ReferenceForward f = [&] {
    nb::gil_scoped_release release;
    return mok::reference_forward(c, p, b, o);
  }();
  if (d_out) {
    std::vector<double> g_out = to_vector(*d_out);
    mok::LayerGradients g = [&] {
      nb::gil_scoped_release release;
      return mok::reference_backward(f.context, g_out);
    }();
    const size_t t = size_t(T), h = size_t(H), k = size_t(K), sw = size_t(S), l = size_t(L),
                 in = size_t(I);
    result["d_x"] = to_numpy(std::move(g.d_x), {t, h});
    result["d_topk_weights"] = to_numpy(std::move(g.d_topk_weights), {t, k});
    result["d_shared_gate"] = to_numpy(std::move(g.d_params.shared_gate), {sw, h});
    result["d_shared_up"] = to_numpy(std::move(g.d_params.shared_up), {sw, h});
    result["d_shared_down"] = to_numpy(std::move(g.d_params.shared_down), {h, sw});
    result["d_gate"] = to_numpy(std::move(g.d_params.gate), {l, in, h});
    result["d_up"] = to_numpy(std::move(g.d_params.up), {l, in, h});
    result["d_down"] = to_numpy(std::move(g.d_params.down), {l, h, in});
  }
  result["out"] = to_numpy(std::move(f.out), {size_t(T), size_t(H)});
  return result;
}

template <class T>
std::vector<size_t> shape_of(const In<T>& a) {
  std::vector<size_t> s(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) s[i] = a.shape(i);
  return s;
}

// The codecs map element to element: the codes (values) have the input's shape.
template <class Encode>
Out<uint8_t> encode_bytes(const Arg<float>& arg, Encode encode) {
  const In<float> x = take(arg, "x");
  std::vector<uint8_t> out(x.size());
  encode(x.data(), out.data(), int64_t(x.size()));
  return to_numpy(std::move(out), shape_of(x));
}

template <class Decode>
Out<float> decode_bytes(const Arg<uint8_t>& arg, Decode decode) {
  const In<uint8_t> c = take(arg, "codes");
  std::vector<float> out(c.size());
  for (size_t i = 0; i < c.size(); ++i) out[i] = decode(c.data()[i]);
  return to_numpy(std::move(out), shape_of(c));
}

}  // namespace

NB_MODULE(_mok, m) {
  nb::exception<mok::Error>(m, "Error", PyExc_ValueError);
  mok_py::register_gpu_layer(m);

  m.def(
      "preset", [](const std::string& name) { return config_to(mok::preset(name)); }, "name"_a,
      "The configuration of a named preset of design.md, as a dict.");
  m.def("preset_names", &mok::preset_names);
  m.def(
      "config_check", [](const nb::dict& d) { config_from(d).validate(); }, "config"_a,
      "Raises mok.Error naming the field for a configuration the layer does not take (TypeError "
      "for a field of the wrong type).");
  m.def("build_info", [] {
    const mok::BuildInfo b = mok::build_info();
    nb::dict d;
    d["version"] = b.version;
    d["build_type"] = b.build_type;
    d["cuda"] = b.cuda_runtime;
    d["nccl"] = b.nccl_runtime;
    d["gpus"] = b.gpu_status;
    return d;
  });

  m.def("reference_layer", &reference_layer, "config"_a, "params"_a, "x"_a, "topk_ids"_a,
        "topk_weights"_a, "d_out"_a = nb::none(), "numerics"_a = "fp32", "quant"_a = "none",
        "mx_scale_rule"_a = "rceil", "fp8_ue8m0"_a = false,
        "The CPU reference layer (float64 arrays; topk_ids int32; another dtype is a TypeError). "
        "Returns {'out'} and, given d_out, the gradients d_x, d_topk_weights, "
        "d_shared_gate/up/down, d_gate/up/down.");

  m.def(
      "route_softmax_topk",
      [](const Arg<float>& logits_arg, int top_k, bool renormalize) {
        const In<float> logits = take(logits_arg, "logits");
        auto [T, E] = matrix_shape("logits", logits);
        mok::Routing r;
        {
          nb::gil_scoped_release release;
          r = mok::route_softmax_topk(logits.data(), T, int(E), top_k, renormalize);
        }
        return std::make_tuple(to_numpy(std::move(r.topk_ids), {size_t(T), size_t(top_k)}),
                               to_numpy(std::move(r.topk_weights), {size_t(T), size_t(top_k)}));
      },
      "logits"_a, "top_k"_a, "renormalize"_a = false);
  m.def(
      "route_deepseek_v3",
      [](const Arg<float>& logits_arg, const std::optional<Arg<float>>& bias_arg, int top_k,
         int num_groups, int topk_groups, bool normalize, float scaling_factor) {
        const In<float> logits = take(logits_arg, "logits");
        auto [T, E] = matrix_shape("logits", logits);
        std::optional<In<float>> bias;
        if (bias_arg) {
          bias = take(*bias_arg, "expert_bias");
          require_shape("expert_bias", *bias, {E}, "[E]");
        }
        mok::DeepSeekRouter cfg{top_k, num_groups, topk_groups, normalize, scaling_factor};
        mok::Routing r =
            mok::route_deepseek_v3(logits.data(), bias ? bias->data() : nullptr, T, int(E), cfg);
        return std::make_tuple(to_numpy(std::move(r.topk_ids), {size_t(T), size_t(top_k)}),
                               to_numpy(std::move(r.topk_weights), {size_t(T), size_t(top_k)}));
      },
      "logits"_a, "expert_bias"_a = nb::none(), "top_k"_a = 8, "num_groups"_a = 8,
      "topk_groups"_a = 4, "normalize"_a = true, "scaling_factor"_a = 2.5f);

  m.def(
      "encode_e4m3", [](const Arg<float>& x) { return encode_bytes(x, mok::encode_e4m3); }, "x"_a);
  m.def(
      "encode_e5m2", [](const Arg<float>& x) { return encode_bytes(x, mok::encode_e5m2); }, "x"_a);
  m.def(
      "encode_e2m1", [](const Arg<float>& x) { return encode_bytes(x, mok::encode_e2m1); }, "x"_a);
  m.def(
      "encode_bf16",
      [](const Arg<float>& arg) {
        const In<float> x = take(arg, "x");
        std::vector<uint16_t> out(x.size());
        mok::encode_bf16(x.data(), out.data(), int64_t(x.size()));
        return to_numpy(std::move(out), shape_of(x));
      },
      "x"_a);
  m.def(
      "decode_e4m3", [](const Arg<uint8_t>& c) { return decode_bytes(c, mok::fmt::e4m3_to_float); },
      "codes"_a);
  m.def(
      "decode_e5m2", [](const Arg<uint8_t>& c) { return decode_bytes(c, mok::fmt::e5m2_to_float); },
      "codes"_a);
  m.def(
      "decode_e2m1", [](const Arg<uint8_t>& c) { return decode_bytes(c, mok::fmt::e2m1_to_float); },
      "codes"_a);
  m.def(
      "decode_e8m0", [](const Arg<uint8_t>& c) { return decode_bytes(c, mok::fmt::e8m0_to_float); },
      "codes"_a);

  m.def(
      "quantize_mxfp8",
      [](const Arg<float>& x_arg, std::tuple<int, int> block, const std::string& rule) {
        const In<float> x = take(x_arg, "x");
        auto [R, C] = matrix_shape("x", x);
        mok::Mxfp8Tensor t = mok::quantize_mxfp8(x.data(), R, C, block_of(block), rule_from(rule));
        const size_t sr = size_t((R + t.block.rows - 1) / t.block.rows),
                     sc = size_t((C + t.block.cols - 1) / t.block.cols);
        return std::make_tuple(to_numpy(std::move(t.data), {size_t(R), size_t(C)}),
                               to_numpy(std::move(t.scales), {sr, sc}));
      },
      "x"_a, "block"_a = std::make_tuple(1, 32), "rule"_a = "rceil",
      "MXFP8: (E4M3 codes [R, C], E8M0 scales [ceil(R/br), ceil(C/bc)]).");
  m.def(
      "dequantize_mxfp8",
      [](const Arg<uint8_t>& data_arg, const Arg<uint8_t>& scales_arg, std::tuple<int, int> block) {
        const In<uint8_t> data = take(data_arg, "data");
        const In<uint8_t> scales = take(scales_arg, "scales");
        auto [R, C] = codes_shape(data);
        require_shape("scales", scales, scale_grid(R, C, block_of(block)),
                      "[ceil(R / block rows), ceil(C / block cols)]");
        mok::Mxfp8Tensor t{R, C, block_of(block), to_vector(data), to_vector(scales)};
        return to_numpy(mok::dequantize(t), {size_t(R), size_t(C)});
      },
      "data"_a, "scales"_a, "block"_a = std::make_tuple(1, 32));
  m.def(
      "quantize_nvfp4",
      [](const Arg<float>& x_arg, std::tuple<int, int> block) {
        const In<float> x = take(x_arg, "x");
        auto [R, C] = matrix_shape("x", x);
        mok::Nvfp4Tensor t = mok::quantize_nvfp4(x.data(), R, C, block_of(block));
        const size_t sr = size_t((R + t.block.rows - 1) / t.block.rows),
                     sc = size_t((C + t.block.cols - 1) / t.block.cols);
        return std::make_tuple(to_numpy(std::move(t.data), {size_t(R), size_t(C / 2)}),
                               to_numpy(std::move(t.scales), {sr, sc}), t.global_amax, t.s_dec);
      },
      "x"_a, "block"_a = std::make_tuple(1, 16),
      "NVFP4: (packed E2M1 [R, C/2], UE4M3 scales, global amax, per-tensor decode scale).");
  m.def(
      "dequantize_nvfp4",
      [](const Arg<uint8_t>& data_arg, const Arg<uint8_t>& scales_arg, float s_dec,
         std::tuple<int, int> block) {
        const In<uint8_t> data = take(data_arg, "data");
        const In<uint8_t> scales = take(scales_arg, "scales");
        auto [R, packed] = codes_shape(data);
        mok::Nvfp4Tensor t;
        t.rows = R;
        t.cols = packed * 2;
        t.block = block_of(block);
        require_shape("scales", scales, scale_grid(t.rows, t.cols, t.block),
                      "[ceil(R / block rows), ceil(C / block cols)] (C = 2 x data's columns)");
        t.data = to_vector(data);
        t.scales = to_vector(scales);
        t.s_dec = s_dec;
        return to_numpy(mok::dequantize(t), {size_t(t.rows), size_t(t.cols)});
      },
      "data"_a, "scales"_a, "s_dec"_a, "block"_a = std::make_tuple(1, 16));
  m.def(
      "quantize_fp8_block",
      [](const Arg<float>& x_arg, std::tuple<int, int> block, bool ue8m0) {
        const In<float> x = take(x_arg, "x");
        auto [R, C] = matrix_shape("x", x);
        mok::Fp8BlockTensor t = mok::quantize_fp8_block(x.data(), R, C, block_of(block), ue8m0);
        const size_t sr = size_t((R + t.block.rows - 1) / t.block.rows),
                     sc = size_t((C + t.block.cols - 1) / t.block.cols);
        return std::make_tuple(to_numpy(std::move(t.data), {size_t(R), size_t(C)}),
                               to_numpy(std::move(t.scales), {sr, sc}));
      },
      "x"_a, "block"_a = std::make_tuple(1, 128), "ue8m0"_a = false,
      "FP8 block: (E4M3 codes, FP32 decode scales).");
  m.def(
      "dequantize_fp8_block",
      [](const Arg<uint8_t>& data_arg, const Arg<float>& scales_arg, std::tuple<int, int> block) {
        const In<uint8_t> data = take(data_arg, "data");
        const In<float> scales = take(scales_arg, "scales");
        auto [R, C] = codes_shape(data);
        require_shape("scales", scales, scale_grid(R, C, block_of(block)),
                      "[ceil(R / block rows), ceil(C / block cols)]");
        mok::Fp8BlockTensor t{R, C, block_of(block), false, to_vector(data), to_vector(scales)};
        return to_numpy(mok::dequantize(t), {size_t(R), size_t(C)});
      },
      "data"_a, "scales"_a, "block"_a = std::make_tuple(1, 128));
}
