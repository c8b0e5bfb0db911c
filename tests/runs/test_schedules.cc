// Training end to end with every optimizer update schedule gives bit-identical
// parameters, m and v (the same state_digest), gradient clipping on, across subgroup
// sizes and strides.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/core/file_io.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {

TEST(Schedules, BackwardStartsOffloadingGradientsBeforeTheUpdate) {
  testing::ScratchDir dir("early_gradients");
  testing::write_small_corpus(dir / "data.txt");
  TrainOptions options;
  options.show_progress = false;
  options.metrics_path = dir / "metrics.jsonl";
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  json["train"]["steps"] = 2;
  json["zero_optimization"] = {{"sub_group_size", 500}};
  json["offload_optimizer"] = {{"schedule", "cpu"}};
  train(parse_train_config(json), options);
  const std::string metrics = read_file_text(options.metrics_path);
  // The first record is the plan, the second the first step.
  const size_t second_line = metrics.find('\n') + 1;
  const auto first = nlohmann::json::parse(
      metrics.substr(second_line, metrics.find('\n', second_line) - second_line));
  // Every block's and ln_f's subgroups go early; only those holding the embeddings
  // (final at the very end of backward) wait for the update.
  EXPECT_GT(first["early_gradient_subgroups"].get<int>(), 10) << first.dump();
}

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
      {"interleave", 777, 0.5, 3},   {"interleave", 5000, 0.5, 1}, {"auto", 1000, 0.5, 2},
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
