// The layer's configuration: shape, expert parallelism, precision, capacity. validate() throws
// mok::Error naming the bad field and its allowed values.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mok/formats.hpp"
#include "mok/schedule/routing_layout.hpp"

namespace mok {

enum class Precision { bf16, fp8_block, mxfp8, nvfp4 };

const char* precision_name(Precision p);
Precision parse_precision(const std::string& name);  // throws with the allowed names

// The most tokens per rank a layer may be configured for (Config::max_tokens_per_rank).
constexpr int kMaxTokensPerRank = 1 << 20;

struct Config {
  int hidden = 0;               // H
  int intermediate = 0;         // I, per routed expert
  int num_experts = 0;          // E, routed experts in the whole EP group
  int top_k = 0;                // K
  int num_shared_experts = 0;   // shared experts; they act as one SwiGLU MLP of width
  int shared_intermediate = 0;  //   num_shared_experts * shared_intermediate
  int max_tokens_per_rank = 0;  // T may be any value in [0, max_tokens_per_rank]
  int ep_size = 1;              // 1, 2, 4 or 8
  int ep_rank = 0;
  Precision precision = Precision::bf16;
  MxScaleRule mx_scale_rule = MxScaleRule::rceil;
  bool fp8_ue8m0 = false;  // fp8_block: every block scale a power of two (UE8M0), else FP32
  int tile_rows = sched::kGpuTileRows;  // routed rows per tile; each expert's segment is padded to
                                        // it (the GPU takes sched::kGpuTileRows only)
  int64_t routed_capacity_rows = 0;     // padded routed rows a rank can hold; 0: the dropless bound
  int64_t ring_rows = 0;                // rows of the token ring; 0: as many as the capacity

  int experts_per_rank() const { return num_experts / ep_size; }
  int shared_width() const { return num_shared_experts * shared_intermediate; }
  // Padded routed rows a rank needs when every routed row of the group lands on it.
  int64_t dropless_capacity_rows() const;
  int64_t capacity_rows() const {
    return routed_capacity_rows > 0 ? routed_capacity_rows : dropless_capacity_rows();
  }
  int64_t effective_ring_rows() const { return ring_rows > 0 ? ring_rows : capacity_rows(); }

  void validate() const;
  std::string describe() const;
};

// Presets of design.md: tiny, dsv3, mok-default, qwen3-30b, fine.
Config preset(const std::string& name);
std::vector<std::string> preset_names();

// FLOPs by design.md's formula, counting real tokens only.
double forward_flops(const Config& c, int64_t tokens_per_rank);
inline double backward_flops(const Config& c, int64_t t) { return 2.0 * forward_flops(c, t); }

}  // namespace mok
