#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace mok::tools {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RunOptions {
  std::string preset;
  std::string precision = "bf16";
  int64_t tokens = -1;  // -1: the preset's
  int ep = 4;
  uint64_t seed = 1;
};

RunOptions parse_run_options(const std::vector<std::string>& args);
int run_command(const RunOptions& o);

}  // namespace mok::tools
