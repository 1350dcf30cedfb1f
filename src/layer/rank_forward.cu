#include "layer/rank_forward.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/gemm/mma_traits.cuh"
#include "kernels/moe_forward/source_rows.hpp"
#include "mok/device/tensor_map.hpp"
#include "mok/error.hpp"
#include "mok/gpu/random_fill.hpp"
#include "mok/schedule/routing_layout.hpp"
#include "mok/schedule/tile_order.hpp"

namespace mok::gpu::detail {

void throw_on_fault(const kern::ForwardFault& fault, double wait_seconds,
                    const std::string& prefix) {
  throw_on_fault(fault, wait_seconds, prefix, fault_role_name, "the forward");
}

void throw_on_fault(const kern::ForwardFault& fault, double wait_seconds, const std::string& prefix,
                    const char* (*role_name)(int), const char* program) {
  std::string cause, consequences;
  for (int role = 0; role < kern::kForwardRoles; ++role) {
    const auto& r = fault.records[role];
    if (!r.seen) continue;
    const std::string what =
        role == kern::kRoleConsumer && r.what < 0
            ? "a GEMM consumer waiting for its next tile index (CTA " + std::to_string(r.cta) + ")"
            : std::string(role_name(role)) + " " + std::to_string(r.what) + " (CTA " +
                  std::to_string(r.cta) + ")";
    if (cause.empty())
      cause = what;
    else
      consequences += (consequences.empty() ? "" : "; ") + what;
  }
  if (cause.empty()) return;
  throw Error(ErrorCode::peer_timeout, prefix + program + " stopped: " + cause + " gave up after " +
                                           std::to_string(wait_seconds) + " s" +
                                           (consequences.empty() ? "" : "; then " + consequences) +
                                           "; the output is incomplete");
}

ForwardProfile read_profile(const unsigned long long* timings, int ctas, int dispatch_ctas,
                            cudaStream_t stream) {
  unsigned long long ns[kern::kForwardTimings] = {};
  check_cuda(cudaMemcpyAsync(ns, timings, sizeof ns, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "the forward");
  // Dispatch CTAs join the GEMMs after dispatch; every CTA's 8 consumer warps combine.
  const double gemm_ctas = ctas, warpgroups = 2.0 * gemm_ctas,
               dispatchers = dispatch_ctas > 0 ? dispatch_ctas : 1,  // 0: no dispatch role
      combine_warps = 8.0 * ctas;
  auto ms = [&](int i, double participants) { return double(ns[i]) * 1e-6 / participants; };
  ForwardProfile f;
  f.gate_up_waits_dispatch = ms(kern::kTimeGateUpWaitsDispatch, gemm_ctas);
  f.down_waits_gate_up = ms(kern::kTimeDownWaitsGateUp, gemm_ctas);
  f.producer_waits_ring = ms(kern::kTimeProducerWaitsRing, gemm_ctas);
  f.consumer_starved = ms(kern::kTimeConsumerWaitsLoads, warpgroups);
  f.consumer_starved_first = ms(kern::kTimeConsumerStarvedFirst, warpgroups);
  f.consumer_epilogue = ms(kern::kTimeConsumerEpilogue, warpgroups);
  f.consumer_epilogue_down = ms(kern::kTimeConsumerEpilogueDown, warpgroups);
  f.consumer_publish = ms(kern::kTimeConsumerPublish, warpgroups);
  f.consumer_waits_tile = ms(kern::kTimeConsumerWaitsTile, warpgroups);
  f.consumer_total = ms(kern::kTimeConsumerTotal, warpgroups);
  if (ns[kern::kTimeConsumerTotal] > 0)
    f.consumer_sm_mhz =
        1e3 * double(ns[kern::kTimeConsumerCycles]) / double(ns[kern::kTimeConsumerTotal]);
  f.dispatch_copying = ms(kern::kTimeDispatchCopying, dispatchers);
  f.dispatch_total = ms(kern::kTimeDispatchTotal, dispatchers);
  f.combine_waits = ms(kern::kTimeCombineWaits, combine_warps);
  f.combine_total = ms(kern::kTimeCombineTotal, combine_warps);
  f.dispatch_ctas_joined = int(ns[kern::kDispatchCtasJoined]);
  f.leader_waits_staging = ms(kern::kTimeLeaderWaitsStaging, gemm_ctas);
  f.converter_waits_ring = ms(kern::kTimeConverterWaitsRing, gemm_ctas);
  f.converter_waits_codes = ms(kern::kTimeConverterWaitsCodes, gemm_ctas);
  f.converter_widening = ms(kern::kTimeConverterWidening, gemm_ctas);
  return f;
}

const char* fault_role_name(int role) {
  switch (role) {
    case kern::kRoleGateUpProducer:
      return "a gate/up producer waiting for dispatched row block";
    case kern::kRoleDownProducer:
      return "a down producer waiting for the activations of row block";
    case kern::kRoleSharedDownProducer:
      return "a shared-expert down producer waiting for the activations of token block";
    case kern::kRoleConsumer:
      return "a GEMM consumer waiting for the TMA loads of tile";
    case kern::kRoleCombine:
      return "the combine waiting for the expert outputs of token";
    case kern::kRoleDispatchRing:
      return "dispatch waiting for the GEMMs to free the token ring's tile for row block";
    case kern::kRoleProducerRing:
      return "a producer waiting for a free ring stage, at tile";
    default:
      return "an unknown role";
  }
}

bool source_quantized(Precision p) { return p == Precision::fp8_block || p == Precision::mxfp8; }

int64_t source_row_bytes(const Config& c) {
  return kern::source_row_layout(c.precision == Precision::mxfp8, c.hidden).bytes();
}

void quantize_source_rows(const Config& c, const __nv_bfloat16* from, int64_t tokens, uint8_t* rows,
                          cudaStream_t stream, const char* what) {
  check_cuda(kern::quantize_source_rows(from, tokens, c.hidden, c.precision == Precision::mxfp8,
                                        c.fp8_ue8m0, rows, stream),
             what);
}

void RankSchedule::allocate(const Config& c) {
  const char* what = "cudaMalloc (schedule)";
  const int64_t El = c.experts_per_rank();
  config = c;
  sched.allocate(c);
  capacity_blocks = sched.capacity / kTileRows;
  token_blocks = sched.token_rows / kTileRows;
  owner_seg_begin = device_alloc<int64_t>(size_t(El + 1), what);
  owner_segment_rows = device_alloc<int64_t>(size_t(El), what);
  owner_source_begin = device_alloc<int64_t>(size_t(El * (c.ep_size + 1)), what);
  owner_tile_expert = device_alloc<int32_t>(size_t(capacity_blocks), what);
  group_status = device_alloc<Status>(1, what);
  row_destination = device_alloc<int64_t>(size_t(sched.capacity), what);
}

void RankSchedule::release() {
  sched.release();
  for (void* p : {(void*)owner_seg_begin, (void*)owner_segment_rows, (void*)owner_source_begin,
                  (void*)owner_tile_expert, (void*)group_status, (void*)row_destination})
    cudaFree(p);
  *this = RankSchedule{};
}

void RankSchedule::require_config(const Config& c, const char* who) const {
  // Messages are built only on failure: these checks run on every forward and backward.
  const bool same = config.num_experts == c.num_experts && config.top_k == c.top_k &&
                    config.ep_size == c.ep_size &&
                    config.max_tokens_per_rank == c.max_tokens_per_rank &&
                    sched.capacity == sched::pad_to_tile(c.capacity_rows(), kTileRows);
  if (!same)
    throw Error(ErrorCode::invalid_argument,
                std::string(who) + ": the schedule was made for another configuration (" +
                    config.describe() + "), this forward's is " + c.describe());
}

void RankSchedule::require_matches(const Config& c, int64_t t, const char* who) const {
  require_config(c, who);
  if (tokens < 0)
    throw Error(ErrorCode::invalid_argument,
                std::string(who) +
                    ": the schedule holds no batch yet: call schedule(batch, s, stream) first");
  if (tokens != t)
    throw Error(ErrorCode::invalid_argument,
                std::string(who) + ": the schedule was built for a batch of " +
                    std::to_string(tokens) + " tokens, the forward got " + std::to_string(t));
}

void RankBuffers::allocate(const Config& c, const Parts& parts) {
  const char* what = "cudaMalloc (forward workspace)";
  const int64_t H = c.hidden, I = c.intermediate, S = c.shared_width(), K = c.top_k,
                max_t = c.max_tokens_per_rank;
  schedule.allocate(c);
  const ScheduleBuffers& sched = schedule.sched;
  capacity_blocks = schedule.capacity_blocks;
  token_blocks = schedule.token_blocks;
  ring_blocks = std::clamp<int64_t>(c.effective_ring_rows() / kTileRows, 1, capacity_blocks);
  const int64_t ring_rows = ring_blocks * kTileRows;
  const bool fp8 = c.precision == Precision::fp8_block;
  if (fp8) {
    routed_x_e4m3 = device_alloc<uint8_t>(size_t(ring_rows * H), what);
    routed_x_scales = device_alloc<float>(size_t(ring_rows * (H / 128)), what);
    act_e4m3 = device_alloc<uint8_t>(size_t(sched.capacity * I), what);
    act_scales = device_alloc<float>(size_t(sched.capacity * (I / 128)), what);
  } else {
    routed_x = device_alloc<__nv_bfloat16>(size_t(ring_rows * H), what);
    act = device_alloc<__nv_bfloat16>(size_t(sched.capacity * I), what);
  }
  if (parts.x_rows && source_quantized(c.precision))
    x_rows = device_alloc<uint8_t>(size_t(max_t * source_row_bytes(c)), what);
  if (parts.random_ring) {  // BF16 only (plan_forward refuses the probe with fp8_block)
    check_cuda(fill_uniform_bf16(routed_x, ring_rows * H, 0x5eed, 1.0f, nullptr),
               "filling the token ring");
    check_cuda(cudaStreamSynchronize(nullptr), "filling the token ring");
  }
  act_shared = S ? device_alloc<__nv_bfloat16>(size_t(sched.token_rows * S), what) : nullptr;
  y_slots = parts.y_slots ? device_alloc<__nv_bfloat16>(size_t(max_t * K * H), what) : nullptr;
  y_shared = S ? device_alloc<__nv_bfloat16>(size_t(max_t * H), what) : nullptr;
  // What reset() zeroes before each forward, in one allocation: one memset, not four.
  counter_words = size_t(2 * capacity_blocks + token_blocks + max_t + 2);
  auto round_up = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const size_t fault_at = round_up(counter_words * sizeof(uint32_t));
  const size_t aborted_at = fault_at + round_up(sizeof(kern::ForwardFault));
  const size_t timings_at = aborted_at + round_up(sizeof(int));
  zeroed_bytes =
      timings_at + (parts.timings ? kern::kForwardTimings * sizeof(unsigned long long) : 0);
  auto* zeroed = static_cast<uint8_t*>(device_alloc_bytes(zeroed_bytes, what));
  counters = reinterpret_cast<uint32_t*>(zeroed);
  fault = reinterpret_cast<kern::ForwardFault*>(zeroed + fault_at);
  aborted = reinterpret_cast<int*>(zeroed + aborted_at);
  timings = parts.timings ? reinterpret_cast<unsigned long long*>(zeroed + timings_at) : nullptr;
  for (int i = 0; i < 2; ++i)  // boxes of 128 rows, then of 64 (kern::ForwardMaps)
    routed_x_map[i] = fp8 ? dev::make_map_2d(dev::Dtype::e4m3, routed_x_e4m3, uint64_t(ring_rows),
                                             uint64_t(H), uint64_t(H), kern::a_box_rows(i))
                          : dev::make_map_2d(dev::Dtype::bf16, routed_x, uint64_t(ring_rows),
                                             uint64_t(H), uint64_t(H), kern::a_box_rows(i));
}

void RankBuffers::release() {
  schedule.release();
  for (void* p : {(void*)routed_x, (void*)act, (void*)act_shared, (void*)y_slots, (void*)y_shared,
                  (void*)routed_x_e4m3, (void*)routed_x_scales, (void*)act_e4m3, (void*)act_scales,
                  (void*)x_rows, (void*)counters /* with fault, aborted and timings */})
    cudaFree(p);
  *this = RankBuffers{};
}

void RankBuffers::reset(cudaStream_t stream) const {
  check_cuda(cudaMemsetAsync(counters, 0, zeroed_bytes, stream), "cudaMemsetAsync");
}

kern::ForwardMaps rank_maps(const RankBuffers& w, const Config& c, const DeviceBatch& b,
                            const DeviceLayerWeights& wt, const Activations& a, int block_n) {
  const uint64_t H = uint64_t(c.hidden), I = uint64_t(c.intermediate),
                 S = uint64_t(c.shared_width()), El = uint64_t(c.experts_per_rank());
  const uint64_t capacity = uint64_t(w.capacity_blocks * kTileRows),
                 token_rows = uint64_t(w.token_blocks * kTileRows);
  const uint32_t bn = uint32_t(block_n);
  const dev::Dtype bf16 = dev::Dtype::bf16;
  kern::ForwardMaps maps;
  for (int i = 0; i < 2; ++i) {  // boxes of 128 rows, then of 64
    const uint32_t box = kern::a_box_rows(i);
    maps.routed_x[i] = w.routed_x_map[i];
    if (a.act) maps.act[i] = dev::make_map_2d(bf16, a.act, capacity, I, I, box);
    maps.act_shared[i] =
        S ? dev::make_map_2d(bf16, a.act_shared, token_rows, S, S, box) : w.routed_x_map[i];
    maps.x[i] = b.tokens > 0 ? dev::make_map_2d(bf16, b.x, uint64_t(b.tokens), H, H, box)
                             : w.routed_x_map[i];
  }
  if (c.precision == Precision::fp8_block) {  // the routed maps read E4M3
    const dev::Dtype e4m3 = dev::Dtype::e4m3;
    const uint8_t* act = a.act_e4m3 ? a.act_e4m3 : w.act_e4m3;
    for (int i = 0; i < 2; ++i)
      maps.act[i] = dev::make_map_2d(e4m3, act, capacity, I, I, kern::a_box_rows(i));
    maps.gate = dev::make_map_3d(e4m3, wt.fp8_block.gate, El, I, H, bn / 2);
    maps.up = dev::make_map_3d(e4m3, wt.fp8_block.up, El, I, H, bn / 2);
    maps.down = dev::make_map_3d(e4m3, wt.fp8_block.down, El, H, I, bn);
  } else if (c.precision == Precision::nvfp4) {  // packed codes and block factors (bytes)
    const Nvfp4Weights& q = wt.nvfp4;
    const uint32_t k_bytes = uint32_t(kern::kBlockK / 2);
    maps.gate = dev::make_byte_map_3d(q.gate, El, I, H / 2, k_bytes, bn / 2);
    maps.up = dev::make_byte_map_3d(q.up, El, I, H / 2, k_bytes, bn / 2);
    maps.down = dev::make_byte_map_3d(q.down, El, H, I / 2, k_bytes, bn);
    // A stage's factors: rows / 16 blocks of 4 BF16 (8 bytes), one row of the map per k-block,
    // boxes of block_n / 2 rows (kern::Nvfp4Stage's halves).
    const uint64_t k_stages_h = H / uint64_t(kern::kBlockK),
                   k_stages_i = I / uint64_t(kern::kBlockK);
    maps.gate_factors = dev::make_byte_map_3d(q.gate_factors, El, k_stages_h, I / 2, bn / 4, 1);
    maps.up_factors = dev::make_byte_map_3d(q.up_factors, El, k_stages_h, I / 2, bn / 4, 1);
    maps.down_factors = dev::make_byte_map_3d(q.down_factors, El, k_stages_i, H / 2, bn / 4, 1);
  } else if (c.precision == Precision::mxfp8) {  // codes and block factors (bytes)
    const Mxfp8Weights& q = wt.mxfp8;
    const uint32_t k_bytes = uint32_t(kern::kBlockK);
    maps.gate = dev::make_byte_map_3d(q.gate, El, I, H, k_bytes, bn / 2);
    maps.up = dev::make_byte_map_3d(q.up, El, I, H, k_bytes, bn / 2);
    maps.down = dev::make_byte_map_3d(q.down, El, H, I, k_bytes, bn);
    // A stage's factors: per row two BF16 (4 bytes), one row of the map per k-block, boxes of
    // block_n / 2 rows (kern::Mxfp8Stage's halves).
    const uint64_t k_stages_h = H / uint64_t(kern::kBlockK),
                   k_stages_i = I / uint64_t(kern::kBlockK);
    maps.gate_factors = dev::make_byte_map_3d(q.gate_factors, El, k_stages_h, I * 4, bn * 2, 1);
    maps.up_factors = dev::make_byte_map_3d(q.up_factors, El, k_stages_h, I * 4, bn * 2, 1);
    maps.down_factors = dev::make_byte_map_3d(q.down_factors, El, k_stages_i, H * 4, bn * 2, 1);
  } else {
    maps.gate = dev::make_map_3d(bf16, wt.gate, El, I, H, bn / 2);
    maps.up = dev::make_map_3d(bf16, wt.up, El, I, H, bn / 2);
    maps.down = dev::make_map_3d(bf16, wt.down, El, H, I, bn);
  }
  if (S > 0) {
    maps.shared_gate = dev::make_map_3d(bf16, wt.shared_gate, 1, S, H, bn / 2);
    maps.shared_up = dev::make_map_3d(bf16, wt.shared_up, 1, S, H, bn / 2);
    maps.shared_down = dev::make_map_3d(bf16, wt.shared_down, 1, H, S, bn);
  } else {
    maps.shared_gate = maps.shared_up = maps.gate;
    maps.shared_down = maps.down;
  }
  return maps;
}

void require_operand(const void* p, const std::string& name, size_t alignment) {
  require(p != nullptr, ErrorCode::invalid_argument, name + " is null");
  require(reinterpret_cast<uintptr_t>(p) % alignment == 0, ErrorCode::invalid_argument,
          name + " is not " + std::to_string(alignment) +
              "-byte aligned (TMA and vector loads need it)");
  // A host pointer would fault in the kernels (or make no tensor map). The query is not a stream
  // operation; relaxed, it leaves a capture in progress valid.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (e != cudaSuccess) cudaGetLastError();  // not sticky: the layer stays usable
  require(e == cudaSuccess, ErrorCode::invalid_argument,
          name + ": not a pointer the CUDA runtime knows (" + cudaGetErrorString(e) + ")");
  require(a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged,
          ErrorCode::invalid_argument,
          name + " is host memory (" +
              (a.type == cudaMemoryTypeHost ? "pinned" : "pageable, not known to CUDA") +
              "); the kernels read and write device memory");
  // Another GPU's memory would be read over NVLink (peer access) or fault: the kernels run on the
  // current device and their tensor maps name its memory.
  int current = 0;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  require(a.type != cudaMemoryTypeDevice || a.device == current, ErrorCode::invalid_argument,
          name + " is memory of GPU " + std::to_string(a.device) + ", but the layer runs on GPU " +
              std::to_string(current) + " (the current device); the operands must live there");
}

void require_batch_operands(const Config& c, const DeviceBatch& b, const std::string& prefix) {
  try {
    require_token_count(b.tokens, c);
    if (b.tokens == 0) return;
    require_operand(b.x, "x");
    require_operand(b.topk_ids, "topk_ids", 4);
    require_operand(b.topk_weights, "topk_weights", 4);
  } catch (const Error& e) {
    if (prefix.empty()) throw;
    throw Error(e.code(), prefix + e.what());
  }
}

void require_forward_operands(const Config& c, const DeviceBatch& b, const DeviceLayerWeights& wt,
                              const __nv_bfloat16* out) {
  require_batch_operands(c, b);
  if (c.precision == Precision::fp8_block) {
    const Fp8BlockWeights& q = wt.fp8_block;
    const char* hint = " (fp8_block: DeviceLayerWeights::fp8_block, from Fp8BlockExperts)";
    require_operand(q.gate, std::string("fp8_block gate weights") + hint);
    require_operand(q.up, std::string("fp8_block up weights") + hint);
    require_operand(q.down, std::string("fp8_block down weights") + hint);
    require_operand(q.gate_scales, "fp8_block gate scales", 4);
    require_operand(q.up_scales, "fp8_block up scales", 4);
    require_operand(q.down_scales, "fp8_block down scales", 4);
  } else if (c.precision == Precision::nvfp4) {
    const Nvfp4Weights& q = wt.nvfp4;
    const char* hint = " (nvfp4: DeviceLayerWeights::nvfp4, from Nvfp4Experts)";
    require_operand(q.gate, std::string("nvfp4 gate weights") + hint);
    require_operand(q.up, std::string("nvfp4 up weights") + hint);
    require_operand(q.down, std::string("nvfp4 down weights") + hint);
    require_operand(q.gate_factors, "nvfp4 gate factors");
    require_operand(q.up_factors, "nvfp4 up factors");
    require_operand(q.down_factors, "nvfp4 down factors");
    require_operand(q.gate_up_s_dec, "nvfp4 gate and up per-tensor factors", 4);
    require_operand(q.down_s_dec, "nvfp4 down per-tensor factors", 4);
  } else if (c.precision == Precision::mxfp8) {
    const Mxfp8Weights& q = wt.mxfp8;
    const char* hint = " (mxfp8: DeviceLayerWeights::mxfp8, from Mxfp8Experts)";
    require_operand(q.gate, std::string("mxfp8 gate weights") + hint);
    require_operand(q.up, std::string("mxfp8 up weights") + hint);
    require_operand(q.down, std::string("mxfp8 down weights") + hint);
    require_operand(q.gate_factors, "mxfp8 gate factors");
    require_operand(q.up_factors, "mxfp8 up factors");
    require_operand(q.down_factors, "mxfp8 down factors");
  } else {
    require_operand(wt.gate, "gate weights");
    require_operand(wt.up, "up weights");
    require_operand(wt.down, "down weights");
  }
  if (c.shared_width() > 0) {
    require_operand(wt.shared_gate, "shared gate weights");
    require_operand(wt.shared_up, "shared up weights");
    require_operand(wt.shared_down, "shared down weights");
  }
  if (b.tokens > 0) require_operand(out, "out");
}

void set_batch_params(kern::ForwardParams& p, const RankSchedule& s, const Config& c,
                      const DeviceBatch& b, int ep_rank, int* aborted) {
  p.ep_size = c.ep_size;
  p.ep_rank = ep_rank;
  p.peer_x[ep_rank] = b.x;
  p.peer_offsets[ep_rank] = s.sched.offsets;
  p.peer_sorted[ep_rank] = s.sched.sorted;
  const bool owner = s.owner_built;
  p.seg_begin = owner ? s.owner_seg_begin : s.sched.seg_begin;
  p.segment_rows = owner ? s.owner_segment_rows : s.sched.segment_rows;
  p.source_begin = owner ? s.owner_source_begin : s.sched.source_begin;
  p.tile_expert = owner ? s.owner_tile_expert : s.sched.tile_expert;
  p.row_destination = s.row_destination;
  p.status = &s.status()->code;
  p.aborted = aborted;
  p.topk_weights = b.topk_weights;
  p.tokens = b.tokens;
  p.top_k = c.top_k;
  p.hidden = c.hidden;
  p.intermediate = c.intermediate;
  p.shared_width = c.shared_width();
  p.experts = c.experts_per_rank();
  p.routed_block_k = kern::kBlockK;
}

kern::ForwardParams rank_params(const RankBuffers& w, const RankSchedule& s, const Activations& a,
                                const Config& c, const DeviceBatch& b, const DeviceLayerWeights& wt,
                                __nv_bfloat16* out, const ForwardPlan& plan,
                                const ForwardHooks& hooks, int ep_rank, int* aborted) {
  kern::ForwardParams p{};
  set_batch_params(p, s, c, b, ep_rank, aborted);
  p.peer_y_slots[ep_rank] = w.y_slots;
  p.peer_x_rows[ep_rank] = w.x_rows;
  p.routed_x = w.routed_x;
  p.ring_blocks = w.ring_blocks;
  p.act = a.act;
  p.act_shared = a.act_shared;
  p.gate_up = a.gate_up;
  p.gate_up_shared = a.gate_up_shared;
  p.y_slots = w.y_slots;
  p.y_shared = w.y_shared;
  p.out = out;
  if (c.precision == Precision::fp8_block) {
    p.routed_x_e4m3 = w.routed_x_e4m3;
    p.routed_x_scales = w.routed_x_scales;
    p.act_e4m3 = a.act_e4m3 ? a.act_e4m3 : w.act_e4m3;  // a training forward's: its context's
    p.act_scales = a.act_scales ? a.act_scales : w.act_scales;
    p.gate_scales = wt.fp8_block.gate_scales;
    p.up_scales = wt.fp8_block.up_scales;
    p.down_scales = wt.fp8_block.down_scales;
    p.routed_block_k = kern::Fp8BlockKMajor::kBlockK;
    p.fp8_ue8m0 = c.fp8_ue8m0 ? 1 : 0;
  }
  if (c.precision == Precision::nvfp4) {
    p.gate_up_s_dec = wt.nvfp4.gate_up_s_dec;
    p.down_s_dec = wt.nvfp4.down_s_dec;
  }
  p.x_ready = w.counters;
  p.act_ready = p.x_ready + w.capacity_blocks;
  p.act_shared_ready = p.act_ready + w.capacity_blocks;
  p.token_done = p.act_shared_ready + w.token_blocks;
  p.peer_token_done[ep_rank] = p.token_done;
  p.combine_next = p.token_done + c.max_tokens_per_rank;
  p.tile_next = p.combine_next + 1;
  p.fault = w.fault;
  p.dispatch_ctas = plan.dispatch_ctas;
  p.gather_rows = plan.row_path == RowPath::producer_gather ? 1 : 0;
  p.group_blocks = plan.group_blocks;
  p.wait_cycles = plan.wait_cycles;
  p.delay_ns = hooks.dispatch_delay_ns;
  p.delay_seed = hooks.delay_seed + uint32_t(ep_rank);
  p.never_publish_block =
      hooks.stuck_rank < 0 || hooks.stuck_rank == ep_rank ? hooks.never_publish_block : -1;
  p.never_count_tokens =
      hooks.never_count_tokens && (hooks.stuck_rank < 0 || hooks.stuck_rank == ep_rank) ? 1 : 0;
  p.timings = w.timings;
  p.profile_flags = (hooks.without_dispatch_copy ? kern::kProfileNoDispatchCopy : 0) |
                    (hooks.without_combine ? kern::kProfileNoCombine : 0);
  return p;
}

}  // namespace mok::gpu::detail
