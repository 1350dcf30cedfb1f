// `mok run`'s report: every check it prints (PASS or FAIL, value and bound) and every throughput
// number, kept for the summary and the --json file.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "mok/config.hpp"
#include "run_command.hpp"

namespace mok::tools {

// Prints one check line and keeps it (value and bound NaN where the check is bitwise).
void report_check(const std::string& label, bool ok, const std::string& detail, double value = NAN,
                  double bound = NAN);
// Keeps one throughput number (the caller prints it).
void report_measure(const std::string& name, double value, const char* unit);
std::string sci(double v);  // "1.23e-04"
// The summary line and the --json report (ep_checked: the simulated group's size, 1 for none);
// returns the exit code.
int report_finish(const RunOptions& o, const Config& c, int64_t T, int ep_checked,
                  const std::string& device, bool ok);

}  // namespace mok::tools
