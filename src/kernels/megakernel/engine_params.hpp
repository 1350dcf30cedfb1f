// What the megakernel engine shares with the host, whatever tile program it runs: fault records,
// the timing slots its own roles fill and the timeline's roles.
#pragma once
#include <cstdint>

#include "mok/common/host_device.hpp"

namespace mok::kern {

// The first bounded wait of a role that gave up: whether any did, on which CTA, waiting for what
// (a program-specific index: a row block, a tile, a token; -1: the tile queue).
struct FaultRecord {
  int seen, cta;
  long long what;
};

// Where the engine's roles' time goes (benchmarks): nanoseconds summed over every producer or
// consumer warpgroup, one atomic add per participant at its end. A program's own slots follow
// from kEngineTimes.
enum EngineTiming : int {
  kTimeProducerWaitsRing = 0,     // producers waiting for a free stage (the consumers are busy)
  kTimeConsumerWaitsLoads = 1,    // consumer warpgroups waiting for stages to land (starved)
  kTimeConsumerStarvedFirst = 2,  // part of kTimeConsumerWaitsLoads: on a tile's first stage
  kTimeConsumerEpilogue = 3,      // consumer warpgroups storing and publishing tiles
  kTimeConsumerWaitsTile = 4,     // consumer warpgroups waiting for the next tile's index
  kTimeConsumerTotal = 5,         // consumer warpgroups from their first tile to their last
  kTimeConsumerCycles = 6,        // SM clock cycles (clock64), not ns, over kTimeConsumerTotal's
  // Programs that widen B tiles (the first converter warp of each CTA; the leader):
  kTimeLeaderWaitsStaging = 7,   // the leader waiting for a free staging slot (converters busy)
  kTimeConverterWaitsRing = 8,   // a converter warp waiting for a free ring stage
  kTimeConverterWaitsCodes = 9,  //   ... waiting for a staging slot's codes to land
  kTimeConverterWidening = 10,   //   ... widening
  kEngineTimes = 11,
};

// A role's piece of work as one event: [start, end] from the global timer, the role, the rank,
// the SM, what it worked on (a tile, a dispatch CTA, a combine warp's token count) and, for GEMM
// tiles, the program's kind of tile (the forward's TileKind, the backward's BackwardKind).
// trace[0] counts the events claimed; event i is trace[1 + 3i ..] = {start, end,
// trace_tag(...)}; those past the capacity are counted, not written. The recorder is waits.cuh's
// trace_event, the reader TraceBuffer::read (src/layer/trace_buffer.hpp).
enum TraceRole : uint32_t {
  kTraceProducer,   // a GEMM tile's loads issued (its claim to its last k-block)
  kTraceConsumer0,  // a GEMM tile's mainloop and epilogue, consumer warpgroup 0
  kTraceConsumer1,  //   ... warpgroup 1
  kTraceDispatch,   // a dispatch CTA's rows (its whole dispatch)
  kTraceCombine,    // a combine warp's tokens (its first claim to the empty queue)
  kTraceStore,      // the backward's store warp: one staged weight-gradient tile's TMA stores
  kTraceRoles
};
constexpr int kTraceWords = 3;  // per event
struct TraceEvent {
  uint64_t start_ns = 0, end_ns = 0;
  int role = 0, rank = 0, sm = 0, kind = 0;
  int64_t what = 0;
};
// role 8 bits | rank 8 | kind 8 | SM 8 (Hopper has 132) | what 32
MOK_HD uint64_t trace_tag(uint32_t role, int rank, uint32_t sm, int64_t what, int kind = 0) {
  return uint64_t(role) << 56 | uint64_t(uint32_t(rank) & 0xFFu) << 48 |
         uint64_t(uint32_t(kind) & 0xFFu) << 40 | uint64_t(sm & 0xFFu) << 32 | uint32_t(what);
}
MOK_HD TraceEvent trace_event_at(const unsigned long long* event) {
  const uint64_t tag = event[2];
  return {event[0],
          event[1],
          int(tag >> 56),
          int((tag >> 48) & 0xFF),
          int((tag >> 32) & 0xFF),
          int((tag >> 40) & 0xFF),
          int64_t(uint32_t(tag))};
}

}  // namespace mok::kern
