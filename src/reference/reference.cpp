// The CPU reference of the whole layer. It reads like the equations of layer.hpp:
//   forward   y[t,k] = expert_{id[t,k]}(x[t]);  out[t] = shared(x[t]) + sum_k w[t,k] y[t,k]
//   backward  the same rows in reverse, weight gradients summed over each expert's rows in
//             (token, k) order, d_x[t] = d_shared(x[t]) + sum_k d_expert(x[t]) in fixed k order.
#include <algorithm>
#include <string>

#include "mok/error.hpp"
#include "mok/layer.hpp"
#include "mok/schedule/routing_layout.hpp"
#include "reference/layer_sums.hpp"
#include "reference/mlp_math.hpp"

namespace mok {

OperandQuant operand_quant_for(Precision p) {
  switch (p) {
    case Precision::bf16:
      return OperandQuant::bf16;
    case Precision::fp8_block:
      return OperandQuant::fp8_block;
    case Precision::mxfp8:
      return OperandQuant::mxfp8;
    case Precision::nvfp4:
      return OperandQuant::nvfp4_weights;
  }
  return OperandQuant::none;
}

const char* operand_quant_name(OperandQuant q) {
  switch (q) {
    case OperandQuant::none:
      return "none";
    case OperandQuant::bf16:
      return "bf16";
    case OperandQuant::fp8_block:
      return "fp8_block";
    case OperandQuant::mxfp8:
      return "mxfp8";
    case OperandQuant::nvfp4:
      return "nvfp4";
    case OperandQuant::nvfp4_weights:
      return "nvfp4_weights";
  }
  return "?";
}

LayerParams LayerParams::zeros(const Config& c) {
  const size_t h = size_t(c.hidden), s = size_t(c.shared_width()),
               e = size_t(c.experts_per_rank()) * size_t(c.intermediate) * h;
  return {std::vector<double>(s * h), std::vector<double>(s * h), std::vector<double>(s * h),
          std::vector<double>(e),     std::vector<double>(e),     std::vector<double>(e)};
}

namespace {
void check_size(const char* name, size_t got, size_t want, const std::string& shape) {
  if (got != want) {
    throw Error(ErrorCode::invalid_argument, std::string(name) + " has " + std::to_string(got) +
                                                 " elements, expected " + std::to_string(want) +
                                                 " (shape " + shape + ")");
  }
}
std::string dims(std::initializer_list<int64_t> d) {
  std::string s = "[";
  for (int64_t v : d) s += (s.size() > 1 ? ", " : "") + std::to_string(v);
  return s + "]";
}
}  // namespace

void check_params(const Config& c, const LayerParams& p) {
  const int64_t H = c.hidden, S = c.shared_width(), L = c.experts_per_rank(), I = c.intermediate;
  check_size("shared_gate", p.shared_gate.size(), size_t(S * H), dims({S, H}));
  check_size("shared_up", p.shared_up.size(), size_t(S * H), dims({S, H}));
  check_size("shared_down", p.shared_down.size(), size_t(H * S), dims({H, S}));
  check_size("gate", p.gate.size(), size_t(L * I * H), dims({L, I, H}));
  check_size("up", p.up.size(), size_t(L * I * H), dims({L, I, H}));
  check_size("down", p.down.size(), size_t(L * H * I), dims({L, H, I}));
}

void check_batch(const Config& c, const Batch& b) {
  if (b.tokens < 0 || b.tokens > c.max_tokens_per_rank) {
    throw Error(ErrorCode::invalid_argument, "tokens = " + std::to_string(b.tokens) +
                                                 " is outside [0, max_tokens_per_rank = " +
                                                 std::to_string(c.max_tokens_per_rank) + "]");
  }
  const int64_t T = b.tokens, H = c.hidden, K = c.top_k;
  check_size("x", b.x.size(), size_t(T * H), dims({T, H}));
  check_size("topk_ids", b.topk_ids.size(), size_t(T * K), dims({T, K}));
  check_size("topk_weights", b.topk_weights.size(), size_t(T * K), dims({T, K}));
  for (int64_t s = 0; s < T * K; ++s) {
    const int32_t id = b.topk_ids[size_t(s)];
    if (id < 0 || id >= c.num_experts) {
      throw Error(ErrorCode::invalid_argument,
                  "topk_ids[" + std::to_string(s / K) + ", " + std::to_string(s % K) +
                      "] = " + std::to_string(id) + " is not an expert id (allowed: 0 to " +
                      std::to_string(c.num_experts - 1) + ")");
    }
  }
}

namespace {
void check_single_rank(const Config& c) {
  c.validate();
  if (c.ep_size != 1) {
    throw Error(ErrorCode::invalid_config,
                "ep_size = " + std::to_string(c.ep_size) +
                    ": the reference computes the whole layer on one rank (ep_size = 1); "
                    "expert-parallel groups run through the EP simulation");
  }
}

// Slots (t*K + k) of each expert, grouped by expert, (token, k) order inside: the schedule's sort.
struct ExpertRows {
  std::vector<int32_t> offsets, sorted;
};
ExpertRows rows_by_expert(const Config& c, const Batch& b) {
  const int E = c.num_experts;
  ExpertRows r{std::vector<int32_t>(size_t(E) + 1),
               std::vector<int32_t>(size_t(b.tokens * c.top_k))};
  std::vector<int32_t> counts(static_cast<size_t>(E)), cursor(static_cast<size_t>(E));
  sched::count_rows_per_expert(b.topk_ids.data(), b.tokens, c.top_k, E, counts.data());
  sched::exclusive_prefix(counts.data(), E, r.offsets.data());
  sched::sort_slots_by_expert(b.topk_ids.data(), b.tokens, c.top_k, E, r.offsets.data(),
                              cursor.data(), r.sorted.data());
  return r;
}

ref::PreparedMlp prepare_expert(const Config& c, const LayerParams& p, int l,
                                const ref::Rounding& r) {
  const size_t n = size_t(c.intermediate) * size_t(c.hidden);
  return ref::prepare_mlp(&p.gate[l * n], &p.up[l * n], &p.down[l * n], c.hidden, c.intermediate,
                          r);
}
ref::PreparedMlp prepare_shared(const Config& c, const LayerParams& p, const ref::Rounding& r) {
  return ref::prepare_mlp(p.shared_gate.data(), p.shared_up.data(), p.shared_down.data(), c.hidden,
                          c.shared_width(), r.for_shared());
}
}  // namespace

ReferenceForward reference_forward(const Config& c, const LayerParams& p, const Batch& b,
                                   const ReferenceOptions& o) {
  check_single_rank(c);
  check_params(c, p);
  check_batch(c, b);
  const ref::Rounding r = ref::Rounding::from(o);
  const int64_t T = b.tokens, H = c.hidden, K = c.top_k;

  // y[t,k] for every routed row, expert by expert.
  std::vector<double> y_slots(size_t(T * K * H));
  const ExpertRows rows = rows_by_expert(c, b);
  ref::RowForward row;
  for (int e = 0; e < c.num_experts; ++e) {
    if (rows.offsets[size_t(e)] == rows.offsets[size_t(e) + 1]) continue;
    const ref::PreparedMlp mlp = prepare_expert(c, p, e, r);
    for (int32_t i = rows.offsets[size_t(e)]; i < rows.offsets[size_t(e) + 1]; ++i) {
      const int32_t slot = rows.sorted[size_t(i)];
      ref::mlp_row_forward(mlp, &b.x[size_t(sched::slot_token(slot, int(K)) * H)], r, row);
      std::copy(row.y.begin(), row.y.end(), &y_slots[size_t(slot * H)]);
    }
  }

  std::vector<double> y_shared(size_t(T * H), 0.0);
  if (c.shared_width() > 0) {
    const ref::PreparedMlp shared = prepare_shared(c, p, r);
    for (int64_t t = 0; t < T; ++t) {
      ref::mlp_row_forward(shared, &b.x[size_t(t * H)], r.for_shared(), row);
      std::copy(row.y.begin(), row.y.end(), &y_shared[size_t(t * H)]);
    }
  }

  ReferenceForward f{std::vector<double>(size_t(T * H)), ReferenceContext{c, &p, b, o}};
  ref::combine_rows(r, T, H, K, y_shared.data(), y_slots.data(), b.topk_weights.data(),
                    f.out.data());
  return f;
}

LayerGradients reference_backward(const ReferenceContext& ctx, const std::vector<double>& d_out) {
  const Config& c = ctx.config;
  const LayerParams& p = *ctx.params;
  const Batch& b = ctx.batch;
  const ref::Rounding r = ref::Rounding::from(ctx.options);
  const int64_t T = b.tokens, H = c.hidden, K = c.top_k, I = c.intermediate;
  check_size("d_out", d_out.size(), size_t(T * H), dims({T, H}));

  LayerGradients g{std::vector<double>(size_t(T * H)), std::vector<double>(size_t(T * K)),
                   LayerParams::zeros(c)};
  std::vector<double> dx_slots(size_t(T * K * H));

  // Routed experts: rows of each expert in (token, k) order, weight gradients tile by tile.
  const ExpertRows rows = rows_by_expert(c, b);
  for (int e = 0; e < c.num_experts; ++e) {
    const int32_t begin = rows.offsets[size_t(e)], end = rows.offsets[size_t(e) + 1];
    if (begin == end) continue;
    const ref::PreparedMlp mlp = prepare_expert(c, p, e, r);
    ref::MlpGradAccumulator acc(H, I);
    for (int32_t tile = begin; tile < end; tile += c.tile_rows) {
      const int32_t n = std::min<int32_t>(c.tile_rows, end - tile);
      std::vector<ref::RowBackward> rb(static_cast<size_t>(n));
      std::vector<const ref::RowBackward*> rp(static_cast<size_t>(n));
      std::vector<const double*> xp(static_cast<size_t>(n));
      for (int32_t j = 0; j < n; ++j) {
        const int32_t slot = rows.sorted[size_t(tile + j)];
        const int64_t t = sched::slot_token(slot, int(K));
        xp[size_t(j)] = &b.x[size_t(t * H)];
        ref::mlp_row_backward(mlp, xp[size_t(j)], &d_out[size_t(t * H)],
                              r.store(b.topk_weights[size_t(slot)]), r, rb[size_t(j)]);
        rp[size_t(j)] = &rb[size_t(j)];
        std::copy(rb[size_t(j)].dx.begin(), rb[size_t(j)].dx.end(), &dx_slots[size_t(slot * H)]);
        g.d_topk_weights[size_t(slot)] = rb[size_t(j)].d_weight;
      }
      acc.add_tile(rp.data(), xp.data(), n, r);
    }
    const size_t off = size_t(e) * size_t(I * H);
    acc.finish(r, &g.d_params.gate[off], &g.d_params.up[off], &g.d_params.down[off]);
  }

  std::vector<double> dx_shared(size_t(T * H), 0.0);
  if (c.shared_width() > 0) {
    const ref::PreparedMlp shared = prepare_shared(c, p, r);
    ref::shared_backward(shared, r.for_shared(), b.x.data(), d_out.data(), T, c.tile_rows,
                         dx_shared.data(), g.d_params.shared_gate.data(),
                         g.d_params.shared_up.data(), g.d_params.shared_down.data());
  }
  ref::reduce_input_grads(r, T, H, K, dx_shared.data(), dx_slots.data(), g.d_x.data());
  return g;
}

}  // namespace mok
