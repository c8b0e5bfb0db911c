// Data parallelism on the cuda device: the model's gradient and parameter buffers in GPU
// memory, reduced and gathered by a buffer communicator (NCCL on GPUs; on the emulated GPU
// of CI, whose device memory is host memory, the in-process ranks' own communicator), the
// gradient norm from the GPU's block sums. Every ZeRO stage gives the bits of one rank
// accumulating the ranks' micro-batches, on the GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/comm/local_group.h"
#include "tandem/comm/nccl_communicator.h"
#include "tandem/core/error.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {

// Why two ranks cannot run here; empty when they can. The emulated GPU (CI) runs them with
// the in-process communicator; a real machine needs two GPUs for NCCL.
std::string why_not_two_ranks() {
  std::string why;
  const int gpus = cuda_device_count(&why);
  if (gpus == 0) return "no GPU to run on: " + why;
#if !TANDEM_EMULATED_GPU
  if (gpus < 2) return "two ranks need two GPUs for NCCL; this machine has one";
#endif
  return "";
}

// 21.5k parameters: at 2 ranks, a full 16384-parameter partition and a short one.
nlohmann::json gpu_config(const std::filesystem::path& data, const std::filesystem::path& out,
                          int stage, int accum) {
  nlohmann::json json = testing::tiny_run_config(data, out);
  json["model"]["n_embd"] = 32;
  json["model"]["n_layer"] = 1;
  json["train_micro_batch_size_per_gpu"] = 2;
  json["gradient_accumulation_steps"] = accum;
  json["gradient_clipping"] = 0.05;  // active: the norm's bits matter
  json["device"] = {{"type", "cuda"}, {"memory_gb", 1}};
  json["zero_optimization"] = {{"stage", stage}, {"sub_group_size", 7000}};
  json["offload_optimizer"] = {{"schedule", "interleave"}, {"stride", 2}};
  json["train"]["steps"] = 3;
  json["train"]["eval_interval"] = 0;
  return json;
}

// World size 1 runs on any GPU, and a machine with one GPU has nothing else to run data
// parallelism on: every stage's buffers (the stage-3 gathers into the live buffer among
// them) must take the GPU's memory, through the rank's own communicator and through NCCL.
TEST(DataParallelGpu, EveryStageOnOneRankGivesTheBitsOfNoDataParallelism) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no GPU to run on: " << why;
  testing::ScratchDir dir("data_parallel_gpu_one");
  testing::write_small_corpus(dir / "data.txt");
  TrainOptions options;
  options.show_progress = false;
  options.save_checkpoints = false;
  const TrainResult reference =
      train(parse_train_config(gpu_config(dir / "data.txt", dir / "plain", 0, 2)), options);
  ASSERT_EQ(reference.steps.size(), 3u);
#if TANDEM_EMULATED_GPU
  const bool nccl_cases[] = {false};  // the emulated GPU library has no NCCL
#else
  const bool nccl_cases[] = {false, true};
#endif
  for (bool nccl : nccl_cases) {
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (nccl ? ", NCCL" : ", own communicator"));
      const TrainConfig config =
          parse_train_config(gpu_config(dir / "data.txt", dir / "one", stage, 2));
      TrainResult result;
      run_local_ranks(1, [&](Communicator& comm) {
        std::unique_ptr<Communicator> buffers = nccl ? make_nccl_communicator(comm) : nullptr;
        result = train(config, options, comm, buffers.get());
      });
      EXPECT_EQ(result.state_digest, reference.state_digest);
      ASSERT_EQ(result.steps.size(), 3u);
      for (size_t i = 0; i < 3; i++) EXPECT_EQ(result.steps[i].loss, reference.steps[i].loss);
    }
  }
}

TEST(DataParallelGpu, EveryStageOnTwoRanksGivesTheBitsOfOneRankAccumulatingTwo) {
  if (const std::string why = why_not_two_ranks(); !why.empty()) GTEST_SKIP() << why;
  testing::ScratchDir dir("data_parallel_gpu");
  testing::write_small_corpus(dir / "data.txt");
  TrainOptions options;
  options.show_progress = false;
  options.save_checkpoints = false;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    nlohmann::json one = gpu_config(dir / "data.txt", dir / "one", 0, 2);
    one["bf16"] = {{"enabled", bf16}};
    const TrainResult reference = train(parse_train_config(one), options);
    ASSERT_EQ(reference.steps.size(), 3u);
    for (int stage : {0, 1, 2, 3}) {
      nlohmann::json json = gpu_config(dir / "data.txt", dir / "two", stage, 1);
      json["bf16"] = {{"enabled", bf16}};
      const TrainConfig config = parse_train_config(json);
      std::vector<TrainResult> results(2);
      run_local_ranks(2, [&](Communicator& comm) {
#if TANDEM_EMULATED_GPU
        Communicator* buffers = &comm;  // emulated device memory is host memory
#else
        Communicator* buffers = nullptr;  // NCCL
#endif
        results[comm.rank()] = train(config, options, comm, buffers);
      });
      for (const TrainResult& r : results) {
        EXPECT_EQ(r.state_digest, reference.state_digest) << "stage " << stage;
        ASSERT_EQ(r.steps.size(), 3u);
        for (size_t i = 0; i < 3; i++)
          EXPECT_EQ(r.steps[i].loss, reference.steps[i].loss) << "stage " << stage;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
