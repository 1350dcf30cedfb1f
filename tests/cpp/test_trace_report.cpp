// `mok trace`'s report from a timeline: the Chrome trace's events and track names, and the
// summary's busy shares, idle gaps and overlap, on events whose answers are worked out by hand.
#include <gtest/gtest.h>

#include "trace_report.hpp"

using mok::kern::TraceEvent;

namespace {

// Two SMs' consumer 0 (tiles of kinds 0, 1, 1) and a dispatch CTA, times in ns from 1000:
//   SM 0 consumer 0: [1000, 3000], [5000, 9000]      (busy 6000 of 8000, gap 2000)
//   SM 1 consumer 0: [1000, 2000]                     (busy 1000)
//   SM 2 dispatch:   [500, 1500] (starts the span)    (busy 1000 of 8500)
// span: 500 .. 9000 = 8500 ns; consumer 0 busy (6000 + 1000) / (2 * 8500); movement [500, 1500]
// overlaps the consumers on [1000, 1500]: half of it.
std::vector<TraceEvent> sample() {
  return {{1000, 3000, 1, 0, 0, 0, 7},
          {5000, 9000, 1, 0, 0, 1, 8},
          {1000, 2000, 1, 0, 1, 1, 9},
          {500, 1500, 3, 0, 2, 0, 0}};
}

}  // namespace

TEST(TraceReport, SummaryByHand) {
  const auto s = mok::tools::summarize_timeline(sample());
  EXPECT_DOUBLE_EQ(s.span_us, 8.5);
  ASSERT_EQ(s.roles.size(), 2u);
  EXPECT_EQ(s.roles[0].role, "consumer 0");
  EXPECT_EQ(s.roles[0].events, 3);
  EXPECT_EQ(s.roles[0].tracks, 2);
  EXPECT_DOUBLE_EQ(s.roles[0].busy, 7000.0 / 17000.0);
  EXPECT_DOUBLE_EQ(s.roles[0].longest_gap_us, 2.0);
  EXPECT_EQ(s.roles[1].role, "dispatch");
  EXPECT_DOUBLE_EQ(s.roles[1].busy, 1000.0 / 8500.0);
  EXPECT_DOUBLE_EQ(s.movement_us, 1.0);
  EXPECT_DOUBLE_EQ(s.movement_overlapped, 0.5);
  const std::string text = mok::tools::timeline_summary_text(s);
  EXPECT_NE(text.find("| consumer 0 | 3 | 2 | 41% | 2.0 |"), std::string::npos) << text;
  EXPECT_NE(text.find("span 8.5 us; rows moving (dispatch, combine) 1.0 us, 50% of it beside"),
            std::string::npos)
      << text;
  EXPECT_TRUE(mok::tools::summarize_timeline({}).roles.empty());
}

// The packed tag the kernels write reads back as what they packed.
TEST(TraceReport, EventLayoutRoundTrips) {
  const unsigned long long words[3] = {
      11, 22, mok::kern::trace_tag(mok::kern::kTraceStore, 7, 131, 0xFFFFFFF0, 4)};
  const TraceEvent e = mok::kern::trace_event_at(words);
  EXPECT_EQ(e.start_ns, 11u);
  EXPECT_EQ(e.end_ns, 22u);
  EXPECT_EQ(e.role, int(mok::kern::kTraceStore));
  EXPECT_EQ(e.rank, 7);
  EXPECT_EQ(e.sm, 131);
  EXPECT_EQ(e.kind, 4);
  EXPECT_EQ(e.what, 0xFFFFFFF0);
  const unsigned long long plain[3] = {0, 1,
                                       mok::kern::trace_tag(mok::kern::kTraceProducer, 0, 5, 9)};
  EXPECT_EQ(mok::kern::trace_event_at(plain).kind, 0);
  EXPECT_EQ(mok::kern::trace_event_at(plain).sm, 5);
}

TEST(TraceReport, ChromeTraceHasAnEventPerEventAndNamedTracks) {
  const std::string j = mok::tools::chrome_trace_json(sample());
  EXPECT_NE(j.find("{\"name\": \"consumer 0 8\", \"ph\": \"X\", \"pid\": 0, \"tid\": 1, \"ts\": "
                   "4.500, \"dur\": 4.000, \"args\": {\"what\": 8}}"),
            std::string::npos)
      << j;
  EXPECT_NE(j.find("\"tid\": 19, \"args\": {\"name\": \"SM 2 dispatch\"}"), std::string::npos) << j;
  size_t events = 0;
  for (size_t at = j.find("\"ph\": \"X\""); at != std::string::npos;
       at = j.find("\"ph\": \"X\"", at + 1))
    ++events;
  EXPECT_EQ(events, 4u);
}

// With the tile kinds named: the consumers' time by kind (kind 0: 2000 ns, kind 1: 4000 + 1000),
// and the GEMM events named by kind; other roles' events are not.
TEST(TraceReport, ConsumerTimeByTileKind) {
  const auto s = mok::tools::summarize_timeline(sample(), {"gate", "down"});
  ASSERT_EQ(s.kinds.size(), 2u);
  EXPECT_EQ(s.kinds[0].kind, "gate");
  EXPECT_EQ(s.kinds[0].events, 1);
  EXPECT_DOUBLE_EQ(s.kinds[0].consumer_ms, 0.002);
  EXPECT_DOUBLE_EQ(s.kinds[0].share, 2.0 / 7.0);
  EXPECT_EQ(s.kinds[1].kind, "down");
  EXPECT_EQ(s.kinds[1].events, 2);
  EXPECT_DOUBLE_EQ(s.kinds[1].consumer_ms, 0.005);
  const std::string text = mok::tools::timeline_summary_text(s);
  EXPECT_NE(text.find("| down | 2 | 0.005 | 71% |"), std::string::npos) << text;
  EXPECT_TRUE(mok::tools::summarize_timeline(sample()).kinds.empty());
  const std::string j = mok::tools::chrome_trace_json(sample(), {"gate", "down"});
  EXPECT_NE(j.find("{\"name\": \"consumer 0 down 8\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"args\": {\"what\": 8, \"kind\": \"down\"}"), std::string::npos) << j;
  EXPECT_NE(j.find("{\"name\": \"dispatch 0\""), std::string::npos) << j;
  EXPECT_EQ(mok::tools::kBackwardTileKinds.size(), 5u);  // BackwardKind's values
  EXPECT_EQ(mok::tools::kForwardTileKinds.size(), 4u);   // TileKind's
}
