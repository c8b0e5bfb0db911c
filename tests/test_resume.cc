// Resuming is bit-exact: 20 steps straight equal 10 steps + save + resume + 10 steps,
// bit for bit, in parameters, Adam moments and data position.
#include <gtest/gtest.h>

#include <string>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/train/train_checkpoint.h"
#include "tandem/train/trainer.h"
#include "test_util.h"

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
