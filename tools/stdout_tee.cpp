#include "stdout_tee.hpp"

#include <unistd.h>

#include <cstdio>

#include "mok/error.hpp"

namespace mok::tools {

StdoutTee::StdoutTee() {
  int ends[2];
  std::fflush(stdout);
  saved_ = dup(STDOUT_FILENO);
  if (saved_ < 0 || pipe(ends) != 0)
    throw Error(ErrorCode::unsupported, "--json: cannot capture the output (dup or pipe failed)");
  read_end_ = ends[0];
  dup2(ends[1], STDOUT_FILENO);
  close(ends[1]);  // stdout now holds the only write end: restoring it ends the reader
  reader_ = std::thread([this] {
    char buf[4096];
    for (ssize_t n; (n = read(read_end_, buf, sizeof buf)) > 0;) {
      text_.append(buf, size_t(n));
      for (ssize_t done = 0; done < n;) {
        const ssize_t w = write(saved_, buf + done, size_t(n - done));
        if (w <= 0) break;  // the terminal went away: keep capturing
        done += w;
      }
    }
  });
}

std::string StdoutTee::finish() {
  if (saved_ >= 0) {
    std::fflush(stdout);
    dup2(saved_, STDOUT_FILENO);  // closes the pipe's last write end
    reader_.join();
    close(read_end_);
    close(saved_);
    saved_ = read_end_ = -1;
  }
  return text_;
}

StdoutTee::~StdoutTee() { finish(); }

}  // namespace mok::tools
