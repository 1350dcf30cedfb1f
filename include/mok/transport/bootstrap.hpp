// Setting up an expert-parallel group's NCCL communicator from the host: the version check that
// must pass before any NCCL device-API call, and the ways rank 0 shares the communicator's 128-byte
// unique id with the other ranks (a file, or an environment variable set by the launcher).
// nccl-device-api.md: headers and library must be the same NCCL (2.28.x structs are unversioned; a
// mix hangs in the first device barrier).
#pragma once
#include <array>
#include <string>

namespace mok::transport {

// Empty when the two NCCL version codes (NCCL_VERSION_CODE style, e.g. 22809) are equal; otherwise
// what is wrong and how to fix it.
std::string nccl_version_mismatch(int header_code, int runtime_code);

// Throws mok::Error(unsupported) with nccl_version_mismatch's message when the NCCL library loaded
// at run time is not the one this build's headers describe, or when the build has no NCCL.
void require_matching_nccl();

struct UniqueId {
  std::array<unsigned char, 128> bytes{};
  bool operator==(const UniqueId&) const = default;
};

UniqueId new_unique_id();  // ncclGetUniqueId, on rank 0

// The environment-variable channel: 256 lowercase hex digits.
std::string to_hex(const UniqueId& id);
UniqueId unique_id_from_hex(
    const std::string& hex);                        // throws invalid_argument saying what is wrong
UniqueId unique_id_from_env(const char* variable);  // throws naming the variable when unset or bad

// The file channel: rank 0 writes `path` atomically (a temporary file, then rename); the others
// poll for it, at most timeout_seconds (then mok::Error(peer_timeout) naming the path).
void publish_unique_id(const std::string& path, const UniqueId& id);
UniqueId wait_for_unique_id(const std::string& path, double timeout_seconds);

}  // namespace mok::transport
