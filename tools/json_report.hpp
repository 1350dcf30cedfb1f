// The JSON that `mok run --json` and `mok bench --json` write: string and number encoding, and
// the markdown tables a command printed, turned into JSON tables (every printed number kept).
#pragma once
#include <string>

namespace mok::tools {

std::string json_string(const std::string& v);
std::string json_number(double v);  // null for NaN and Inf

// Every markdown table in `text` (a header line "| a | b |", a "|---|" line, then rows) as
//   {"title": ..., "columns": [...], "rows": [[...], ...]}
// where the title is the nearest non-table line above the header, and a cell that is a plain
// number becomes a JSON number (anything else stays a string, as printed). Returns the JSON
// array; `notes` receives the other non-empty lines as a JSON array.
std::string markdown_tables_json(const std::string& text, std::string* notes);

// Throws mok::Error naming the path unless it can be written; leaves no file behind.
void require_writable(const std::string& path, const char* option);
// Writes `text` to `path`; throws mok::Error naming the path if it cannot.
void write_text_file(const std::string& path, const std::string& text, const char* option);

}  // namespace mok::tools
