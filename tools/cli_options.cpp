#include "cli_options.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "mok/error.hpp"

namespace mok::tools {

namespace {
// Messages appended piece by piece: GCC 12 misjudges chains of std::string operator+ (-Wrestrict).
std::string join(std::initializer_list<std::string> parts) {
  std::string s;
  for (const std::string& p : parts) s.append(p);
  return s;
}
}  // namespace

const std::string& option_value(const std::vector<std::string>& args, size_t& i) {
  if (i + 1 >= args.size()) throw UsageError(args[i] + " needs a value");
  return args[++i];
}

int64_t parse_int(const std::string& option, const std::string& text, int64_t lo, int64_t hi) {
  const std::string want = join({option, " ", text, ": expected an integer in [",
                                 std::to_string(lo), ", ", std::to_string(hi), "]"});
  size_t digits = text.size() > 0 && text[0] == '-' ? 1 : 0;
  if (digits == text.size()) throw UsageError(want);
  for (size_t k = digits; k < text.size(); ++k)
    if (text[k] < '0' || text[k] > '9') throw UsageError(want);
  errno = 0;
  const long long v = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v < lo || v > hi) throw UsageError(want);
  return v;
}

double parse_number(const std::string& option, const std::string& text, double lo, double hi) {
  char range[64];
  std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
  const std::string want = join({option, " ", text, ": expected a number in ", range});
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v < lo || v > hi)
    throw UsageError(want);
  return v;
}

std::string parse_choice(const std::string& option, const std::string& text,
                         std::initializer_list<const char*> choices) {
  std::string names;
  for (const char* c : choices) {
    if (text == c) return text;
    names += (names.empty() ? "" : ", ") + std::string(c);
  }
  throw UsageError(join({option, " ", text, ": expected one of ", names}));
}

bool parse_switch(const std::string& option, const std::string& text) {
  if (text == "1" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "no" || text == "off") return false;
  throw UsageError(join({option, " ", text, ": expected 1 or 0 (yes/no, on/off)"}));
}

uint64_t parse_seed(const std::string& option, const std::string& text) {
  return uint64_t(parse_int(option, text, 0, INT64_MAX));
}

bool LayerOptions::take(const std::vector<std::string>& args, size_t& i) {
  const std::string& a = args[i];
  constexpr int64_t kDim = 1 << 20;  // far above any layer; Config::validate has the real rules
  auto dim = [&](int& field, int64_t lo) {
    field = int(parse_int(a, option_value(args, i), lo, kDim));
  };
  if (a == "--preset")
    preset = parse_choice(a, option_value(args, i),
                          {"tiny", "dsv3", "mok-default", "qwen3-30b", "fine"});
  else if (a == "--hidden")
    dim(hidden, 1);
  else if (a == "--intermediate")
    dim(intermediate, 1);
  else if (a == "--experts")
    dim(experts, 1);
  else if (a == "--top-k")
    dim(top_k, 1);
  else if (a == "--shared-experts")
    dim(shared_experts, 0);
  else if (a == "--shared-width")
    dim(shared_width, 0);
  else if (a == "--tokens")
    tokens = parse_int(a, option_value(args, i), 1, kMaxTokensPerRank);
  else if (a == "--precision")
    precision = parse_choice(a, option_value(args, i), {"bf16", "fp8_block", "mxfp8", "nvfp4"});
  else if (a == "--fp8-scales")
    fp8_scales = parse_choice(a, option_value(args, i), {"fp32", "ue8m0"});
  else if (a == "--routing")
    routing = parse_choice(a, option_value(args, i), {"random", "balanced", "skewed"});
  else if (a == "--zipf")
    zipf = parse_number(a, option_value(args, i), 0.0, 8.0);
  else
    return false;
  return true;
}

bool LayerOptions::has_numbers() const {
  return hidden > 0 || intermediate > 0 || experts > 0 || top_k > 0 || shared_experts >= 0 ||
         shared_width >= 0;
}

Config LayerOptions::config() const {
  Config c;
  if (!preset.empty()) {
    c = mok::preset(preset);
  } else {
    const std::pair<int, const char*> numbers[] = {{hidden, "--hidden"},
                                                   {intermediate, "--intermediate"},
                                                   {experts, "--experts"},
                                                   {top_k, "--top-k"}};
    std::string missing;
    for (const auto& [value, option] : numbers)
      if (value < 0) missing.append(missing.empty() ? "" : ", ").append(option);
    if (!missing.empty())  // every command gives a preset when no number is given
      throw UsageError(join({"a layer by its numbers needs ", missing, " too (or --preset NAME)"}));
    c.num_shared_experts = 0;
    c.shared_intermediate = 0;
    c.max_tokens_per_rank = 4096;
  }
  if (hidden > 0) c.hidden = hidden;
  if (intermediate > 0) c.intermediate = intermediate;
  if (experts > 0) c.num_experts = experts;
  if (top_k > 0) c.top_k = top_k;
  if (shared_experts >= 0) c.num_shared_experts = shared_experts;
  if (shared_width >= 0) c.shared_intermediate = shared_width;
  if (c.num_shared_experts > 0 && c.shared_intermediate == 0)
    c.shared_intermediate = c.intermediate;
  if (c.num_shared_experts == 0 && shared_width > 0)
    throw UsageError(join({"--shared-width ", std::to_string(shared_width),
                           ": the layer has no shared expert (add --shared-experts N)"}));
  if (c.num_shared_experts == 0) c.shared_intermediate = 0;
  if (tokens > 0) c.max_tokens_per_rank = int(tokens);
  c.precision = parse_precision(precision);
  if (fp8_scales != "fp32" && c.precision != Precision::fp8_block)
    throw UsageError("--fp8-scales " + fp8_scales + ": fp8_block's option (--precision fp8_block)");
  c.fp8_ue8m0 = fp8_scales == "ue8m0";
  try {
    c.validate();
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  return c;
}

std::string LayerOptions::name() const {
  if (!preset.empty() && !has_numbers()) return preset;
  const Config c = config();
  std::string s = join({std::to_string(c.hidden), "x", std::to_string(c.intermediate), "x",
                        std::to_string(c.num_experts), "/", std::to_string(c.top_k)});
  if (c.shared_width()) s.append("+").append(std::to_string(c.shared_width()));
  return s;
}

RoutingChoice LayerOptions::routing_choice() const {
  if (zipf >= 0 && routing != "skewed")
    throw UsageError(join({"--zipf applies to --routing skewed (the routing is ", routing, ")"}));
  RoutingChoice r;
  r.kind = routing == "balanced" ? RoutingKind::balanced
           : routing == "skewed" ? RoutingKind::skewed
                                 : RoutingKind::random;
  if (zipf >= 0) r.zipf = zipf;
  return r;
}

std::string LayerOptions::routing_name() const {
  const RoutingChoice r = routing_choice();
  if (r.kind != RoutingKind::skewed) return routing;
  char buf[48];
  std::snprintf(buf, sizeof buf, "skewed (zipf %.2f)", r.zipf);
  return buf;
}

std::string LayerOptions::help(const char* precisions, const char* default_preset) {
  const std::string heading =
      std::string("  the layer") +
      (*default_preset ? std::string(" (default: --preset ") + default_preset + ")" : "") +
      ", by preset or by its numbers (they override the preset's):\n";
  return heading +
         "    --preset NAME            tiny, dsv3, mok-default, qwen3-30b, fine\n"
         "    --hidden H               model width (a multiple of 64)\n"
         "    --intermediate I         routed expert width (a multiple of 64)\n"
         "    --experts E              routed experts\n"
         "    --top-k K                experts per token\n"
         "    --shared-experts N       shared experts (default 0 without a preset)\n"
         "    --shared-width S         each shared expert's width (default: I)\n"
         "    --tokens T               tokens per rank, up to " +
         std::to_string(kMaxTokensPerRank) +
         " (default: the preset's, else\n"
         "                             4096)\n"
         "    --precision P            " +
         precisions +
         "\n"
         "    --fp8-scales S           fp8_block's block scales: fp32 (default) or ue8m0 (powers\n"
         "                             of two)\n"
         "  the tokens' routing:\n"
         "    --routing R              random (default: softmax top-k of random logits), balanced\n"
         "                             (slot (t, k) to expert (t K + k) mod E) or skewed (Zipf-\n"
         "                             like: the expert of popularity rank r drawn with\n"
         "                             probability ~ (r + 1)^-zipf, K distinct per token)\n"
         "    --zipf S                 skewed's exponent, 0 (uniform) to 8 (default 1)\n";
}

}  // namespace mok::tools
