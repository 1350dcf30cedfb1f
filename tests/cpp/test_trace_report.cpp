// `mok trace`'s report from a timeline: the Chrome trace's events and track names, and the
// summary's busy shares, idle gaps and overlap, on events whose answers are worked out by hand.
#include <gtest/gtest.h>

#include "trace_report.hpp"

using mok::kern::TraceEvent;

namespace {

// Two SMs' consumer 0 and a dispatch CTA, times in ns from 1000:
//   SM 0 consumer 0: [1000, 3000], [5000, 9000]      (busy 6000 of 8000, gap 2000)
//   SM 1 consumer 0: [1000, 2000]                     (busy 1000)
//   SM 2 dispatch:   [500, 1500] (starts the span)    (busy 1000 of 8500)
// span: 500 .. 9000 = 8500 ns; consumer 0 busy (6000 + 1000) / (2 * 8500); movement [500, 1500]
// overlaps the consumers on [1000, 1500]: half of it.
std::vector<TraceEvent> sample() {
  return {{1000, 3000, 1, 0, 0, 7},
          {5000, 9000, 1, 0, 0, 8},
          {1000, 2000, 1, 0, 1, 9},
          {500, 1500, 3, 0, 2, 0}};
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
      11, 22, mok::kern::trace_tag(mok::kern::kTraceCombine, 7, 131, 4095)};
  const TraceEvent e = mok::kern::trace_event_at(words);
  EXPECT_EQ(e.start_ns, 11u);
  EXPECT_EQ(e.end_ns, 22u);
  EXPECT_EQ(e.role, int(mok::kern::kTraceCombine));
  EXPECT_EQ(e.rank, 7);
  EXPECT_EQ(e.sm, 131);
  EXPECT_EQ(e.what, 4095);
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
