// `mok bench --precision P`: a low-precision forward (EP = 1) beside mok's BF16 forward on the
// same inputs in alternating rounds, on the standard shapes or the layer given: their times and
// TFLOP/s by design.md's formula (the same FLOPs), the weight quantization timed apart, how far
// the low-precision output is from the BF16 one, and how far each is from the exact layer (FP64,
// no rounding) on sampled rows. With --direction backward: the backward (BF16 weight gradients)
// and the whole step of each, and the same distances for d_x.
#include <cstdio>
#include <string>
#include <vector>

#include "bench_command.hpp"
#include "mok/config.hpp"
#include "mok/error.hpp"

#if defined(MOK_WITH_CUDA_KERNELS)
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <utility>

#include "bench_layer.hpp"
#include "bench_sampled_check.hpp"
#include "cuda_util.hpp"
#include "layer/forward_hooks.hpp"
#include "layer/layer_runner.hpp"
#include "mok/compare.hpp"
#include "mok/formats/codecs.hpp"
#include "mok/gpu/low_precision_experts.hpp"
#include "mok/gpu/moe_backward.hpp"
#include "mok/gpu/moe_forward.hpp"
#include "mok/gpu/random_fill.hpp"
#endif

namespace mok::tools {

#if defined(MOK_WITH_CUDA_KERNELS)
namespace {

std::vector<double> host_values(const DeviceArray<__nv_bfloat16>& a) {
  std::vector<double> v;
  for (const __nv_bfloat16& b : a.to_host()) {
    uint16_t bits;
    std::memcpy(&bits, &b, 2);
    v.push_back(fmt::bf16_to_float(bits));
  }
  return v;
}

// --breakdown of the backward: each precision without its weight-gradient work (the dgrad
// GEMMs, the dispatch and combine alone) and the waits of one profiled run.
struct BackwardBreakdown {
  std::string name;
  double no_wgrad_ms[2] = {};
  gpu::detail::ForwardProfile profile[2];
};

void print_backward_breakdown(const std::vector<BackwardBreakdown>& rows, const char* precision) {
  std::printf(
      "\nBreakdown (ms; \"without wgrad\": the same launch with its weight-gradient tiles' "
      "k-loops dropped; waits from one profiled run, per GEMM CTA's producer and per consumer "
      "warpgroup; wgrad epilogue = epilogue - dgrad-gate/up - dgrad-down)\n\n"
      "| shape | precision | without wgrad | producer waits: dispatch / dgrad-down tiles / a free "
      "stage | consumers: starved (first stages) | epilogue: dgrad-down / dgrad-gate/up / "
      "wgrad | waiting for a tile | busy | dispatch copying / total | combine waits / total |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  for (const BackwardBreakdown& r : rows)
    for (int i = 0; i < 2; ++i) {
      const gpu::detail::ForwardProfile& f = r.profile[i];
      std::printf(
          "| %s | %s | %.3f | %.3f / %.3f / %.3f | %.3f (%.3f) | %.3f / %.3f / %.3f | %.3f | "
          "%.3f | %.3f / %.3f | %.3f / %.3f |\n",
          r.name.c_str(), i ? precision : "bf16", r.no_wgrad_ms[i], f.gate_up_waits_dispatch,
          f.down_waits_gate_up, f.producer_waits_ring, f.consumer_starved, f.consumer_starved_first,
          f.consumer_publish, f.consumer_epilogue_down,
          f.consumer_epilogue - f.consumer_epilogue_down - f.consumer_publish,
          f.consumer_waits_tile, f.consumer_total, f.dispatch_copying, f.dispatch_total,
          f.combine_waits, f.combine_total);
    }
}

// The backward and the step (forward with its context, then backward) of BF16 and of the
// precision on the same inputs, alternating rounds; backward FLOPs = 2x the forward's. Both write
// their BF16 weight gradients into one set of buffers (only d_x is compared).
int bench_precision_backward(const BenchOptions& o, Precision precision) {
  std::printf(
      "| shape | T | BF16 backward ms | TFLOP/s | %s backward ms | TFLOP/s | speed-up | BF16 "
      "step ms | %s step ms | step speed-up | d_x differs from BF16 by | d_x vs exact layer: "
      "BF16 / %s | dispatch CTAs |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      o.layer.precision.c_str(), o.layer.precision.c_str(), o.layer.precision.c_str());
  gpu::ForwardOptions fo = bench_forward_options(o);
  fo.block_n = 0;  // --block-n is the backward's tile width; the forwards keep their own (the
                   // fp8_block forward has 256-wide tiles only)
  gpu::ForwardOptions fq = fo;
  fq.row_path = gpu::RowPath::automatic;
  gpu::BackwardOptions bo;
  bo.weight_grads = gpu::WeightGrads::write_bf16;
  bo.block_n = o.block_n;
  bo.dispatch_ctas = o.dispatch_ctas;
  gpu::detail::ForwardHooks no_wgrad, wait_times;
  no_wgrad.without_wgrad = true;
  wait_times.wait_times = true;
  std::vector<BackwardBreakdown> breakdowns;
  // One shape; a device allocation that fails (the weights' estimate above leaves out the
  // activations and workspaces) ends its row, not the bench.
  auto one_shape = [&](const std::string& name, const Config& shape, int64_t tokens) {
    Config c = shape;
    c.max_tokens_per_rank = int(tokens);
    c.ring_rows = o.ring_rows;
    c.precision = Precision::bf16;
    c.validate();
    Config q = c;
    q.precision = precision;
    q.fp8_ue8m0 = o.layer.fp8_scales == "ue8m0";
    const int64_t H = c.hidden, EIH = int64_t(c.num_experts) * c.intermediate * H,
                  SH = int64_t(c.shared_width()) * H;
    // The BF16 weights and their gradients, the quantized experts (fp8_block's and mxfp8's in
    // both orientations, a byte per element each): what must fit beside each other (activations,
    // contexts and workspaces come on top).
    const double quantized_bytes =
        precision == Precision::nvfp4 ? 0.5 * double(EIH) : 2.0 * double(EIH);
    const double needed = 3.0 * double(4 * (EIH + SH)) + 3.0 * quantized_bytes;
    size_t free_bytes = 0, total_bytes = 0;
    cuda_ok(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    if (needed > double(free_bytes)) {
      std::printf(
          "| %s | %lld | does not fit: the BF16 weights, their gradients and the quantized "
          "experts alone need %.0f GB, %.0f GB are free | | | | | | | | | |\n",
          name.c_str(), (long long)tokens, needed * 1e-9, double(free_bytes) * 1e-9);
      std::fflush(stdout);
      return;
    }
    const BenchLayer data(c, c.num_experts, tokens, 0, o.layer.routing_choice(), o.inputs_seed);
    DeviceArray<__nv_bfloat16> d_out(size_t(tokens * H)), out_q(d_out.n);
    BenchLayer::fill_d_out(d_out.ptr, tokens * H, o.inputs_seed);
    const size_t shared_n = static_cast<size_t>(SH), routed_n = static_cast<size_t>(EIH);
    DeviceArray<__nv_bfloat16> d_x16(size_t(tokens * H)), d_x8(d_x16.n), sg(shared_n), su(shared_n),
        sd(shared_n), g(routed_n), u(routed_n), d(routed_n);
    DeviceArray<float> d_w16(size_t(tokens * c.top_k)), d_w8(d_w16.n);
    const gpu::DeviceGradients g16{d_x16.ptr, d_w16.ptr, sg.ptr, su.ptr,
                                   sd.ptr,    g.ptr,     u.ptr,  d.ptr},
        g8{d_x8.ptr, d_w8.ptr, sg.ptr, su.ptr, sd.ptr, g.ptr, u.ptr, d.ptr};
    gpu::MoeForward f16(c, fo), f8(q, fq);
    gpu::MoeBackward b16(c, bo), b8(q, bo);
    gpu::Schedule s16(c), s8(q);
    gpu::ForwardContext ctx16(c), ctx8(q);
    const gpu::DeviceLayerWeights weights = data.weights();
    gpu::LowPrecisionExperts experts(q, /*backward=*/true);
    experts.quantize(weights, nullptr);
    const gpu::DeviceLayerWeights quantized = experts.with(weights);
    const gpu::DeviceBatch batch = data.batch();
    f16.schedule(batch, s16, nullptr);
    f8.schedule(batch, s8, nullptr);
    auto forward16 = [&] { f16.forward(s16, batch, weights, data.out.ptr, &ctx16, nullptr); };
    auto forward8 = [&] { f8.forward(s8, batch, quantized, out_q.ptr, &ctx8, nullptr); };
    auto back = [&](gpu::MoeBackward& b, bool low) {
      if (low) return b.backward(s8, ctx8, batch, quantized, d_out.ptr, g8, nullptr);
      b.backward(s16, ctx16, batch, weights, d_out.ptr, g16, nullptr);
    };
    auto back16 = [&] { back(b16, false); };
    auto back8 = [&] { back(b8, true); };
    auto step16 = [&] { forward16(), back16(); };
    auto step8 = [&] { forward8(), back8(); };
    median_ms(step16, 3);
    median_ms(step8, 3);
    for (gpu::MoeForward* f : {&f16, &f8}) f->check(nullptr);
    for (gpu::MoeBackward* b : {&b16, &b8}) b->check(nullptr);
    std::vector<double> a, b, sa, sb;
    for (int round = 0; round < 3; ++round) {
      a.push_back(median_ms(back16, o.iterations));
      b.push_back(median_ms(back8, o.iterations));
      sa.push_back(median_ms(step16, o.iterations));
      sb.push_back(median_ms(step8, o.iterations));
    }
    for (gpu::MoeForward* f : {&f16, &f8}) f->check(nullptr);
    for (gpu::MoeBackward* bk : {&b16, &b8}) bk->check(nullptr);
    const double flops = backward_flops(c, tokens), ms16 = middle(a), ms8 = middle(b);
    const double difference = relative_l2_error(host_values(d_x8), host_values(d_x16));
    const double exact16 = sampled_exact_error(c, data, d_x16.ptr, d_out.ptr),
                 exact8 = sampled_exact_error(c, data, d_x8.ptr, d_out.ptr);
    std::printf(
        "| %s | %lld | %.3f | %.0f | %.3f | %.0f | %.2f | %.3f | %.3f | %.2f | %.1e | %.1e / "
        "%.1e | %d |\n",
        name.c_str(), (long long)tokens, ms16, flops / (ms16 * 1e-3) * 1e-12, ms8,
        flops / (ms8 * 1e-3) * 1e-12, ms16 / ms8, middle(sa), middle(sb), middle(sa) / middle(sb),
        difference, exact16, exact8, b8.dispatch_ctas());
    std::fflush(stdout);
    if (!o.breakdown) return;
    // The variants run after the context is filled; their gradients are wrong (later runs of
    // the rows above would need a fresh forward, which no later row does).
    BackwardBreakdown r;
    r.name = name + " T = " + std::to_string(tokens);
    gpu::MoeBackward w16(c, bo, no_wgrad), w8(q, bo, no_wgrad), p16(c, bo, wait_times),
        p8(q, bo, wait_times);
    auto without16 = [&] { back(w16, false); };
    auto without8 = [&] { back(w8, true); };
    median_ms(without16, 3);
    median_ms(without8, 3);
    std::vector<double> wa, wb;
    for (int round = 0; round < 3; ++round) {
      wa.push_back(median_ms(without16, o.iterations));
      wb.push_back(median_ms(without8, o.iterations));
    }
    r.no_wgrad_ms[0] = middle(wa);
    r.no_wgrad_ms[1] = middle(wb);
    back(p16, false);
    r.profile[0] = gpu::detail::backward_profile(p16.runner(), nullptr);
    back(p8, true);
    r.profile[1] = gpu::detail::backward_profile(p8.runner(), nullptr);
    for (gpu::MoeBackward* bk : {&w16, &w8, &p16, &p8}) bk->check(nullptr);
    breakdowns.push_back(r);
  };
  for (const auto& [name, shape, tokens] : bench_shapes(o)) {
    try {
      one_shape(name, shape, tokens);
    } catch (const Error& e) {
      if (std::string(e.what()).find("out of memory") == std::string::npos) throw;
      std::printf("| %s | %lld | does not fit: %s | | | | | | | | | | |\n", name.c_str(),
                  (long long)tokens, e.what());
      std::fflush(stdout);
    }
  }
  if (!breakdowns.empty()) print_backward_breakdown(breakdowns, o.layer.precision.c_str());
  return 0;
}

}  // namespace

int bench_precision_command(const BenchOptions& o) {
  const Precision precision = parse_precision(o.layer.precision);
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0)
    throw Error(ErrorCode::unsupported, "mok bench needs a GPU; none is visible on this machine");
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf(
      "mok bench: the %s %s megakernel (EP = 1; the routed experts in %s, the shared ones "
      "BF16) beside mok's BF16 one on %s, the same inputs; medians of %d runs, 3 alternating "
      "rounds; TFLOP/s by design.md's formula for both\n\n",
      o.layer.precision.c_str(), o.direction.c_str(), o.layer.precision.c_str(), prop.name,
      o.iterations);
  print_routing_note(o);
  if (o.direction == "backward") return bench_precision_backward(o, precision);
  std::printf(
      "| shape | T | BF16 ms | BF16 TFLOP/s | %s ms | %s TFLOP/s | speed-up | weight "
      "quantization ms | output differs from BF16 by | output vs exact layer: BF16 / %s |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n",
      o.layer.precision.c_str(), o.layer.precision.c_str(), o.layer.precision.c_str());
  gpu::ForwardOptions fo = bench_forward_options(o);
  gpu::ForwardOptions fq = fo;
  fq.row_path = gpu::RowPath::automatic;  // the low precisions take the dispatch copy
  std::vector<std::pair<std::string, gpu::detail::ForwardProfile>> profiles;
  for (const auto& [name, shape, tokens] : bench_shapes(o)) {
    Config c = shape;
    c.max_tokens_per_rank = int(tokens);
    c.ring_rows = o.ring_rows;
    c.precision = Precision::bf16;
    c.validate();
    Config q = c;
    q.precision = precision;
    q.fp8_ue8m0 = o.layer.fp8_scales == "ue8m0";
    const BenchLayer data(c, c.num_experts, tokens, 0, o.layer.routing_choice(), o.inputs_seed);
    DeviceArray<__nv_bfloat16> out_q(size_t(tokens * c.hidden));
    gpu::MoeForward bf16(c, fo), low(q, fq);
    const gpu::DeviceLayerWeights weights = data.weights();
    gpu::LowPrecisionExperts experts(q);
    const gpu::DeviceLayerWeights quantized = experts.with(weights);
    const gpu::DeviceBatch batch = data.batch();
    auto run_bf16 = [&] { bf16.forward(batch, weights, data.out.ptr, nullptr); };
    auto run_low = [&] { low.forward(batch, quantized, out_q.ptr, nullptr); };
    auto quantize = [&] { experts.quantize(weights, nullptr); };
    median_ms(quantize, 3);
    median_ms(run_bf16, 3);
    median_ms(run_low, 3);
    bf16.check(nullptr);
    low.check(nullptr);
    std::vector<double> a, b;
    for (int round = 0; round < 3; ++round) {
      a.push_back(median_ms(run_bf16, o.iterations));
      b.push_back(median_ms(run_low, o.iterations));
    }
    const double quantize_ms = median_ms(quantize, o.iterations);
    bf16.check(nullptr);
    low.check(nullptr);
    const double flops = forward_flops(c, tokens), ms_bf16 = middle(a), ms_low = middle(b);
    const double difference = relative_l2_error(host_values(out_q), host_values(data.out));
    const double exact_bf16 = sampled_exact_error(c, data, data.out.ptr),
                 exact_low = sampled_exact_error(c, data, out_q.ptr);
    std::printf("| %s | %lld | %.3f | %.0f | %.3f | %.0f | %.2f | %.3f | %.1e | %.1e / %.1e |\n",
                name.c_str(), (long long)tokens, ms_bf16, flops / (ms_bf16 * 1e-3) * 1e-12, ms_low,
                flops / (ms_low * 1e-3) * 1e-12, ms_bf16 / ms_low, quantize_ms, difference,
                exact_bf16, exact_low);
    std::fflush(stdout);
    if (o.breakdown) {  // one profiled run of each (same outputs; a few clock reads per tile)
      gpu::detail::ForwardHooks timed;
      timed.wait_times = true;
      gpu::MoeForward timed_bf16(c, fo, timed), timed_low(q, fq, timed);
      timed_bf16.forward(batch, weights, data.out.ptr, nullptr);
      timed_low.forward(batch, quantized, out_q.ptr, nullptr);
      profiles.push_back({name + " T = " + std::to_string(tokens) + " BF16",
                          timed_bf16.runner().profile(nullptr)});
      profiles.push_back({name + " T = " + std::to_string(tokens) + " " + o.layer.precision,
                          timed_low.runner().profile(nullptr)});
    }
  }
  if (!profiles.empty()) {
    std::printf(
        "\nWaits inside the megakernel (profiled runs; ms per participant):\n| forward | %s\n"
        "|---|---|---|---|---|\n",
        kProfileColumns);
    for (const auto& [what, profile] : profiles) {
      std::printf("| %s | ", what.c_str());
      print_profile_cells(profile);
    }
    if (o.layer.precision != "fp8_block") {
      std::printf(
          "\nThe widening (per GEMM CTA; ms): the TMA leader waiting for a free staging slot, the "
          "first converter warp waiting for a free ring stage, for a slot's codes to land, and "
          "widening\n| forward | leader waits for a slot | converter waits: ring stage / codes "
          "| converter widening |\n|---|---|---|---|\n");
      for (size_t i = 1; i < profiles.size(); i += 2) {  // each shape's second: the widening one
        const auto& [what, f] = profiles[i];
        std::printf("| %s | %.3f | %.3f / %.3f | %.3f |\n", what.c_str(), f.leader_waits_staging,
                    f.converter_waits_ring, f.converter_waits_codes, f.converter_widening);
      }
    }
  }
  return 0;
}

#else

int bench_precision_command(const BenchOptions&) {
  throw Error(ErrorCode::unsupported, "mok bench needs a build with CUDA (nvcc) and a GPU");
}

#endif

}  // namespace mok::tools
