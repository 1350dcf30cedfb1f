#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_options.hpp"

namespace mok::tools {

struct RunOptions {
  LayerOptions layer;
  int ep = 4;
  uint64_t seed = 1;
  std::string json;  // --json FILE: the report as JSON too
};

RunOptions parse_run_options(const std::vector<std::string>& args);  // UsageError if wrong
extern const char* const kRunHelp;
int run_command(const RunOptions& o);

// The machine fields of a --json report (",\n  \"date\": ..." through the clocks): the date,
// mok's version, the commit at build time, CUDA, the device (device, or the first GPU), its peak
// SM clock, and the clocks it ran at while timed (clock_sampler.hpp).
std::string json_machine_fields(const std::string& device = "");

}  // namespace mok::tools
