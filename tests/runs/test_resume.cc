// Resuming is bit-exact: 20 steps straight equal 10 steps + save + resume + 10 steps,
// bit for bit, in parameters, Adam moments and data position.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/model/model_family.h"
#include "tandem/model/param_layout.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {

TEST(Resume, TwentyStepsEqualTenPlusResumePlusTen) {
  testing::ScratchDir dir("resume");
  testing::write_small_corpus(dir / "data.txt");

  TrainOptions quiet;
  quiet.show_progress = false;
  const TrainConfig straight_config =
      parse_train_config(testing::tiny_run_config(dir / "data.txt", dir / "straight"));
  const TrainResult straight = train(straight_config, quiet);
  ASSERT_EQ(straight.steps_done, 20);

  const TrainConfig split_config =
      parse_train_config(testing::tiny_run_config(dir / "data.txt", dir / "split"));
  TrainOptions first_half = quiet;
  first_half.stop_at_step = 10;
  const TrainResult half = train(split_config, first_half);
  ASSERT_EQ(half.steps_done, 10);
  TrainOptions second_half = quiet;
  second_half.resume = dir / "split";
  const TrainResult resumed = train(split_config, second_half);
  ASSERT_EQ(resumed.steps_done, 20);

  const TrainingState a = load_training_checkpoint(straight.last_checkpoint);
  const TrainingState b = load_training_checkpoint(resumed.last_checkpoint);
  EXPECT_EQ(a.step, 20);
  EXPECT_EQ(b.step, 20);
  EXPECT_EQ(a.train_position, b.train_position);
  EXPECT_EQ(a.sample_rng, b.sample_rng);
  // Bitwise equality: compare the raw files of the tensors, not floats with a tolerance.
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(read_file_bytes(straight.last_checkpoint / file),
              read_file_bytes(resumed.last_checkpoint / file))
        << file;
  EXPECT_EQ(straight.last_train_loss, resumed.last_train_loss);
  EXPECT_EQ(straight.last_val_loss, resumed.last_val_loss);

  // And training did something: the weights moved away from the step-10 state.
  const TrainingState mid = load_training_checkpoint(half.last_checkpoint);
  EXPECT_NE(mid.params, a.params);
}

// Past train.max_shard_size the weights are split as Hugging Face's save_pretrained splits
// them (model-0000k-of-0000n.safetensors + model.safetensors.index.json), and a run resumes
// from them bit-exactly.
TEST(Resume, ShardedWeightsFollowHuggingFacesLayoutAndResumeBitExactly) {
  testing::ScratchDir dir("resume_sharded");
  testing::write_small_corpus(dir / "data.txt");
  TrainOptions quiet;
  quiet.show_progress = false;
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "straight");
  json["train"]["steps"] = 6;
  json["train"]["max_shard_size"] = 5000;  // bytes: the 16k-float embedding alone exceeds it
  const TrainResult straight = train(parse_train_config(json), quiet);

  const std::filesystem::path ckpt = straight.last_checkpoint;
  ASSERT_FALSE(std::filesystem::exists(ckpt / "model.safetensors"));
  const nlohmann::json index =
      nlohmann::json::parse(read_file_text(ckpt / "model.safetensors.index.json"));
  const ParamLayout layout = model_layout(parse_train_config(json).model);
  EXPECT_EQ(index["weight_map"].size(), layout.views().size());
  size_t total = 0;
  std::set<std::string> shards;
  for (const ParamView& view : layout.views()) {
    total += view.numel * sizeof(float);
    const std::string file = index["weight_map"][view.name];
    shards.insert(file);
    EXPECT_TRUE(std::filesystem::exists(ckpt / file)) << file;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), total);
  EXPECT_GT(shards.size(), 3u);
  EXPECT_EQ(*shards.begin(),
            cat("model-00001-of-", std::string(5 - std::to_string(shards.size()).size(), '0'),
                shards.size(), ".safetensors"));
  for (const std::string& file : shards) {
    const SafetensorsFile shard = SafetensorsFile::read(ckpt / file);
    // Whole tensors, at most the limit unless one tensor alone is bigger.
    EXPECT_TRUE(std::filesystem::file_size(ckpt / file) < 5000 + 4096 || shard.num_tensors() == 1)
        << file;
  }

  nlohmann::json split = json;
  split["train"]["output_dir"] = (dir / "split").string();
  TrainOptions first = quiet;
  first.stop_at_step = 3;
  train(parse_train_config(split), first);
  TrainOptions second = quiet;
  second.resume = dir / "split";
  const TrainResult resumed = train(parse_train_config(split), second);
  EXPECT_EQ(resumed.state_digest, straight.state_digest);
  const TrainingState a = load_training_checkpoint(straight.last_checkpoint);
  const TrainingState b = load_training_checkpoint(resumed.last_checkpoint);
  EXPECT_EQ(a.params, b.params);
  // A damaged shard is refused, naming it.
  const std::string victim = *shards.rbegin();
  std::string bytes = read_file_text(ckpt / victim);
  bytes[bytes.size() - 1] ^= 1;
  write_file_atomic(ckpt / victim, bytes);
  try {
    load_checkpoint_weights(ckpt);
    FAIL() << "a damaged shard must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(victim), std::string::npos) << e.what();
  }
}

TEST(Resume, RefusesACheckpointOfAnotherModel) {
  testing::ScratchDir dir("resume_mismatch");
  testing::write_small_corpus(dir / "data.txt");
  TrainOptions options;
  options.show_progress = false;
  options.stop_at_step = 2;
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  train(parse_train_config(json), options);

  json["model"]["n_embd"] = 32;
  options.resume = dir / "run";
  try {
    train(parse_train_config(json), options);
    FAIL() << "resuming into a different model must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_embd 16 vs 32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
