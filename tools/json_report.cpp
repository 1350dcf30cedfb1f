#include "json_report.hpp"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "mok/error.hpp"

namespace mok::tools {

namespace {

// The length of the valid UTF-8 sequence at s[i] (0: not one).
size_t utf8_length(const std::string& s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b = byte(i);
  const size_t n = b < 0x80           ? 1
                   : (b >> 5) == 0x6  ? 2
                   : (b >> 4) == 0xE  ? 3
                   : (b >> 3) == 0x1E ? 4
                                      : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  return n;
}

}  // namespace

// Control characters and bytes that are not UTF-8 (a path in another encoding) as \u00XX, so the
// file is always valid JSON.
std::string json_string(const std::string& v) {
  std::string out = "\"";
  for (size_t i = 0; i < v.size();) {
    const unsigned char ch = static_cast<unsigned char>(v[i]);
    const size_t n = utf8_length(v, i);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += char(ch);
    } else if (ch < 0x20 || n == 0) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(ch));
      out += buf;
    } else {
      out.append(v, i, n);
      i += n;
      continue;
    }
    ++i;
  }
  return out + "\"";
}

// The shortest form that reads back as v: a printed 8.442 stays 8.442.
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

// "| a | b |" -> {"a", "b"}.
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::string t = trim(line);
  if (t.size() >= 2 && t.front() == '|' && t.back() == '|') t = t.substr(1, t.size() - 2);
  std::string cell;
  for (const char ch : t) {
    if (ch == '|') {
      out.push_back(trim(cell));
      cell.clear();
    } else {
      cell += ch;
    }
  }
  out.push_back(trim(cell));
  return out;
}

bool is_row(const std::string& line) {
  const std::string t = trim(line);
  return t.size() >= 2 && t.front() == '|' && t.back() == '|';
}
bool is_separator(const std::string& line) {
  if (!is_row(line)) return false;
  for (const std::string& c : cells(line))
    if (c.empty() || c.find_first_not_of("-: ") != std::string::npos) return false;
  return true;
}

// A cell printed as a plain number ("12", "-3.5", "1.2e-03") becomes a JSON number.
std::string cell_json(const std::string& c) {
  if (!c.empty() && c.find_first_of("0123456789") != std::string::npos) {
    char* end = nullptr;
    const double v = std::strtod(c.c_str(), &end);
    if (end == c.c_str() + c.size() && std::isfinite(v) &&
        c.find_first_of("xXnN") == std::string::npos)
      return json_number(v);
  }
  return json_string(c);
}

std::string json_array(const std::vector<std::string>& items) {
  std::string j = "[";
  for (size_t i = 0; i < items.size(); ++i) j += (i ? ", " : "") + items[i];
  return j + "]";
}

}  // namespace

std::string markdown_tables_json(const std::string& text, std::string* notes) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::vector<std::string> tables, other;
  std::string title;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (is_row(lines[i]) && i + 1 < lines.size() && is_separator(lines[i + 1])) {
      std::vector<std::string> columns;
      for (const std::string& c : cells(lines[i])) columns.push_back(json_string(c));
      std::vector<std::string> rows;
      size_t r = i + 2;
      for (; r < lines.size() && is_row(lines[r]); ++r) {
        std::vector<std::string> row;
        for (const std::string& c : cells(lines[r])) row.push_back(cell_json(c));
        rows.push_back(json_array(row));
      }
      std::string j = "{\"title\": " + json_string(title) +
                      ", \"columns\": " + json_array(columns) + ", \"rows\": [";
      for (size_t k = 0; k < rows.size(); ++k) j += (k ? ",\n      " : "\n      ") + rows[k];
      tables.push_back(j + (rows.empty() ? "]}" : "\n    ]}"));
      i = r - 1;
      continue;
    }
    const std::string t = trim(lines[i]);
    if (t.empty()) continue;
    title = t;
    other.push_back(json_string(t));
  }
  if (notes) {
    *notes = "[";
    for (size_t k = 0; k < other.size(); ++k) *notes += (k ? ",\n    " : "\n    ") + other[k];
    *notes += other.empty() ? "]" : "\n  ]";
  }
  std::string j = "[";
  for (size_t k = 0; k < tables.size(); ++k) j += (k ? ",\n    " : "\n    ") + tables[k];
  return j + (tables.empty() ? "]" : "\n  ]");
}

void require_writable(const std::string& path, const char* option) {
  const bool existed = access(path.c_str(), F_OK) == 0;
  std::FILE* f = std::fopen(path.c_str(), "a");  // "a": an existing file keeps its bytes
  if (!f)
    throw Error(ErrorCode::unsupported,
                std::string(option) + " " + path + ": cannot write the file");
  std::fclose(f);
  if (!existed) std::remove(path.c_str());
}

void write_text_file(const std::string& path, const std::string& text, const char* option) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  const bool written = f && std::fputs(text.c_str(), f) >= 0;
  const bool closed = f && std::fclose(f) == 0;
  if (!written || !closed)
    throw Error(ErrorCode::unsupported,
                std::string(option) + " " + path + ": cannot write the file");
}

}  // namespace mok::tools
