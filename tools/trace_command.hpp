// `mok trace`: the in-kernel timeline of one forward or backward (EP = 1 or a group emulated on
// one GPU; BF16, and the fp8_block backward at EP = 1) as a Chrome / Perfetto trace, with each
// role's busy share, its longest idle gap, the consumers' time by tile kind and the overlap of
// row movement with the GEMMs; and its picture as a PNG (drawn by the source tree's
// bench/plot_trace.py, which needs python3 with matplotlib).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cli_options.hpp"

namespace mok::tools {

struct TraceOptions {
  LayerOptions layer;                  // default: qwen3-30b
  std::string direction = "forward";   // or backward (after a training forward)
  std::string out = "mok_trace.json";  // the Chrome trace
  int64_t events = int64_t(1) << 22;   // the timeline's capacity
  uint64_t seed = 0;                   // the inputs' (BenchLayer's inputs_seed)
  int ep = 1;                          // > 1: that many ranks emulated on GPU 0
  std::string png;                     // the picture; empty: beside out, when it can be drawn
};

// The picture `mok trace` draws: path is --png, or the trace's name with .png where
// bench/plot_trace.py and python3 with matplotlib are found; empty with `missing` saying which is
// not (an explicit --png without them is an error). Checked before any GPU work.
struct TracePicture {
  std::string path, missing;
};
TracePicture trace_picture(const TraceOptions& o);

TraceOptions parse_trace_options(const std::vector<std::string>& args);  // UsageError if wrong
extern const char* const kTraceHelp;
int trace_command(const TraceOptions& o);

}  // namespace mok::tools
