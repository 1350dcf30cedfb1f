// What the megakernel engine shares with the host, whatever tile program it runs: fault records,
// the timing slots its own roles fill and the timeline's roles.
#pragma once
#include <cstdint>

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
  kEngineTimes = 7,
};

// A role's piece of work as one event: [start, end] from the global timer, the role, the rank,
// the SM and what it worked on (a tile, a dispatch CTA, a combine warp). trace[0] counts the
// events claimed; event i is trace[1 + 3i ..]; those past the capacity are counted, not written.
// (Host and device: the recorder is waits.cuh's trace_event, the reader LayerRunner::trace.)
enum TraceRole : uint32_t {
  kTraceProducer,   // a GEMM tile's loads issued (its claim to its last k-block)
  kTraceConsumer0,  // a GEMM tile's mainloop and epilogue, consumer warpgroup 0
  kTraceConsumer1,  //   ... warpgroup 1
  kTraceDispatch,   // a dispatch CTA's rows (its whole dispatch)
  kTraceCombine,    // a combine warp's tokens (its first claim to the empty queue)
  kTraceRoles
};

}  // namespace mok::kern
