// offload_optimizer.overlap_forward through the whole trainer: the next forward starts
// while the update still runs, each block waiting for its own parameters, and nothing
// changes numerically: the same state digest and losses as waiting for the whole update,
// under every schedule, for both families in fp32 and bf16, at every ZeRO stage on 2
// in-process ranks and with DeMo. The trace shows the forward lane starting before the
// update's lanes end, and the metrics the update time hidden behind it.

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "support/train_on_ranks.h"
#include "tandem/config/train_config.h"
#include "tandem/core/format.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {

using json = nlohmann::json;

class OverlapForward : public ::testing::Test {
 protected:
  void SetUp() override { testing::write_small_corpus(data_); }

  json config(const std::string& run, bool llama = false) const {
    json c = testing::tiny_run_config(data_, dir_ / run);
    c["model"]["n_layer"] = 3;
    if (llama)
      c["model"] = {
          {"type", "llama"},          {"vocab_size", 256},      {"max_position_embeddings", 16},
          {"hidden_size", 16},        {"num_hidden_layers", 3}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"intermediate_size", 24}};
    c["train"]["steps"] = 5;
    c["train"]["eval_interval"] = 2;
    // Subgroups smaller than a layer: a block waits for several, and they end inside blocks.
    c["zero_optimization"]["sub_group_size"] = 1500;
    return c;
  }

  struct Trained {
    std::string digest;
    std::vector<float> losses;
    double hidden_ms = 0;  // update_hidden_ms over the steps, rank 0
  };

  static Trained trained(json c, bool overlap, int ranks) {
    c["offload_optimizer"]["overlap_forward"] = overlap;
    c["train"]["output_dir"] = cat(c["train"]["output_dir"].get<std::string>(), "_", overlap);
    const testing::RankResults results = testing::train_on_ranks(ranks, c);
    testing::expect_ranks_agree(results, cat("overlap_forward ", overlap));
    Trained t{results.by_rank[0].state_digest, testing::losses(results.by_rank[0])};
    for (const StepRecord& s : results.by_rank[0].steps) t.hidden_ms += s.update_hidden_ms;
    return t;
  }

  // Returns the update time the overlapped run hid.
  static double expect_same_bits_both_ways(const json& c, int ranks) {
    const Trained waited = trained(c, false, ranks);
    EXPECT_FALSE(waited.digest.empty());
    EXPECT_EQ(waited.hidden_ms, 0.0) << "without overlap nothing runs behind the forward";
    const Trained overlapped = trained(c, true, ranks);
    EXPECT_EQ(overlapped.digest, waited.digest);
    EXPECT_EQ(overlapped.losses, waited.losses);
    return overlapped.hidden_ms;
  }

  testing::ScratchDir dir_{"overlap_forward"};
  std::filesystem::path data_ = dir_ / "corpus.txt";
};

TEST_F(OverlapForward, GivesTheBitsOfWaitingForTheWholeUpdateUnderEverySchedule) {
  for (bool llama : {false, true})
    for (const char* schedule : {"cpu", "ratio", "interleave", "device"}) {
      const bool bf16 = std::string(schedule) == "cpu" || std::string(schedule) == "interleave";
      SCOPED_TRACE(cat(llama ? "llama " : "gpt2 ", schedule, bf16 ? " bf16" : " fp32"));
      json c = config(cat("run_", llama, schedule), llama);
      c["bf16"] = {{"enabled", bf16}};
      c["offload_optimizer"] = {{"schedule", schedule}, {"ratio", 0.5}, {"stride", 2}};
      expect_same_bits_both_ways(c, 1);
    }
}

// Stages 1 and 2 gather the new parameters at once, so there the update ends first; stage 3
// gathers each block as the forward acquires it, each owner sending its piece once its update
// of it is done, so the update runs on behind the forward as at stage 0.
TEST_F(OverlapForward, GivesTheBitsOfWaitingForTheWholeUpdateAtEveryZeroStage) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(cat("stage ", stage));
    json c = config(cat("stage", stage));
    c["zero_optimization"]["stage"] = stage;
    c["zero_optimization"]["stage3_max_live_parameters"] = 2000;
    c["offload_optimizer"] = {{"schedule", "cpu"}};
    const double hidden_ms = expect_same_bits_both_ways(c, 2);
    if (stage == 1 || stage == 2)
      EXPECT_EQ(hidden_ms, 0.0);
    else
      EXPECT_GT(hidden_ms, 0.0) << "the update never ran behind the forward";
  }
}

TEST_F(OverlapForward, GivesTheBitsOfWaitingForTheWholeUpdateWithDemo) {
  json c = config("demo");
  c["optimizer"] = {{"type", "DeMo"}, {"params", {{"lr", 1e-3}, {"compression_topk", 4}}}};
  c["offload_optimizer"] = {{"schedule", "interleave"}, {"stride", 2}};
  expect_same_bits_both_ways(c, 2);
}

// With every host-to-device copy slowed down, the update of step 2 is still copying its
// working parameters back when step 3's forward begins: the trace shows it, and the step's
// metrics count the update time that ran behind it.
TEST_F(OverlapForward, TheTraceShowsTheForwardStartingBeforeTheUpdateEnds) {
  json c = config("trace");
  c["offload_optimizer"] = {{"schedule", "cpu"}};
  c["train"]["steps"] = 3;
  c["train"]["eval_interval"] = 0;
  const TrainConfig config = parse_train_config(c);
  TrainOptions options = testing::quiet();
  options.trace_path = dir_ / "trace.json";
  options.trace_first_step = 2;
  options.trace_last_step = 3;
  options.cpu_device_injection = {.slow_stream = "host-to-device", .slow_copy_ms = 3};
  const TrainResult result = train(config, options);
  ASSERT_EQ(result.steps.size(), 3u);
  EXPECT_EQ(result.steps[0].update_hidden_ms, 0.0) << "no update before the first step";
  EXPECT_GT(result.steps[2].update_hidden_ms, 0.0);

  std::ifstream in(options.trace_path);
  const json trace = json::parse(in);
  std::map<int, std::string> lanes;
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") lanes[e["tid"]] = e["args"]["name"];
  auto begin_of = [&](const std::string& name, double after) {
    double begin = -1;
    for (const json& e : trace["traceEvents"])
      if (e["ph"] == "X" && e["name"] == name && e["ts"].get<double>() > after &&
          (begin < 0 || e["ts"].get<double>() < begin))
        begin = e["ts"].get<double>();
    return begin;
  };
  const double update_2 = begin_of("optimizer step 2", 0);
  const double update_3 = begin_of("optimizer step 3", update_2);
  const double forward_3 = begin_of("forward 0", update_2);
  ASSERT_GE(update_2, 0);
  ASSERT_GT(update_3, forward_3);
  ASSERT_GT(forward_3, update_2);
  // Step 2's update: its CPU updates and working copies, queued before step 3's update.
  double update_2_end = -1;
  size_t working_copies = 0;
  for (const json& e : trace["traceEvents"]) {
    const double begin = e.value("ts", -1.0);
    if (e["ph"] != "X" || begin < update_2 || begin >= update_3) continue;
    const std::string& lane = lanes[e["tid"]];
    if (lane != "cpu update" && lane != "host-to-device") continue;
    update_2_end = std::max(update_2_end, begin + e["dur"].get<double>());
    if (lane == "host-to-device") working_copies++;
  }
  ASSERT_GT(working_copies, 1u) << "step 2's working copies are not in the trace";
  EXPECT_GT(update_2_end, forward_3)
      << "step 3's forward began only after step 2's update had ended";
}

TEST_F(OverlapForward, IsOnByDefaultAndWrittenBack) {
  json c = config("keys");
  EXPECT_TRUE(parse_train_config(c).offload.overlap_forward);
  c["offload_optimizer"] = {{"overlap_forward", false}};
  const TrainConfig parsed = parse_train_config(c);
  EXPECT_FALSE(parsed.offload.overlap_forward);
  EXPECT_EQ(to_json(parsed)["offload_optimizer"]["overlap_forward"], false);
  c["offload_optimizer"] = {{"overlap_forward", 1}};
  EXPECT_CONTAINS(testing::error_of([&] { parse_train_config(c); }),
                  "offload_optimizer.overlap_forward");
}

}  // namespace
}  // namespace tandem
