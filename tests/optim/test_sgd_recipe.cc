// The optimizer recipe of docs/architecture.md ("Where do I add ... an optimizer"), proved by
// doing it: SGD with momentum (optim/sgd/) touches optim/sgd/sgd.cc, optim/sgd/sgd_cuda.cu and
// optim/optimizer_family.h, nothing else outside tests/. Here it updates as a scalar
// reference does, bit for bit, under every offload schedule on the cpu device and on a GPU
// (the emulated one in CI: test_sgd_recipe_emulated), trains a whole run on two ranks, reads
// its own optimizer.params, and inherits nothing of DeMo's: no "demo" section, no replica
// check, whether its row reduces gradients or not.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "support/train_on_ranks.h"
#include "tandem/comm/local_group.h"
#include "tandem/config/train_config.h"
#include "tandem/core/half.h"
#include "tandem/core/rng.h"
#include "tandem/core/thread_pool.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/device/device.h"
#include "tandem/model/model_config.h"
#include "tandem/model/model_family.h"
#include "tandem/model/param_layout.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/offload/update_engine.h"
#include "tandem/offload/update_types.h"
#include "tandem/optim/optimizer_family.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const ModelConfig kModel{
    .vocab_size = 64, .context_length = 16, .n_layer = 2, .n_head = 2, .n_embd = 32};
constexpr int kSteps = 3;
constexpr float kMomentum = 0.8f, kDecay = 0.1f;

double lr(int step) { return 0.01 * (1.0 - 0.25 * step); }
float scale(int step) { return step == 1 ? 0.5f : 1.0f; }

// The config as a run gives it: optimizer.type SGD with its own momentum.
OptimizerConfig sgd_config() {
  return parse_train_config(
             {{"data", {{"train_path", "unused.txt"}}},
              {"optimizer",
               {{"type", "sgd"}, {"params", {{"momentum", kMomentum}, {"weight_decay", kDecay}}}}}})
      .optimizer;
}

struct Problem {
  ParamLayout layout = model_layout(kModel);
  size_t P = layout.num_elements();
  std::vector<float> params;
  std::vector<std::vector<float>> grads;  // [step]
  Problem() : params(P), grads(kSteps, std::vector<float>(P)) {
    Rng rng(11);
    for (float& p : params) p = rng.normal() * 0.3f;
    for (auto& step : grads)
      for (float& g : step) g = rng.normal();
  }
};

struct State {
  std::vector<float> params, momentum, working;
};

// PyTorch's SGD (dampening 0, the buffer from 0), written out element by element in float.
State reference(const Problem& problem, bool bf16) {
  State s{problem.params, std::vector<float>(problem.P, 0.0f), {}};
  std::vector<char> decays(problem.P, 0);
  for (const UpdateSegment& segment : decay_segments(problem.layout))
    for (size_t i = segment.begin; i < segment.end; i++) decays[i] = segment.weight_decay;
  for (int step = 0; step < kSteps; step++) {
    const float lr_f = static_cast<float>(lr(step));
    for (size_t i = 0; i < problem.P; i++) {
      float grad = problem.grads[step][i];
      if (bf16) grad = bf16_to_float(float_to_bf16(grad));
      float g = grad * scale(step);
      if (decays[i]) g = std::fma(kDecay, s.params[i], g);
      s.momentum[i] = std::fma(kMomentum, s.momentum[i], g);
      s.params[i] = std::fma(-lr_f, s.momentum[i], s.params[i]);
    }
  }
  s.working = s.params;
  if (bf16)
    for (float& w : s.working) w = bf16_to_float(float_to_bf16(w));
  return s;
}

// The rule its row makes, in the update engine.
State engine_run(const Problem& problem, const OffloadSettings& settings, DeviceKind kind,
                 bool bf16) {
  LocalGroup group(1);
  const std::unique_ptr<Communicator> comm = group.communicator(0);
  auto device = kind == DeviceKind::kCuda ? make_cuda_device({}) : make_cpu_device({});
  auto stream = device->create_stream("test");
  ThreadPool pool(2, false);
  const size_t P = problem.P, elem = bf16 ? 2 : 4;
  DeviceAllocation working = device->allocate(MemorySpace::kDevice, P * elem);
  DeviceAllocation grads = device->allocate(MemorySpace::kDevice, P * elem);
  const OptimizerFamily& family = *find_optimizer_family("SGD");
  UpdateEngine engine(
      *device, problem.layout,
      make_offload_plan(settings, P, ParamRange{0, P}, family.subgroup_cut_points(problem.layout)),
      family.make_rule(sgd_config(), problem.layout, *comm, pool),
      {.working_params = working.data(),
       .grads = grads.data(),
       .working_dtype = bf16 ? WorkingDType::kBF16 : WorkingDType::kF32,
       .grad_dtype = bf16 ? GradDType::kBF16 : GradDType::kF32});
  const std::vector<float> zeros(P, 0.0f);
  const float* load[] = {problem.params.data(), zeros.data()};
  engine.load_state(load, 0);
  std::vector<uint16_t> grads16(P);
  for (int s = 0; s < kSteps; s++) {
    const std::vector<float>& g = problem.grads[s];
    for (size_t i = 0; i < P; i++) grads16[i] = float_to_bf16(g[i]);
    device->copy_async(grads.data(), bf16 ? static_cast<const void*>(grads16.data()) : g.data(),
                       P * elem, *stream);
    stream->synchronize();
    engine.step(lr(s), scale(s));
  }
  engine.finish_update();
  State state{std::vector<float>(P), std::vector<float>(P), std::vector<float>(P)};
  float* read[] = {state.params.data(), state.momentum.data()};
  engine.read_state(read);
  std::vector<uint16_t> working16(bf16 ? P : 0);
  device->copy_async(bf16 ? static_cast<void*>(working16.data()) : state.working.data(),
                     working.data(), P * elem, *stream);
  stream->synchronize();
  if (bf16)
    for (size_t i = 0; i < P; i++) state.working[i] = bf16_to_float(working16[i]);
  return state;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_every_schedule_gives_the_references_bits(DeviceKind kind) {
  const Problem problem;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const State want = reference(problem, bf16);
    for (const OffloadSettings& settings : {
             OffloadSettings{.schedule = UpdateSchedule::kDevice, .sub_group_size = 3000},
             OffloadSettings{.schedule = UpdateSchedule::kCpu, .sub_group_size = 3000},
             OffloadSettings{
                 .schedule = UpdateSchedule::kInterleave, .sub_group_size = 2000, .stride = 2},
             OffloadSettings{
                 .schedule = UpdateSchedule::kRatio, .sub_group_size = 1500, .ratio = 0.5},
         }) {
      SCOPED_TRACE(update_schedule_name(settings.schedule));
      const State got = engine_run(problem, settings, kind, bf16);
      EXPECT_TRUE(same_bits(got.params, want.params)) << "params";
      EXPECT_TRUE(same_bits(got.momentum, want.momentum)) << "momentum";
      EXPECT_TRUE(same_bits(got.working, want.working)) << "working copy";
    }
  }
}

TEST(SgdRecipe, EveryScheduleOnTheCpuDeviceGivesTheScalarReferencesBits) {
  expect_every_schedule_gives_the_references_bits(DeviceKind::kHostOnly);
}

TEST(SgdRecipeCuda, EveryScheduleOnTheGpuGivesTheScalarReferencesBits) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no GPU to run on: " << why;
  expect_every_schedule_gives_the_references_bits(DeviceKind::kCuda);
}

TEST(SgdRecipe, ItsRowReadsItsOwnParamsAndNoDemoSection) {
  const OptimizerFamily* family = find_optimizer_family("SGD");
  ASSERT_NE(family, nullptr);
  EXPECT_TRUE(family->reduces_gradients);
  EXPECT_FALSE(family->state_per_rank);
  EXPECT_TRUE(family->sections.empty());
  EXPECT_EQ(family->make_hooks, nullptr);
  EXPECT_EQ(family->state_names(), std::vector<std::string>{"momentum_buffer"});
  json config = {{"data", {{"train_path", "unused.txt"}}},
                 {"optimizer", {{"type", "SGD"}, {"params", {{"momentum", 0.5}, {"lr", 0.1}}}}}};
  const TrainConfig c = parse_train_config(config);
  EXPECT_EQ(c.optimizer.type, family->type);
  EXPECT_EQ(c.optimizer.lr, 0.1);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);  // its own default
  const json written = to_json(c);
  EXPECT_EQ(written["optimizer"]["params"],
            (json{{"lr", 0.1}, {"momentum", 0.5}, {"weight_decay", 0.0}}));
  EXPECT_FALSE(written.contains("demo"));
  EXPECT_EQ(to_json(parse_train_config(written)), written);
  json wrong = config;
  wrong["optimizer"]["params"]["momentum"] = 1.0;
  EXPECT_CONTAINS(testing::error_of([&] { parse_train_config(wrong); }),
                  "optimizer.params.momentum must be a number in [0, 1)");
  wrong = config;
  wrong["optimizer"]["params"]["compression_topk"] = 8;
  EXPECT_CONTAINS(testing::error_of([&] { parse_train_config(wrong); }),
                  "optimizer.params.compression_topk is a parameter of optimizer.type DeMo, not "
                  "of SGD");
  wrong = config;
  wrong["demo"] = {{"replica_check_interval", 1}};
  EXPECT_CONTAINS(testing::error_of([&] { parse_train_config(wrong); }),
                  "demo.replica_check_interval applies to optimizer.type DeMo only");
}

// A whole run on two ranks: the loss falls, the ranks agree, and no step records a replica
// check (DeMo's, which came to any optimizer that did not reduce gradients before it moved
// into DeMo's row).
TEST(SgdRecipe, TrainsOnTwoRanksWithNoReplicaCheck) {
  testing::ScratchDir dir("sgd_recipe");
  testing::write_small_corpus(dir / "data.txt");
  json config = testing::tiny_run_config(dir / "data.txt", dir / "out");
  config["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.3}, {"momentum", 0.9}}}};
  config["train"]["steps"] = 12;
  TrainOptions options;
  options.metrics_path = dir / "metrics.jsonl";
  const testing::RankResults run = testing::train_on_ranks(2, config, options);
  for (const std::string& error : run.errors) ASSERT_EQ(error, "");
  testing::expect_ranks_agree(run, "2 ranks");
  const std::vector<float> losses = testing::losses(run.by_rank[0]);
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses.back(), losses.front());
  std::ifstream metrics(dir / "metrics.jsonl");
  std::string line;
  int steps = 0;
  while (std::getline(metrics, line)) {
    const json record = json::parse(line);
    if (!record.contains("loss")) continue;
    steps++;
    EXPECT_FALSE(record.contains("replicas_identical")) << line;
  }
  EXPECT_EQ(steps, 12);
}

// The hooks a run gets come from its row's make_hooks alone (train/step_runner.cc): a row that
// does not reduce gradients, as DeMo's does not, still brings none unless it names them.
TEST(SgdRecipe, ARowThatDoesNotReduceGradientsBringsNoHooksOfDeMos) {
  OptimizerFamily local = *find_optimizer_family("SGD");
  local.reduces_gradients = false;
  local.state_per_rank = true;
  EXPECT_EQ(local.make_hooks, nullptr);
  for (const OptimizerFamily& family : optimizer_families()) {
    SCOPED_TRACE(std::string(family.name));
    // Only DeMo names a section and hooks of its own.
    EXPECT_EQ(family.make_hooks != nullptr, family.name == "DeMo");
    EXPECT_EQ(!family.sections.empty(), family.name == "DeMo");
  }
}

}  // namespace
}  // namespace tandem
