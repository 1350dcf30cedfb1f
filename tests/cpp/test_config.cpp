#include <gtest/gtest.h>

#include "mok/config.hpp"
#include "mok/error.hpp"

using namespace mok;

TEST(Config, EveryPresetValidatesWithDesignShapes) {
  for (const std::string& name : preset_names()) EXPECT_NO_THROW(preset(name).validate()) << name;
  const Config d = preset("dsv3");
  EXPECT_EQ(d.hidden, 7168);
  EXPECT_EQ(d.intermediate, 2048);
  EXPECT_EQ(d.num_experts, 256);
  EXPECT_EQ(d.top_k, 8);
  EXPECT_EQ(d.shared_width(), 2048);
  EXPECT_EQ(d.max_tokens_per_rank, 4096);
  EXPECT_EQ(preset("qwen3-30b").shared_width(), 0);
  EXPECT_EQ(preset("fine").top_k, 10);
  EXPECT_EQ(preset("mok-default").num_experts, 384);
}

// Each bad field is named in the message together with what is allowed.
void expect_invalid(Config c, const std::string& field, const std::string& allowed) {
  try {
    c.validate();
    FAIL() << field << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_config);
    const std::string m = e.what();
    EXPECT_NE(m.find(field + " = "), std::string::npos) << m;
    EXPECT_NE(m.find(allowed), std::string::npos) << m;
  }
}

TEST(Config, ValidationNamesTheFieldAndTheAllowedValues) {
  const Config t = preset("tiny");
  Config c = t;
  c.hidden = 100;
  expect_invalid(c, "hidden", "multiple of 64");
  c = t;
  c.intermediate = 0;
  expect_invalid(c, "intermediate", "multiple of 64");
  c = t;
  c.num_experts = 513;
  expect_invalid(c, "num_experts", "[1, 512]");
  c = t;
  c.top_k = 17;
  expect_invalid(c, "top_k", "min(16");
  c = t;
  c.top_k = 0;
  expect_invalid(c, "top_k", "[1,");
  c = t;
  c.ep_size = 3;
  expect_invalid(c, "ep_size", "1, 2, 4, 8");
  c = t;
  c.ep_size = 8;
  c.num_experts = 12;
  expect_invalid(c, "num_experts", "multiple of ep_size");
  c = t;
  c.ep_rank = 1;
  expect_invalid(c, "ep_rank", "[0, ep_size");
  c = t;
  c.tile_rows = 100;
  expect_invalid(c, "tile_rows", "64, 128, 256");
  c = t;
  c.routed_capacity_rows = 100;
  expect_invalid(c, "routed_capacity_rows", "multiple of tile_rows");
  c = t;
  c.ring_rows = 1;
  expect_invalid(c, "ring_rows", "multiple of tile_rows");
  c = t;
  c.shared_intermediate = 0;
  expect_invalid(c, "shared_intermediate", "multiple of 64");
  c = t;
  c.max_tokens_per_rank = -1;
  expect_invalid(c, "max_tokens_per_rank", "[0,");
}

TEST(Config, UnknownNamesListTheKnownOnes) {
  try {
    preset("dsv4");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tiny, dsv3, mok-default, qwen3-30b, fine"),
              std::string::npos);
  }
  try {
    parse_precision("fp16");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16, fp8_block, mxfp8, nvfp4"), std::string::npos);
  }
  EXPECT_EQ(parse_precision("nvfp4"), Precision::nvfp4);
}

TEST(Config, DroplessCapacityCoversEveryRoutedRowPlusPadding) {
  Config c = preset("tiny");
  c.ep_size = 4;
  // 4 ranks x 512 tokens x 4, plus (tile - 1) padding for each of the 4 local experts.
  EXPECT_EQ(c.dropless_capacity_rows(), 4 * 512 * 4 + 4 * 127);
  c.routed_capacity_rows = 1024;
  EXPECT_EQ(c.capacity_rows(), 1024);
  EXPECT_EQ(c.effective_ring_rows(), 1024);
}

TEST(Config, FlopsFollowTheDesignFormula) {
  const Config c = preset("dsv3");
  EXPECT_DOUBLE_EQ(forward_flops(c, 4096),
                   6.0 * 7168 * 2048 * (4096.0 * 8) + 6.0 * 7168 * 2048 * 4096);
  EXPECT_DOUBLE_EQ(backward_flops(c, 10), 2 * forward_flops(c, 10));
}
