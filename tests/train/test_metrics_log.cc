// The metrics file (train/metrics_log.h): a line is in it whole or not at all (a torn last
// line is dropped when the file is opened again), and a resumed run cuts the records of
// the steps it redoes, so that each step has one record.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/core/file_io.h"
#include "tandem/train/metrics_log.h"
#include "tandem/train/step_record.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;

std::vector<nlohmann::json> records(const fs::path& path) {
  std::vector<nlohmann::json> out;
  const std::string text = read_file_text(path);
  size_t begin = 0;
  for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1)
    out.push_back(nlohmann::json::parse(text.substr(begin, end - begin)));
  EXPECT_EQ(begin, text.size()) << "the file ends in a torn line";
  return out;
}

TEST(MetricsLog, ATornLastLineIsDroppedAndAResumeCutsTheStepsItRedoes) {
  testing::ScratchDir dir("metrics_log");
  const fs::path path = dir / "m.jsonl";
  {
    MetricsLog log(path);
    log.write({{"step", 0}, {"plan", "x"}});
    for (int s = 1; s <= 6; s++) log.write({{"step", s}, {"loss", s}});
  }
  std::string text = read_file_text(path);
  write_file_atomic(path, text + "{\"step\": 7, \"lo");  // a machine crash mid-line
  { MetricsLog reopened(path); }
  EXPECT_EQ(read_file_text(path), text);
  {
    MetricsLog resumed(path, 3);
    resumed.write({{"step", 4}, {"loss", 40}});
  }
  const std::vector<nlohmann::json> got = records(path);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0]["plan"], "x");
  EXPECT_EQ(got[3]["step"], 3);
  EXPECT_EQ(got[4]["loss"], 40);
}

TEST(MetricsLog, AResumedRunHasOneRecordPerStep) {
  testing::ScratchDir dir("metrics_resume");
  testing::write_small_corpus(dir / "data.txt");
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  json["train"]["steps"] = 10;
  json["train"]["checkpoint_interval"] = 4;
  TrainOptions options;
  options.show_progress = false;
  options.metrics_path = dir / "metrics.jsonl";
  train(parse_train_config(json), options);
  // Back to step 4 (as after losing the later checkpoints), and on to the end again.
  options.resume = dir / "run" / "checkpoints" / "step_00000004";
  train(parse_train_config(json), options);
  std::map<int64_t, int> losses;
  int resumed = 0;
  for (const nlohmann::json& r : records(dir / "metrics.jsonl")) {
    if (r.contains("loss")) losses[r["step"].get<int64_t>()]++;
    if (r.contains("resumed_from")) {
      resumed++;
      EXPECT_EQ(r["step"], 4);
    }
  }
  EXPECT_EQ(resumed, 1);
  ASSERT_EQ(losses.size(), 10u);
  for (const auto& [step, count] : losses) EXPECT_EQ(count, 1) << "step " << step;
}

// A step's figures are declared once (step_figures): the metrics record and the per-rank
// figures are made from that table, with the types --metrics has always written.
TEST(StepRecord, TheMetricsRecordAndThePerRankFiguresComeFromOneTable) {
  StepRecord r{.step = 7,
               .loss = 2.5f,
               .lr = 3e-4,
               .grad_norm = 1.25,
               .tokens_per_s = 1000,
               .ms = 12.5,
               .forward_ms = 4,
               .backward_ms = 6,
               .update = {.ms = 2, .h2d_bytes = 10, .d2h_bytes = 20, .early_gradient_subgroups = 3},
               .comm_bytes_sent = 40,
               .comm_bytes_received = 50,
               .collective_ms = 1.5,
               .collective_wait_ms = 0.5};
  std::set<std::string> keys;
  for (const StepFigure& f : step_figures())
    EXPECT_TRUE(keys.insert(std::string(f.key)).second) << f.key;
  const nlohmann::json plain = step_metrics(r, false), overlapped = step_metrics(r, true);
  EXPECT_EQ(plain.size() + 2, overlapped.size());
  EXPECT_FALSE(plain.contains("collective_ms"));
  EXPECT_EQ(overlapped.at("collective_wait_ms").get<double>(), 0.5);
  EXPECT_EQ(plain.at("step").get<int64_t>(), 7);
  EXPECT_TRUE(plain.at("h2d_bytes").is_number_unsigned()) << "byte counts stay integers";
  EXPECT_EQ(plain.at("loss").get<double>(), 2.5);
  EXPECT_EQ(plain.at("lr").get<double>(), 3e-4);
  // The engine's report, written as it gave it.
  EXPECT_EQ(plain.at("update_ms").get<double>(), 2);
  EXPECT_EQ(plain.at("d2h_bytes").get<size_t>(), 20u);
  EXPECT_EQ(plain.at("early_gradient_subgroups").get<size_t>(), 3u);
  // One rank: no ring yardstick and no per-rank figures; several: both from the table.
  EXPECT_FALSE(plain.contains("ring_allreduce_bytes"));
  EXPECT_FALSE(plain.contains("ranks"));
  StepRecord of_two = r;
  of_two.ring_allreduce_bytes = 96;
  const nlohmann::json two = step_metrics(of_two, false, nlohmann::json{{"ms", {1, 2}}});
  EXPECT_EQ(two.at("ring_allreduce_bytes").get<size_t>(), 96u);
  EXPECT_EQ(two.at("ranks").at("ms"), nlohmann::json::array({1, 2}));
  // Two ranks that differ in ms and in bytes sent only.
  const std::vector<double> mine = per_rank_values(r);
  StepRecord other = r;
  other.ms = 13;
  other.comm_bytes_sent = 41;
  std::vector<double> all = mine;
  const std::vector<double> theirs = per_rank_values(other);
  all.insert(all.end(), theirs.begin(), theirs.end());
  const nlohmann::json differ = differing_figures(all, 2);
  EXPECT_EQ(differ.size(), 2u) << differ.dump();
  EXPECT_EQ(differ.at("ms"), nlohmann::json::array({12.5, 13.0}));
  EXPECT_EQ(differ.at("comm_bytes_sent"), nlohmann::json::array({40.0, 41.0}));
}

}  // namespace
}  // namespace tandem
