// Errors of the public API. Every failure names what was wrong and what was allowed or needed.
#pragma once
#include <stdexcept>
#include <string>

namespace mok {

enum class ErrorCode {
  invalid_config,     // a configuration field out of its allowed values
  invalid_argument,   // a tensor of the wrong shape, dtype or content (expert id out of range)
  capacity_exceeded,  // routing needs more routed rows than configured
  peer_timeout,       // a bounded cross-rank wait expired
  peer_failed,        // another rank reported an error first
  unsupported,        // valid, but not built or not available on this machine
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(std::string(error_code_name(code)) + ": " + message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace mok
