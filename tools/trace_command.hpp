// `mok trace`: the in-kernel timeline of one forward or backward (EP = 1, BF16) as a Chrome /
// Perfetto trace, with each role's busy share, its longest idle gap, the consumers' time by tile
// kind and the overlap of row movement with the GEMMs; bench/plot_trace.py draws it as a PNG.
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
};

TraceOptions parse_trace_options(const std::vector<std::string>& args);  // UsageError if wrong
extern const char* const kTraceHelp;
int trace_command(const TraceOptions& o);

}  // namespace mok::tools
