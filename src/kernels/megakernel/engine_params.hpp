// What the megakernel engine shares with the host, whatever tile program it runs: fault records
// and the timing slots its own roles fill.
#pragma once

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

}  // namespace mok::kern
