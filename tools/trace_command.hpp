// `mok trace`: the in-kernel timeline of one forward or backward (EP = 1, BF16) as a Chrome /
// Perfetto trace, with each role's busy share, its longest idle gap, the consumers' time by tile
// kind and the overlap of row movement with the GEMMs; and its picture as a PNG (drawn by the
// source tree's bench/plot_trace.py, which needs python3 with matplotlib).
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
  std::string png;                     // the picture; empty: beside out, when it can be drawn
};

// The PNG `mok trace` draws for `o`: --png, or the trace's name with .png, where python3 with
// matplotlib and bench/plot_trace.py are found; empty when they are not and --png was not given
// (an explicit --png without them is an error). Checked before any GPU work.
std::string trace_png_path(const TraceOptions& o);

TraceOptions parse_trace_options(const std::vector<std::string>& args);  // UsageError if wrong
extern const char* const kTraceHelp;
int trace_command(const TraceOptions& o);

}  // namespace mok::tools
