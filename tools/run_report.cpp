#include "run_report.hpp"

#include <cstdio>
#include <vector>

#include "json_report.hpp"

namespace mok::tools {

namespace {

// What the report prints, kept for --json: every check and every throughput number.
struct Check {
  std::string name;
  bool pass;
  double value, bound;  // NaN where the check is bitwise
  std::string detail;
};
struct Measure {
  std::string name;
  double value;
  const char* unit;
};
std::vector<Check> g_checks;
std::vector<Measure> g_measures;

}  // namespace

void report_check(const std::string& label, bool ok, const std::string& detail, double value,
                  double bound) {
  std::printf("  %-40s %s  %s\n", label.c_str(), ok ? "PASS" : "FAIL", detail.c_str());
  g_checks.push_back({label, ok, value, bound, detail});
}

namespace {

// Every number the report printed, with the layer, the machine and the date.
void write_json(const std::string& path, const RunOptions& o, const Config& c, int64_t T,
                int ep_checked, const std::string& device, bool ok) {
  std::string j = "{\n  \"command\": \"mok run\"" + json_machine_fields(device);
  j += ",\n  \"layer\": {\"name\": " + json_string(o.layer.name()) +
       ", \"hidden\": " + std::to_string(c.hidden) +
       ", \"intermediate\": " + std::to_string(c.intermediate) +
       ", \"experts\": " + std::to_string(c.num_experts) +
       ", \"top_k\": " + std::to_string(c.top_k) +
       ", \"shared_width\": " + std::to_string(c.shared_width()) +
       ", \"tokens\": " + std::to_string(T) +
       ", \"precision\": " + json_string(precision_name(c.precision)) +
       ", \"ep_checked\": " + std::to_string(ep_checked) + ", \"seed\": " + std::to_string(o.seed) +
       ", \"routing\": " + json_string(o.layer.routing_name()) + "}";
  j += ",\n  \"checks\": [";
  for (size_t i = 0; i < g_checks.size(); ++i) {
    const Check& k = g_checks[i];
    j += std::string(i ? "," : "") + "\n    {\"name\": " + json_string(k.name) +
         ", \"pass\": " + (k.pass ? "true" : "false") + ", \"value\": " + json_number(k.value) +
         ", \"bound\": " + json_number(k.bound) + ", \"detail\": " + json_string(k.detail) + "}";
  }
  j += "\n  ],\n  \"throughput\": [";
  for (size_t i = 0; i < g_measures.size(); ++i) {
    const Measure& m = g_measures[i];
    j += std::string(i ? "," : "") + "\n    {\"name\": " + json_string(m.name) +
         ", \"value\": " + json_number(m.value) + ", \"unit\": " + json_string(m.unit) + "}";
  }
  j += std::string("\n  ],\n  \"passed\": ") + (ok ? "true" : "false") + "\n}\n";
  write_text_file(path, j, "--json");
}

}  // namespace

void report_measure(const std::string& name, double value, const char* unit) {
  g_measures.push_back({name, value, unit});
}

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

// The summary line and the --json report; the exit code.
int report_finish(const RunOptions& o, const Config& c, int64_t T, int ep_checked,
                  const std::string& device, bool ok) {
  std::printf("\n%s\n", ok ? "mok run: all checks passed" : "mok run: CHECKS FAILED");
  if (!o.json.empty()) {
    write_json(o.json, o, c, T, ep_checked, device, ok);
    std::printf("wrote %s\n", o.json.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace mok::tools
