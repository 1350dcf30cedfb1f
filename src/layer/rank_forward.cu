#include "layer/rank_forward.hpp"

#include <algorithm>

#include "mok/device/tensor_map.hpp"

namespace mok::gpu::detail {

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
    case kern::kRoleDispatchPacing:
      return "dispatch waiting for the GEMMs to reach the tiles before row block";
    case kern::kRoleProducerRing:
      return "a producer waiting for a free ring stage, at tile";
    default:
      return "an unknown role";
  }
}

void RankBuffers::allocate(const Config& c, bool with_timings) {
  const char* what = "cudaMalloc (forward workspace)";
  const int64_t H = c.hidden, I = c.intermediate, S = c.shared_width(), K = c.top_k,
                max_t = c.max_tokens_per_rank, El = c.experts_per_rank();
  sched.allocate(c);
  capacity_blocks = sched.capacity / kTileRows;
  token_blocks = sched.token_rows / kTileRows;
  ring_blocks = std::clamp<int64_t>(c.effective_ring_rows() / kTileRows, 1, capacity_blocks);
  if (c.ep_size > 1) {
    owner_seg_begin = device_alloc<int64_t>(size_t(El + 1), what);
    owner_segment_rows = device_alloc<int64_t>(size_t(El), what);
    owner_source_begin = device_alloc<int64_t>(size_t(El * (c.ep_size + 1)), what);
    owner_tile_expert = device_alloc<int32_t>(size_t(capacity_blocks), what);
    group_status = device_alloc<Status>(1, what);
  }
  routed_x = device_alloc<__nv_bfloat16>(size_t(ring_blocks * kTileRows * H), what);
  act = device_alloc<__nv_bfloat16>(size_t(sched.capacity * I), what);
  act_shared = S ? device_alloc<__nv_bfloat16>(size_t(sched.token_rows * S), what) : nullptr;
  y_slots = device_alloc<__nv_bfloat16>(size_t(max_t * K * H), what);
  y_shared = S ? device_alloc<__nv_bfloat16>(size_t(max_t * H), what) : nullptr;
  counter_words = size_t(2 * capacity_blocks + token_blocks + max_t + 2);
  counters = device_alloc<uint32_t>(counter_words, what);
  fault = device_alloc<kern::ForwardFault>(1, what);
  timings = with_timings ? device_alloc<unsigned long long>(kern::kForwardTimings, what) : nullptr;
  routed_x_map = dev::make_bf16_map_2d(routed_x, uint64_t(ring_blocks * kTileRows), uint64_t(H),
                                       uint64_t(H), kTileRows);
  act_map =
      dev::make_bf16_map_2d(act, uint64_t(sched.capacity), uint64_t(I), uint64_t(I), kTileRows);
  act_shared_map = S ? dev::make_bf16_map_2d(act_shared, uint64_t(sched.token_rows), uint64_t(S),
                                             uint64_t(S), kTileRows)
                     : act_map;
}

void RankBuffers::release() {
  sched.release();
  for (void* p : {(void*)owner_seg_begin, (void*)owner_segment_rows, (void*)owner_source_begin,
                  (void*)owner_tile_expert, (void*)group_status, (void*)routed_x, (void*)act,
                  (void*)act_shared, (void*)y_slots, (void*)y_shared, (void*)counters, (void*)fault,
                  (void*)timings})
    cudaFree(p);
  *this = RankBuffers{};
}

void RankBuffers::reset(cudaStream_t stream) const {
  check_cuda(cudaMemsetAsync(counters, 0, counter_words * sizeof(uint32_t), stream),
             "cudaMemsetAsync");
  check_cuda(cudaMemsetAsync(fault, 0, sizeof(kern::ForwardFault), stream), "cudaMemsetAsync");
  if (timings)
    check_cuda(
        cudaMemsetAsync(timings, 0, kern::kForwardTimings * sizeof(unsigned long long), stream),
        "cudaMemsetAsync");
}

kern::ForwardMaps rank_maps(const RankBuffers& w, const Config& c, const DeviceBatch& b,
                            const DeviceLayerWeights& wt, int block_n) {
  const uint64_t H = uint64_t(c.hidden), I = uint64_t(c.intermediate),
                 S = uint64_t(c.shared_width()), El = uint64_t(c.experts_per_rank());
  const uint32_t bn = uint32_t(block_n);
  kern::ForwardMaps maps;
  maps.routed_x = w.routed_x_map;
  maps.act = w.act_map;
  maps.act_shared = w.act_shared_map;
  maps.x = b.tokens > 0 ? dev::make_bf16_map_2d(b.x, uint64_t(b.tokens), H, H, kTileRows)
                        : w.routed_x_map;
  maps.gate = dev::make_bf16_map_3d(wt.gate, El, I, H, bn / 2);
  maps.up = dev::make_bf16_map_3d(wt.up, El, I, H, bn / 2);
  maps.down = dev::make_bf16_map_3d(wt.down, El, H, I, bn);
  if (S > 0) {
    maps.shared_gate = dev::make_bf16_map_3d(wt.shared_gate, 1, S, H, bn / 2);
    maps.shared_up = dev::make_bf16_map_3d(wt.shared_up, 1, S, H, bn / 2);
    maps.shared_down = dev::make_bf16_map_3d(wt.shared_down, 1, H, S, bn);
  } else {
    maps.shared_gate = maps.shared_up = maps.gate;
    maps.shared_down = maps.down;
  }
  return maps;
}

kern::ForwardParams rank_params(const RankBuffers& w, const Config& c, const DeviceBatch& b,
                                __nv_bfloat16* out, const RankLaunchOptions& o) {
  const ForwardOptions& fo = *o.options;
  kern::ForwardParams p{};
  p.ep_size = c.ep_size;
  p.ep_rank = o.ep_rank;
  p.peer_x[o.ep_rank] = b.x;
  p.peer_offsets[o.ep_rank] = w.sched.offsets;
  p.peer_sorted[o.ep_rank] = w.sched.sorted;
  p.peer_y_slots[o.ep_rank] = w.y_slots;
  p.peer_token_done[o.ep_rank] = w.counters + 2 * w.capacity_blocks + w.token_blocks;
  const bool owner_tables = c.ep_size > 1;
  p.seg_begin = owner_tables ? w.owner_seg_begin : w.sched.seg_begin;
  p.segment_rows = owner_tables ? w.owner_segment_rows : w.sched.segment_rows;
  p.source_begin = owner_tables ? w.owner_source_begin : w.sched.source_begin;
  p.tile_expert = owner_tables ? w.owner_tile_expert : w.sched.tile_expert;
  p.status = owner_tables ? &w.group_status->code : &w.sched.status->code;
  p.aborted = o.aborted;
  p.topk_weights = b.topk_weights;
  p.tokens = b.tokens;
  p.top_k = c.top_k;
  p.hidden = c.hidden;
  p.intermediate = c.intermediate;
  p.shared_width = c.shared_width();
  p.experts = c.experts_per_rank();
  p.routed_x = w.routed_x;
  p.ring_blocks = w.ring_blocks;
  p.act = w.act;
  p.act_shared = w.act_shared;
  p.y_slots = w.y_slots;
  p.y_shared = w.y_shared;
  p.out = out;
  p.x_ready = w.counters;
  p.act_ready = p.x_ready + w.capacity_blocks;
  p.act_shared_ready = p.act_ready + w.capacity_blocks;
  p.token_done = p.act_shared_ready + w.token_blocks;
  p.combine_next = p.token_done + c.max_tokens_per_rank;
  p.tile_next = p.combine_next + 1;
  p.fault = w.fault;
  p.dispatch_ctas = o.dispatch_ctas;
  p.dispatch_lookahead = o.dispatch_lookahead;
  p.wait_cycles = o.wait_cycles;
  p.delay_ns = fo.dispatch_delay_ns;
  p.delay_seed = fo.delay_seed + uint32_t(o.ep_rank);
  p.never_publish_block = fo.never_publish_block;
  p.timings = w.timings;
  p.profile_flags = (fo.profile_without_dispatch_copy ? kern::kProfileNoDispatchCopy : 0) |
                    (fo.profile_without_combine ? kern::kProfileNoCombine : 0);
  return p;
}

}  // namespace mok::gpu::detail
