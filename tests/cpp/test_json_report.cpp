// The --json report's pieces: printed markdown tables turned into JSON (titles, columns, rows,
// numbers as numbers, every other line a note), and the stdout tee that keeps what a command
// prints while it still reaches the terminal.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "json_report.hpp"
#include "stdout_tee.hpp"

using mok::tools::markdown_tables_json;

TEST(JsonReport, MarkdownTablesBecomeTablesWithTheirTitlesAndNumbers) {
  const std::string text =
      "mok bench: on a GPU\n"
      "\n"
      "Where the time goes (ms):\n"
      "| shape | T | ms | share | note |\n"
      "|---|---|---|---|---|\n"
      "| dsv3 | 4096 | 8.442 | 45% | 1.2e-03 |\n"
      "| fine | 0 | -0.5 | n/a | 0x10 |\n"
      "after the table\n"
      "| empty | table |\n"
      "|:---|---:|\n";
  std::string notes;
  const std::string tables = markdown_tables_json(text, &notes);
  EXPECT_EQ(
      tables,
      "[\n"
      "    {\"title\": \"Where the time goes (ms):\", \"columns\": [\"shape\", \"T\", \"ms\", "
      "\"share\", \"note\"], \"rows\": [\n"
      "      [\"dsv3\", 4096, 8.442, \"45%\", 0.0012],\n"
      "      [\"fine\", 0, -0.5, \"n/a\", \"0x10\"]\n"
      "    ]},\n"
      "    {\"title\": \"after the table\", \"columns\": [\"empty\", \"table\"], \"rows\": []}\n"
      "  ]");
  EXPECT_EQ(notes,
            "[\n    \"mok bench: on a GPU\",\n    \"Where the time goes (ms):\",\n"
            "    \"after the table\"\n  ]");
  EXPECT_EQ(markdown_tables_json("no tables\n| a row without a separator |\n", nullptr), "[]");
}

TEST(JsonReport, StringsAreAlwaysValidJson) {
  using mok::tools::json_string;
  EXPECT_EQ(json_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(json_string("tab\there\n"), "\"tab\\u0009here\\u000a\"");
  EXPECT_EQ(json_string("caf\xc3\xa9 \xe2\x82\xac"), "\"caf\xc3\xa9 \xe2\x82\xac\"");  // UTF-8 kept
  EXPECT_EQ(json_string("latin\xe9 \xff"), "\"latin\\u00e9 \\u00ff\"");  // not UTF-8: escaped
  EXPECT_EQ(json_string("cut \xe2\x82"), "\"cut \\u00e2\\u0082\"");      // a truncated sequence
  EXPECT_EQ(mok::tools::json_number(1e-05), "1e-05");
  EXPECT_EQ(mok::tools::json_number(NAN), "null");
}

// A bench output of an earlier session: as many tables as separator lines, every row kept.
TEST(JsonReport, ARecordedBenchOutputKeepsEveryTableAndRow) {
  std::ifstream f(std::string(MOK_SOURCE_DIR) + "/docs/data/mok_bench_ep1_session16_final.txt");
  ASSERT_TRUE(f.good());
  std::stringstream all;
  all << f.rdbuf();
  int separators = 0, table_lines = 0;
  std::istringstream in(all.str());
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("|---", 0) == 0) ++separators;
    if (l.rfind("|", 0) == 0) ++table_lines;
  }
  ASSERT_GT(separators, 0);
  const std::string json = markdown_tables_json(all.str(), nullptr);
  auto count = [&](const std::string& what) {
    int n = 0;
    for (size_t at = json.find(what); at != std::string::npos; at = json.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("\"columns\""), separators);
  // Each table's rows are its lines but the header and the separator: one "[" per row, one per
  // table's columns and rows arrays, one for the whole.
  EXPECT_EQ(count("["), (table_lines - 2 * separators) + 2 * separators + 1);
}

TEST(StdoutTee, KeepsWhatIsPrintedAndStillPrintsIt) {
  std::fflush(stdout);
  char path[] = "/tmp/mok_tee_XXXXXX";
  const int file = mkstemp(path);
  ASSERT_GE(file, 0);
  const int original = dup(STDOUT_FILENO);
  dup2(file, STDOUT_FILENO);
  std::string kept;
  {
    mok::tools::StdoutTee tee;
    std::printf("| a | b |\n");
    std::fflush(stdout);
    EXPECT_EQ(write(STDOUT_FILENO, "raw\n", 4), 4);  // no ASSERT: stdout is redirected here
    std::printf("%d rows\n", 3);
    kept = tee.finish();
  }
  std::printf("after\n");  // not kept: stdout is the file again
  std::fflush(stdout);
  dup2(original, STDOUT_FILENO);
  close(original);
  close(file);
  std::ifstream f(path);
  std::stringstream printed;
  printed << f.rdbuf();
  std::remove(path);
  EXPECT_EQ(kept, "| a | b |\nraw\n3 rows\n");
  EXPECT_EQ(printed.str(), "| a | b |\nraw\n3 rows\nafter\n");
}
