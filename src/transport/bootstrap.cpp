#include "mok/transport/bootstrap.hpp"

#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "mok/error.hpp"

#if defined(MOK_WITH_NCCL)
#include <nccl.h>
#endif

namespace mok::transport {
namespace {

std::string version_text(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code % 10000 / 100) + "." +
         std::to_string(code % 100);
}

}  // namespace

std::string nccl_version_mismatch(int header_code, int runtime_code) {
  if (header_code == runtime_code) return "";
  return "NCCL " + version_text(runtime_code) + " was loaded at run time, but mok was compiled " +
         "against the headers of NCCL " + version_text(header_code) +
         "; NCCL's device-API structs differ between versions and a mix hangs or faults. Load "
         "the library that matches the headers (put its directory first in LD_LIBRARY_PATH, e.g. "
         "the nvidia/nccl/lib of the Python environment whose nvidia/nccl/include you built with), "
         "or rebuild against the headers of the library you load.";
}

void require_matching_nccl() {
#if defined(MOK_WITH_NCCL)
  int runtime = 0;
  if (ncclGetVersion(&runtime) != ncclSuccess)
    throw Error(ErrorCode::unsupported, "ncclGetVersion failed: NCCL is not usable");
  const std::string problem = nccl_version_mismatch(NCCL_VERSION_CODE, runtime);
  if (!problem.empty()) throw Error(ErrorCode::unsupported, problem);
#else
  throw Error(ErrorCode::unsupported,
              "this build of mok has no NCCL (configure found no nccl.h / libnccl next to CUDA)");
#endif
}

UniqueId new_unique_id() {
#if defined(MOK_WITH_NCCL)
  static_assert(sizeof(ncclUniqueId) == sizeof(UniqueId::bytes), "NCCL_UNIQUE_ID_BYTES");
  require_matching_nccl();
  ncclUniqueId raw;
  if (const ncclResult_t r = ncclGetUniqueId(&raw); r != ncclSuccess)
    throw Error(ErrorCode::unsupported,
                std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
  UniqueId id;
  std::memcpy(id.bytes.data(), &raw, sizeof raw);
  return id;
#else
  require_matching_nccl();  // throws: no NCCL in this build
  return {};
#endif
}

std::string to_hex(const UniqueId& id) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * id.bytes.size());
  for (unsigned char b : id.bytes) {
    s.push_back(digits[b >> 4]);
    s.push_back(digits[b & 15]);
  }
  return s;
}

UniqueId unique_id_from_hex(const std::string& hex) {
  UniqueId id;
  if (hex.size() != 2 * id.bytes.size())
    throw Error(ErrorCode::invalid_argument,
                "a unique id is " + std::to_string(2 * id.bytes.size()) + " hex digits, got " +
                    std::to_string(hex.size()) + " characters");
  auto value = [&](size_t i) {
    const char c = hex[i];
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw Error(ErrorCode::invalid_argument,
                "a unique id has a character that is not a hex digit "
                "at position " +
                    std::to_string(i));
  };
  for (size_t i = 0; i < id.bytes.size(); ++i)
    id.bytes[i] = static_cast<unsigned char>(value(2 * i) * 16 + value(2 * i + 1));
  return id;
}

UniqueId unique_id_from_env(const char* variable) {
  const char* text = std::getenv(variable);
  if (!text)
    throw Error(ErrorCode::invalid_argument,
                std::string("the environment variable ") + variable +
                    " is not set (the launcher sets it to rank 0's unique id, 256 hex digits)");
  try {
    return unique_id_from_hex(text);
  } catch (const Error& e) {
    throw Error(ErrorCode::invalid_argument, std::string(variable) + ": " + e.what());
  }
}

void publish_unique_id(const std::string& path, const UniqueId& id) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(id.bytes.data()), std::streamsize(id.bytes.size()));
    if (!f) throw Error(ErrorCode::invalid_argument, "cannot write the unique id to " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw Error(ErrorCode::invalid_argument, "cannot rename " + tmp + " to " + path);
}

UniqueId wait_for_unique_id(const std::string& path, double timeout_seconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_seconds));
  for (;;) {
    std::ifstream f(path, std::ios::binary);
    if (f) {
      UniqueId id;
      f.read(reinterpret_cast<char*>(id.bytes.data()), std::streamsize(id.bytes.size()));
      if (f.gcount() == std::streamsize(id.bytes.size())) return id;
      throw Error(ErrorCode::invalid_argument, path + " holds " + std::to_string(f.gcount()) +
                                                   " bytes, not a 128-byte unique id");
    }
    if (std::chrono::steady_clock::now() >= deadline)
      throw Error(ErrorCode::peer_timeout, "rank 0's unique id did not appear at " + path +
                                               " within " + std::to_string(timeout_seconds) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace mok::transport
