#include "stdout_tee.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>

#include "mok/error.hpp"

namespace mok::tools {

namespace {

void write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // the terminal is gone (SIGPIPE is ignored meanwhile): keep capturing
    data += w;
    n -= size_t(w);
  }
}

}  // namespace

StdoutTee::StdoutTee() {
  int ends[2];
  std::fflush(stdout);
  // glibc fixes stdout's buffering at its first output, which now goes to the pipe: keep it
  // line-buffered where the terminal would have, so progress shows as it is printed.
  if (isatty(STDOUT_FILENO)) std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
  saved_ = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 0);
  if (saved_ < 0)
    throw Error(ErrorCode::unsupported, "--json: cannot capture the output (dup failed)");
  if (pipe2(ends, O_CLOEXEC) != 0) {
    close(saved_);
    throw Error(ErrorCode::unsupported, "--json: cannot capture the output (pipe failed)");
  }
  read_end_ = ends[0];
  previous_sigpipe_ = std::signal(SIGPIPE, SIG_IGN);
  try {
    reader_ = std::thread([this] {
      char buf[4096];
      for (;;) {
        const ssize_t n = read(read_end_, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;  // every write end closed: finish() restored stdout
        text_.append(buf, size_t(n));
        write_all(saved_, buf, size_t(n));
      }
    });
  } catch (...) {
    close(ends[0]), close(ends[1]), close(saved_);
    std::signal(SIGPIPE, previous_sigpipe_);
    throw;
  }
  const bool redirected = dup2(ends[1], STDOUT_FILENO) >= 0;
  close(ends[1]);  // stdout then holds the only write end: restoring it ends the reader
  if (!redirected) {
    reader_.join();
    close(read_end_), close(saved_);
    std::signal(SIGPIPE, previous_sigpipe_);
    throw Error(ErrorCode::unsupported, "--json: cannot capture the output (dup2 failed)");
  }
}

std::string StdoutTee::finish() {
  if (saved_ >= 0) {
    std::fflush(stdout);
    dup2(saved_, STDOUT_FILENO);  // closes the pipe's last write end
    reader_.join();
    close(read_end_);
    close(saved_);
    saved_ = read_end_ = -1;
    std::signal(SIGPIPE, previous_sigpipe_);
  }
  return text_;
}

StdoutTee::~StdoutTee() { finish(); }

}  // namespace mok::tools
