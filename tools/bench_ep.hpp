// `mok bench --ep N` (see bench_ep.cpp).
#pragma once
#include "bench_command.hpp"

namespace mok::tools {

int bench_ep_command(const BenchOptions& o);

}  // namespace mok::tools
