#include "mok/config.hpp"

#include <string>

#include "mok/error.hpp"

namespace mok {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_config:
      return "invalid config";
    case ErrorCode::invalid_argument:
      return "invalid argument";
    case ErrorCode::capacity_exceeded:
      return "capacity exceeded";
    case ErrorCode::peer_timeout:
      return "peer timeout";
    case ErrorCode::peer_failed:
      return "peer failed";
    case ErrorCode::unsupported:
      return "unsupported";
  }
  return "error";
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::bf16:
      return "bf16";
    case Precision::fp8_block:
      return "fp8_block";
    case Precision::mxfp8:
      return "mxfp8";
    case Precision::nvfp4:
      return "nvfp4";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  for (Precision p : {Precision::bf16, Precision::fp8_block, Precision::mxfp8, Precision::nvfp4})
    if (name == precision_name(p)) return p;
  throw Error(ErrorCode::invalid_config,
              "precision '" + name + "' is unknown (allowed: bf16, fp8_block, mxfp8, nvfp4)");
}

int64_t Config::dropless_capacity_rows() const {
  const int64_t group_rows = int64_t(ep_size) * max_tokens_per_rank * top_k;
  return group_rows + int64_t(experts_per_rank()) * (tile_rows - 1);
}

namespace {
[[noreturn]] void bad(const std::string& field, const std::string& value, const std::string& rule) {
  throw Error(ErrorCode::invalid_config, field + " = " + value + " is not allowed: " + rule);
}
template <class T>
std::string str(T v) {
  return std::to_string(v);
}
}  // namespace

void Config::validate() const {
  if (hidden <= 0 || hidden % 64 != 0) bad("hidden", str(hidden), "a positive multiple of 64");
  if (intermediate <= 0 || intermediate % 64 != 0)
    bad("intermediate", str(intermediate), "a positive multiple of 64");
  if (num_experts < 1 || num_experts > 512) bad("num_experts", str(num_experts), "in [1, 512]");
  if (top_k < 1 || top_k > 16 || top_k > num_experts)
    bad("top_k", str(top_k), "in [1, min(16, num_experts = " + str(num_experts) + ")]");
  if (num_shared_experts < 0 || num_shared_experts > 8)
    bad("num_shared_experts", str(num_shared_experts), "in [0, 8]");
  if (num_shared_experts > 0 && (shared_intermediate <= 0 || shared_intermediate % 64 != 0))
    bad("shared_intermediate", str(shared_intermediate),
        "a positive multiple of 64 when num_shared_experts > 0");
  if (max_tokens_per_rank < 0 || max_tokens_per_rank > kMaxTokensPerRank)
    bad("max_tokens_per_rank", str(max_tokens_per_rank), "in [0, " + str(kMaxTokensPerRank) + "]");
  if (ep_size != 1 && ep_size != 2 && ep_size != 4 && ep_size != 8)
    bad("ep_size", str(ep_size), "one of 1, 2, 4, 8");
  if (num_experts % ep_size != 0)
    bad("num_experts", str(num_experts), "a multiple of ep_size = " + str(ep_size));
  if (ep_rank < 0 || ep_rank >= ep_size)
    bad("ep_rank", str(ep_rank), "in [0, ep_size = " + str(ep_size) + ")");
  if (tile_rows != 64 && tile_rows != 128 && tile_rows != 256)
    bad("tile_rows", str(tile_rows), "one of 64, 128, 256");
  if (routed_capacity_rows < 0 || routed_capacity_rows % tile_rows != 0)
    bad("routed_capacity_rows", str(routed_capacity_rows),
        "0 (the dropless bound) or a positive multiple of tile_rows = " + str(tile_rows));
  if (ring_rows < 0 || ring_rows % tile_rows != 0)
    bad("ring_rows", str(ring_rows),
        "0 (as large as the capacity) or a positive multiple of tile_rows = " + str(tile_rows));
}

std::string Config::describe() const {
  using std::to_string;
  return "H=" + to_string(hidden) + " I=" + to_string(intermediate) +
         " E=" + to_string(num_experts) + " K=" + to_string(top_k) +
         " shared=" + to_string(num_shared_experts) + "x" + to_string(shared_intermediate) +
         " T<=" + to_string(max_tokens_per_rank) + " EP=" + to_string(ep_size) +
         " precision=" + precision_name(precision) +
         (precision == Precision::fp8_block && fp8_ue8m0 ? " (ue8m0 scales)" : "");
}

namespace {
struct NamedPreset {
  const char* name;
  int h, i, e, k, shared, shared_i, tokens;
};
constexpr NamedPreset kPresets[] = {
    {"tiny", 256, 128, 16, 4, 1, 128, 512},
    {"dsv3", 7168, 2048, 256, 8, 1, 2048, 4096},
    {"mok-default", 7168, 3072, 384, 6, 1, 3072, 2048},
    {"qwen3-30b", 2048, 768, 128, 8, 0, 0, 8192},
    {"fine", 2048, 512, 512, 10, 1, 512, 4096},
};
}  // namespace

Config preset(const std::string& name) {
  std::string names;
  for (const NamedPreset& p : kPresets) {
    if (name == p.name) {
      Config c;
      c.hidden = p.h;
      c.intermediate = p.i;
      c.num_experts = p.e;
      c.top_k = p.k;
      c.num_shared_experts = p.shared;
      c.shared_intermediate = p.shared_i;
      c.max_tokens_per_rank = p.tokens;
      return c;
    }
    names += (names.empty() ? "" : ", ") + std::string(p.name);
  }
  throw Error(ErrorCode::invalid_config,
              "preset '" + name + "' is unknown (allowed: " + names + ")");
}

std::vector<std::string> preset_names() {
  std::vector<std::string> v;
  for (const NamedPreset& p : kPresets) v.emplace_back(p.name);
  return v;
}

double forward_flops(const Config& c, int64_t t) {
  return 6.0 * c.hidden * double(c.intermediate) * double(t * c.top_k) +
         6.0 * c.hidden * double(c.shared_width()) * double(t);
}

}  // namespace mok
