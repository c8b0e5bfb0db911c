// Training end to end with every optimizer update schedule gives bit-identical
// parameters, m and v (the same state_digest), gradient clipping on, across subgroup
// sizes and strides.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tandem/train/trainer.h"
#include "test_util.h"

namespace tandem {
namespace {

TEST(Schedules, EveryScheduleTrainsToTheSameBits) {
  testing::ScratchDir dir("schedules");
  testing::write_small_corpus(dir / "data.txt");
  TrainOptions quiet;
  quiet.show_progress = false;

  struct Case {
    const char* schedule;
    size_t sub_group_size;
    double ratio;
    int stride;
  };
  const std::vector<Case> cases = {
      {"device", 100000000, 0.5, 2}, {"cpu", 100000000, 0.5, 2},   {"cpu", 1000, 0.5, 2},
      {"ratio", 1000, 0.5, 2},       {"ratio", 3000, 0.3, 2},      {"interleave", 1000, 0.5, 2},
      {"interleave", 777, 0.5, 3},   {"interleave", 5000, 0.5, 1},
  };
  std::string first_digest;
  for (size_t i = 0; i < cases.size(); i++) {
    const Case& c = cases[i];
    nlohmann::json json =
        testing::tiny_run_config(dir / "data.txt", dir / ("run" + std::to_string(i)));
    json["train"]["steps"] = 6;
    json["gradient_clipping"] = 0.05;  // small enough that clipping acts on every step
    json["zero_optimization"] = {{"sub_group_size", c.sub_group_size}};
    json["offload_optimizer"] = {
        {"schedule", c.schedule}, {"ratio", c.ratio}, {"stride", c.stride}};
    const TrainResult result = train(parse_train_config(json), quiet);
    ASSERT_EQ(result.state_digest.size(), 16u);
    if (i == 0) first_digest = result.state_digest;
    EXPECT_EQ(result.state_digest, first_digest)
        << c.schedule << " sub_group_size=" << c.sub_group_size << " ratio=" << c.ratio
        << " stride=" << c.stride;
  }
}

}  // namespace
}  // namespace tandem
