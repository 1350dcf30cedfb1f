// The engine's bounded waits, fault records, role timers and timeline events, which every role
// uses (the row movers too, without the GEMM pipeline). Params provide aborted, wait_cycles,
// fault->records, timings and trace.
#pragma once
#include <cstdint>

#include "kernels/megakernel/engine_params.hpp"
#include "mok/device/sync.cuh"

namespace mok::kern {

// ---- Bounded waits and faults (Params: aborted, wait_cycles, fault->records)

// A bounded wait that also gives up as soon as another wait has expired.
template <class P, class Ready>
__device__ __forceinline__ bool wait_unless_aborted(const P& p, Ready ready) {
  const volatile int* aborted = p.aborted;
  return dev::spin_until([&] { return ready() || *aborted != 0; }, p.wait_cycles) && ready();
}

// A wait of `role` gave up (its own bound expired, or another one's did): keep the first record of
// each role, and stop every other wait.
template <class P>
__device__ __forceinline__ void record_fault(const P& p, int role, long long what) {
  FaultRecord& r = p.fault->records[role];
  if (atomicCAS(&r.seen, 0, 1) == 0) {
    r.cta = int(blockIdx.x);
    r.what = what;
  }
  atomicExch(p.aborted, 1);
}

// ---- Role timers (Params: timings, [kSlots] or nullptr)

// A participant's sums, added to the totals once at its end.
template <int kSlots>
struct RoleTimer {
  bool on;
  uint64_t sums[kSlots] = {};
  template <class P>
  __device__ explicit RoleTimer(const P& p) : on(p.timings != nullptr) {}
  __device__ uint64_t now() const { return on ? dev::global_ns() : 0; }
  // `what` may be a run-time value (a tile's slot): the unrolled compare keeps sums in registers,
  // where indexing them would put them in local memory.
  __device__ void add(int what, uint64_t since) {
    if (!on) return;
    const uint64_t ns = dev::global_ns() - since;
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (i == what) sums[i] += ns;
  }
  template <class P>
  __device__ void flush(const P& p) const {
    if (!on) return;
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (sums[i]) atomicAdd(p.timings + i, static_cast<unsigned long long>(sums[i]));
  }
};

// ---- The timeline (Params: trace, trace_capacity; `mok trace`)

// Compiled only into the timeline's own instantiations (kTrace: forward_params.hpp's
// kProbeTrace), so the production kernels carry none of it. A role's start time waits in shared
// memory, one slot per participant: kTraceProducer, kTraceConsumer0 + warpgroup, kTraceDispatch,
// kTraceCombine + consumer warp, kTraceStoreSlot.
constexpr int kTraceStoreSlot = kTraceCombine + 8, kTraceSlots = kTraceStoreSlot + 1;
__device__ __forceinline__ uint64_t* trace_slots() {
  __shared__ uint64_t slots[kTraceSlots];
  return slots;
}
template <bool kTrace>
__device__ __forceinline__ void trace_start(int slot) {
  if constexpr (kTrace) trace_slots()[slot] = dev::global_ns();
}
template <bool kTrace, class P>
__device__ __forceinline__ void trace_event(const P& p, uint32_t role, int64_t what, int slot,
                                            int kind = 0) {
  if constexpr (kTrace) {
    if (p.trace == nullptr) return;  // a timeline kernel launched without a buffer
    const uint64_t end = dev::global_ns();
    const unsigned long long i = atomicAdd(p.trace, 1ull);
    if (i >= static_cast<unsigned long long>(p.trace_capacity)) return;
    unsigned long long* e = p.trace + 1 + kTraceWords * i;
    e[0] = trace_slots()[slot];
    e[1] = end;
    e[2] = trace_tag(role, p.ep_rank, dev::sm_id(), what, kind);
  }
}

}  // namespace mok::kern
