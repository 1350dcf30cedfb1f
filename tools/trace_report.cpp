#include "trace_report.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "json_report.hpp"

namespace mok::tools {

const char* const kTraceRoleNames[kern::kTraceRoles] = {"producer", "consumer 0", "consumer 1",
                                                        "dispatch", "combine",    "store"};
const std::vector<std::string> kForwardTileKinds = {"shared gate/up", "routed gate/up",
                                                    "shared down", "routed down"};
const std::vector<std::string> kBackwardTileKinds = {"dgrad down", "dgrad gate/up", "wgrad down",
                                                     "wgrad gate/up", "recompute"};

namespace {

const char* role_name(int role) {
  return role >= 0 && role < int(kern::kTraceRoles) ? kTraceRoleNames[role] : "role";
}

// The roles whose events are GEMM tiles (and carry a tile kind).
bool tile_role(int role) {
  return role == kern::kTraceProducer || role == kern::kTraceConsumer0 ||
         role == kern::kTraceConsumer1 || role == kern::kTraceStore;
}

std::string kind_name(const std::vector<std::string>& kinds, int kind) {
  return kind >= 0 && kind < int(kinds.size()) ? kinds[size_t(kind)]
                                               : "kind " + std::to_string(kind);
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

using Interval = std::pair<uint64_t, uint64_t>;

// The union of intervals, as sorted disjoint intervals.
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (!out.empty() && i.first <= out.back().second)
      out.back().second = std::max(out.back().second, i.second);
    else
      out.push_back(i);
  }
  return out;
}

uint64_t length(const std::vector<Interval>& v) {
  uint64_t n = 0;
  for (const Interval& i : v) n += i.second - i.first;
  return n;
}

// The length of the intersection of two sorted disjoint interval lists.
uint64_t overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  uint64_t n = 0;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const uint64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) n += hi - lo;
    (a[i].second < b[j].second ? i : j)++;
  }
  return n;
}

}  // namespace

std::string chrome_trace_json(const std::vector<kern::TraceEvent>& events,
                              const std::vector<std::string>& kinds) {
  uint64_t t0 = UINT64_MAX;
  for (const kern::TraceEvent& e : events) t0 = std::min(t0, e.start_ns);
  std::map<std::pair<int, int>, std::string> tracks;  // (rank, tid) -> name
  std::string j = "{\"displayTimeUnit\": \"ns\", \"traceEvents\": [";
  bool first = true;
  for (const kern::TraceEvent& e : events) {
    const int tid = e.sm * 8 + e.role;
    tracks[{e.rank, tid}] = "SM " + std::to_string(e.sm) + " " + role_name(e.role);
    j += first ? "\n  " : ",\n  ";
    first = false;
    const bool kinded = !kinds.empty() && tile_role(e.role);
    const std::string kind = kinded ? kind_name(kinds, e.kind) : "";
    j += "{\"name\": " +
         json_string(std::string(role_name(e.role)) + (kinded ? " " + kind : "") + " " +
                     std::to_string(e.what)) +
         ", \"ph\": \"X\", \"pid\": " + std::to_string(e.rank) +
         ", \"tid\": " + std::to_string(tid) +
         ", \"ts\": " + number(double(e.start_ns - t0) * 1e-3) +
         ", \"dur\": " + number(double(e.end_ns - e.start_ns) * 1e-3) +
         ", \"args\": {\"what\": " + std::to_string(e.what) +
         (kinded ? ", \"kind\": " + json_string(kind) : "") + "}}";
  }
  for (const auto& [key, name] : tracks) {
    j += first ? "\n  " : ",\n  ";
    first = false;
    j += "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(key.first) +
         ", \"tid\": " + std::to_string(key.second) +
         ", \"args\": {\"name\": " + json_string(name) + "}}";
  }
  return j + "\n]}\n";
}

TimelineSummary summarize_timeline(const std::vector<kern::TraceEvent>& events,
                                   const std::vector<std::string>& kinds) {
  TimelineSummary s;
  if (events.empty()) return s;
  uint64_t t0 = UINT64_MAX, t1 = 0;
  std::map<int, std::map<std::pair<int, int>, std::vector<Interval>>> by_role;  // role, track
  std::vector<Interval> movement, compute;
  for (const kern::TraceEvent& e : events) {
    t0 = std::min(t0, e.start_ns);
    t1 = std::max(t1, e.end_ns);
    by_role[e.role][{e.rank, e.sm}].push_back({e.start_ns, e.end_ns});
    if (e.role == kern::kTraceDispatch || e.role == kern::kTraceCombine)
      movement.push_back({e.start_ns, e.end_ns});
    if (e.role == kern::kTraceConsumer0 || e.role == kern::kTraceConsumer1)
      compute.push_back({e.start_ns, e.end_ns});
  }
  const double span = double(t1 - t0);
  s.span_us = span * 1e-3;
  for (auto& [role, tracks] : by_role) {
    RoleSummary r;
    r.role = role_name(role);
    r.tracks = int(tracks.size());
    uint64_t busy = 0, gap = 0;
    for (auto& [track, intervals] : tracks) {
      r.events += int64_t(intervals.size());
      const std::vector<Interval> m = merged(intervals);
      busy += length(m);
      for (size_t i = 1; i < m.size(); ++i) gap = std::max(gap, m[i].first - m[i - 1].second);
    }
    r.busy = span > 0 ? double(busy) / (span * double(r.tracks)) : 0;
    r.longest_gap_us = double(gap) * 1e-3;
    s.roles.push_back(r);
  }
  if (!kinds.empty()) {
    std::map<int, KindSummary> by_kind;
    uint64_t consumers = 0;
    for (const kern::TraceEvent& e : events) {
      if (e.role != kern::kTraceConsumer0 && e.role != kern::kTraceConsumer1) continue;
      KindSummary& k = by_kind[e.kind];
      k.kind = kind_name(kinds, e.kind);
      ++k.events;
      k.consumer_ms += double(e.end_ns - e.start_ns) * 1e-6;
      consumers += e.end_ns - e.start_ns;
    }
    for (auto& [kind, k] : by_kind) {
      k.share = consumers > 0 ? k.consumer_ms * 1e6 / double(consumers) : 0;
      s.kinds.push_back(k);
    }
  }
  const std::vector<Interval> moving = merged(movement), computing = merged(compute);
  s.movement_us = double(length(moving)) * 1e-3;
  s.movement_overlapped =
      moving.empty() ? 0 : double(overlap(moving, computing)) / double(length(moving));
  return s;
}

std::string timeline_summary_text(const TimelineSummary& s) {
  std::string t =
      "| role | events | tracks | busy | longest idle gap us |\n|---|---|---|---|---|\n";
  for (const RoleSummary& r : s.roles) {
    char line[160];
    std::snprintf(line, sizeof line, "| %s | %lld | %d | %.0f%% | %.1f |\n", r.role.c_str(),
                  static_cast<long long>(r.events), r.tracks, 100.0 * r.busy, r.longest_gap_us);
    t += line;
  }
  if (!s.kinds.empty()) {
    t += "\n| tile kind | consumer tiles | consumer time ms (summed over warpgroups) | share |\n"
         "|---|---|---|---|\n";
    for (const KindSummary& k : s.kinds) {
      char line[160];
      std::snprintf(line, sizeof line, "| %s | %lld | %.3f | %.0f%% |\n", k.kind.c_str(),
                    static_cast<long long>(k.events), k.consumer_ms, 100.0 * k.share);
      t += line;
    }
    t += "\n";
  }
  char tail[200];
  std::snprintf(tail, sizeof tail,
                "span %.1f us; rows moving (dispatch, combine) %.1f us, %.0f%% of it beside GEMM "
                "consumers\n",
                s.span_us, s.movement_us, 100.0 * s.movement_overlapped);
  return t + tail;
}

}  // namespace mok::tools
