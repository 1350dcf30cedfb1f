// `mok trace`'s outputs from a forward's timeline (kern::TraceEvent, engine_params.hpp): a
// Chrome / Perfetto trace (one process per rank, one track per SM and role) and a summary: each
// role's busy share over its tracks, its longest idle gap, and how much of the row movement
// (dispatch and combine) overlaps the GEMMs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/megakernel/engine_params.hpp"

namespace mok::tools {

// The role names, by kern::TraceRole.
extern const char* const kTraceRoleNames[kern::kTraceRoles];

// The GEMM tiles' kinds by kern::TraceEvent::kind, per direction (the forward's TileKind, the
// backward's BackwardKind).
extern const std::vector<std::string> kForwardTileKinds, kBackwardTileKinds;

// {"traceEvents": [...]}: an "X" event per kern::TraceEvent (microseconds from the first start),
// named by role, tile kind (the producer's and consumers', when `kinds` names them) and what it
// worked on, and thread-name metadata for each track ("SM 12 consumer 0").
std::string chrome_trace_json(const std::vector<kern::TraceEvent>& events,
                              const std::vector<std::string>& kinds = {});

struct RoleSummary {
  std::string role;
  int64_t events = 0;
  int tracks = 0;             // (rank, SM) pairs with this role
  double busy = 0;            // share of the span its tracks spent in events
  double longest_gap_us = 0;  // between two events on one track
};
struct KindSummary {
  std::string kind;
  int64_t events = 0;      // consumer warpgroups' tiles of this kind
  double consumer_ms = 0;  // their time, summed over warpgroups
  double share = 0;        // of all consumer events' time
};
struct TimelineSummary {
  double span_us = 0;              // the first start to the last end
  std::vector<RoleSummary> roles;  // those with events, in kern::TraceRole order
  std::vector<KindSummary> kinds;  // with `kinds` named: consumer time by tile kind
  double movement_us = 0;          // the union of dispatch and combine events
  double movement_overlapped = 0;  // the share of it during which a GEMM consumer also ran
};
TimelineSummary summarize_timeline(const std::vector<kern::TraceEvent>& events,
                                   const std::vector<std::string>& kinds = {});
std::string timeline_summary_text(const TimelineSummary& s);  // markdown tables and a line

}  // namespace mok::tools
