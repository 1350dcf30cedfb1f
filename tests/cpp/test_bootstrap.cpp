// The NCCL bootstrap pieces that need no GPU: the version check and its message, and the two
// channels that carry rank 0's unique id (hex in an environment variable, a file).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "mok/error.hpp"
#include "mok/transport/bootstrap.hpp"

namespace mt = mok::transport;

namespace {

mt::UniqueId random_id(uint64_t seed) {
  std::mt19937_64 rng(seed);
  mt::UniqueId id;
  for (unsigned char& b : id.bytes) b = static_cast<unsigned char>(rng());
  return id;
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("mok_") + name + "_" + std::to_string(::getpid())))
      .string();
}

}  // namespace

TEST(Bootstrap, VersionMismatchSaysWhatAndHowToFix) {
  EXPECT_EQ(mt::nccl_version_mismatch(22809, 22809), "");
  const std::string m = mt::nccl_version_mismatch(22809, 22803);
  EXPECT_NE(m.find("NCCL 2.28.3 was loaded at run time"), std::string::npos) << m;
  EXPECT_NE(m.find("headers of NCCL 2.28.9"), std::string::npos) << m;
  EXPECT_NE(m.find("LD_LIBRARY_PATH"), std::string::npos) << m;
}

#if defined(MOK_WITH_NCCL)
// This build links the toolkit's NCCL with its own headers: the check passes, and a unique id can
// be made without a GPU.
TEST(Bootstrap, TheLinkedNcclMatchesItsHeadersAndMakesIds) {
  EXPECT_NO_THROW(mt::require_matching_nccl());
  const mt::UniqueId a = mt::new_unique_id(), b = mt::new_unique_id();
  EXPECT_FALSE(a == b);
}
#endif

TEST(Bootstrap, HexRoundTripAndBadText) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const mt::UniqueId id = random_id(seed);
    const std::string hex = mt::to_hex(id);
    ASSERT_EQ(hex.size(), 256u);
    EXPECT_EQ(mt::unique_id_from_hex(hex), id);
  }
  std::string hex = mt::to_hex(random_id(1));
  EXPECT_THROW(mt::unique_id_from_hex(hex.substr(1)), mok::Error);
  hex[17] = 'g';
  try {
    mt::unique_id_from_hex(hex);
    FAIL() << "no error";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 17"), std::string::npos) << e.what();
  }
}

TEST(Bootstrap, EnvironmentChannel) {
  const mt::UniqueId id = random_id(7);
  ::setenv("MOK_TEST_NCCL_ID", mt::to_hex(id).c_str(), 1);
  EXPECT_EQ(mt::unique_id_from_env("MOK_TEST_NCCL_ID"), id);
  ::unsetenv("MOK_TEST_NCCL_ID");
  try {
    mt::unique_id_from_env("MOK_TEST_NCCL_ID");
    FAIL() << "no error";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("MOK_TEST_NCCL_ID is not set"), std::string::npos);
  }
}

// Rank 0 publishes while another rank is already waiting; a rank that waits for a file nobody
// writes gets an error naming it (instead of waiting forever).
TEST(Bootstrap, FileChannelAndItsBound) {
  const std::string path = temp_path("id");
  std::filesystem::remove(path);
  const mt::UniqueId id = random_id(9);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    mt::publish_unique_id(path, id);
  });
  EXPECT_EQ(mt::wait_for_unique_id(path, 10.0), id);
  writer.join();
  std::filesystem::remove(path);

  try {
    mt::wait_for_unique_id(temp_path("never"), 0.2);
    FAIL() << "no error";
  } catch (const mok::Error& e) {
    EXPECT_EQ(e.code(), mok::ErrorCode::peer_timeout);
    EXPECT_NE(std::string(e.what()).find("did not appear"), std::string::npos);
  }
}
