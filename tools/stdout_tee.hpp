// What a command prints, kept as well as printed: while a StdoutTee lives, file descriptor 1 goes
// through a pipe that a thread copies to the original stdout (so progress still shows) and into a
// string. `mok bench --json` turns the kept text's tables into JSON. SIGPIPE is ignored meanwhile
// (a closed terminal ends the echo, not the command).
#pragma once
#include <string>
#include <thread>

namespace mok::tools {

class StdoutTee {
 public:
  StdoutTee();   // throws mok::Error if the pipe cannot be made
  ~StdoutTee();  // restores stdout (text printed so far still reaches it)
  StdoutTee(const StdoutTee&) = delete;
  StdoutTee& operator=(const StdoutTee&) = delete;
  std::string finish();  // restores stdout and returns everything printed since construction

 private:
  int saved_ = -1, read_end_ = -1;
  void (*previous_sigpipe_)(int) = nullptr;
  std::thread reader_;
  std::string text_;
};

}  // namespace mok::tools
