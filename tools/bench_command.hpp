#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cli_options.hpp"

namespace mok::tools {

struct BenchOptions {
  bool all_shapes = true;  // every standard shape of design.md (--preset all, or no layer given)
  LayerOptions layer;      // else this one (a preset or the numbers)
  int iterations = 20;
  // Also time the other row path, the copy path without its copy, no combine, the schedule alone.
  bool breakdown = false;
  // Also time the megakernel without its GEMM loads, without its MMAs, and without both.
  bool stage_probes = false;
  std::string row_path = "auto";  // auto, copy (dispatch CTAs) or gather (GEMM producers)
  int ep = 1;                     // > 1: the expert-parallel forward (bench_ep.cpp)
  int dispatch_ctas = 0;          // 0: the megakernel's default
  int64_t overlap_rows = 0;       // routed rows per tile group; 0: the megakernel's default
  int64_t ring_rows = 0;          // token ring rows (Config::ring_rows); 0: the capacity
  bool graph = false;  // time mok's forward as a CUDA graph replay (no host work inside the span)
  // forward (default), or backward: the training forward, the backward (BF16 and FP32 weight
  // gradients) and the whole step, as CUDA graph replays (bench_backward.cpp).
  std::string direction = "forward";
  int block_n = 0;             // the GEMM tile width (0: automatic)
  double sustain_seconds = 0;  // > 0: each shape's forward, its cuBLAS pipeline and the dense
                               // GEMM also run back to back this long (EP = 1; for nvidia-smi)
  int sweep = 0;      // > 0: that many random shapes (sweep_shapes.hpp) instead of the presets
  uint64_t seed = 1;  // --sweep's shapes
  int sweep_first = 0, sweep_last = -1;  // --shapes A-B: only shapes A..B of the sweep (-1: all)
  // --seed without --sweep: the inputs' (weights, x, routing); 0 draws them as always.
  uint64_t inputs_seed = 0;
  std::string json;          // --json FILE: every printed table as JSON too, with the machine
  std::string command_line;  // as typed, for the JSON
};

// mok bench with --json: runs bench_command, keeps what it prints, writes the JSON.
int bench_command_with_json(const BenchOptions& o);

BenchOptions parse_bench_options(const std::vector<std::string>& args);  // UsageError if wrong
extern const char* const kBenchHelp;
int bench_command(const BenchOptions& o);
int bench_backward_command(const BenchOptions& o);
int bench_precision_command(const BenchOptions& o);  // --precision other than bf16

}  // namespace mok::tools
