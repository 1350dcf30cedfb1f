// What `mok run` and `mok bench` share on their command lines: strict values (a number is all
// digits and in range, a choice is one of its names; the error names the option, the value as
// given and what is allowed) and the layer by preset or by its numbers.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "layer_data.hpp"
#include "mok/config.hpp"

namespace mok::tools {

// A command-line mistake: one line, exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An integer in [lo, hi] spelled in decimal digits (a leading '-' only when lo < 0).
int64_t parse_int(const std::string& option, const std::string& text, int64_t lo, int64_t hi);
// A finite number in [lo, hi].
double parse_number(const std::string& option, const std::string& text, double lo, double hi);
// One of `choices`.
std::string parse_choice(const std::string& option, const std::string& text,
                         std::initializer_list<const char*> choices);
// 1/yes/on or 0/no/off.
bool parse_switch(const std::string& option, const std::string& text);
// A random seed, in [0, 2^63 - 1] for every command.
uint64_t parse_seed(const std::string& option, const std::string& text);

// The layer: a preset, its fields overridden by the numbers given, or (no preset) the numbers
// alone (hidden, intermediate, experts and top-k required; no shared expert unless given).
struct LayerOptions {
  std::string preset;  // empty: the numbers alone
  int hidden = -1, intermediate = -1, experts = -1, top_k = -1;
  int shared_experts = -1, shared_width = -1;
  int64_t tokens = -1;  // tokens per rank; -1: the preset's
  std::string precision = "bf16";
  std::string fp8_scales = "fp32";  // fp8_block's block scales: fp32 or ue8m0 (powers of two)
  std::string routing = "random";   // random, balanced or skewed (RoutingChoice)
  double zipf = -1;                 // skewed's exponent; -1: not given (1.0)

  // Takes args[i] (and its value, args[i + 1]) when it is a layer option; false otherwise.
  bool take(const std::vector<std::string>& args, size_t& i);
  bool has_numbers() const;
  // The validated configuration (UsageError naming the field otherwise) and its name for tables.
  Config config() const;
  std::string name() const;  // the preset's, or "HxIxE/K" for numbers
  // The tokens' routing (UsageError for --zipf without --routing skewed), and its name.
  RoutingChoice routing_choice() const;
  std::string routing_name() const;
  // The lines of these options for a command's --help: `precisions` those the command takes,
  // `default_preset` the layer it runs without one ("": none).
  static constexpr const char* kAllPrecisions = "bf16 (default), fp8_block, mxfp8, nvfp4";
  static std::string help(const char* precisions = kAllPrecisions, const char* default_preset = "");
};

// The value of option args[i]: args[i + 1] (UsageError when missing); advances i.
const std::string& option_value(const std::vector<std::string>& args, size_t& i);

}  // namespace mok::tools
