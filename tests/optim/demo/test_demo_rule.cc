// DeMo in the update engine (optim/demo/demo_rule.h) on the host-only device and on a GPU (the
// CUDA kernels of demo_cuda.h; skipped, saying why, without one, and run on the emulated GPU
// in CI): on 3 in-process ranks, every offload schedule (device-resident, CPU, staged
// through the device every other subgroup, a ratio) gives the parameters and momentum of
// the library's demo_step on the flat tensors, bit for bit, with the same parameters on
// every rank and the working copy written (fp32, or bf16 with bf16 gradients); a plan that
// splits a tensor is refused naming it.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/comm/local_group.h"
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
#include "tandem/optim/demo/demo.h"
#include "tandem/optim/demo/demo_rule.h"

namespace tandem {
namespace {

const ModelConfig kModel{
    .vocab_size = 64, .context_length = 16, .n_layer = 2, .n_head = 2, .n_embd = 32};
constexpr int kRanks = 3, kSteps = 3;

std::vector<DemoRuleTensor> demo_tensors(const ParamLayout& layout) {
  std::vector<DemoRuleTensor> tensors;
  for (const ParamView& v : layout.views()) tensors.push_back({v.name, v.shape, v.offset});
  return tensors;
}

// kModel's 1-D tensors are of 32 (layer norms, most biases): at compression_topk 40 they
// send their whole block (demo_topk), the 2-D ones 40 of theirs.
DemoHyper hyper(int64_t topk = 32) {
  DemoHyper h;
  h.weight_decay = 0.1;
  h.compression_topk = topk;
  return h;
}

float lr(int step) { return 0.01f * (1.0f - 0.25f * static_cast<float>(step)); }
float scale(int step) { return step == 1 ? 0.5f : 1.0f; }

// Rank r's gradients at each step, and everyone's starting parameters.
struct Problem {
  ParamLayout layout = model_layout(kModel);
  size_t P = layout.num_elements();
  std::vector<float> params;
  std::vector<std::vector<std::vector<float>>> grads;  // [rank][step]
  Problem() : params(P), grads(kRanks) {
    Rng rng(5);
    for (float& p : params) p = rng.normal() * 0.3f;
    for (auto& rank : grads) {
      for (int s = 0; s < kSteps; s++) {
        rank.emplace_back(P);
        for (float& g : rank.back()) g = rng.normal();
      }
    }
  }
};

struct RankState {
  std::vector<float> params, delta, working;
};

// The library on flat arrays: each tensor a DemoTensor, one demo_step per step.
std::vector<RankState> library_run(const Problem& problem, bool bf16 = false, int64_t topk = 32) {
  std::vector<RankState> out(kRanks);
  run_local_ranks(kRanks, [&](Communicator& comm) {
    std::vector<DemoTensor> tensors;
    for (const DemoRuleTensor& t : demo_tensors(problem.layout))
      tensors.emplace_back(t.name, t.shape, hyper(topk));
    std::vector<float> p = problem.params, delta(problem.P, 0.0f), g(problem.P);
    for (int s = 0; s < kSteps; s++) {
      // The clipping scale multiplies the gradient first, as the rule does.
      for (size_t i = 0; i < problem.P; i++) {
        const float grad = problem.grads[comm.rank()][s][i];
        g[i] = scale(s) * (bf16 ? bf16_to_float(float_to_bf16(grad)) : grad);
      }
      std::vector<const DemoTensor*> rules;
      std::vector<DemoArrays> arrays;
      for (size_t t = 0; t < tensors.size(); t++) {
        const size_t o = problem.layout.views()[t].offset;
        rules.push_back(&tensors[t]);
        arrays.push_back({p.data() + o, delta.data() + o, g.data() + o});
      }
      demo_step(rules, arrays, lr(s), comm);
    }
    out[comm.rank()] = {p, delta, {}};
  });
  return out;
}

// bf16: the engine reads bf16 gradients and writes a bf16 working copy (the library is
// given the same gradients rounded to bf16, widened).
std::vector<RankState> engine_run(const Problem& problem, const OffloadSettings& settings,
                                  bool cut_at_tensors, DeviceKind kind = DeviceKind::kHostOnly,
                                  bool bf16 = false, int64_t topk = 32) {
  std::vector<RankState> out(kRanks);
  run_local_ranks(kRanks, [&](Communicator& comm) {
    auto device = kind == DeviceKind::kCuda ? make_cuda_device({}) : make_cpu_device({});
    auto stream = device->create_stream("test");
    ThreadPool pool(2, false);
    const size_t P = problem.P, elem = bf16 ? 2 : 4;
    DeviceAllocation working = device->allocate(MemorySpace::kDevice, P * elem);
    DeviceAllocation grads = device->allocate(MemorySpace::kDevice, P * elem);
    auto rule = std::make_unique<DemoRule>(demo_tensors(problem.layout), hyper(topk), comm, &pool);
    const std::vector<size_t> cuts = cut_at_tensors ? rule->tensor_ends() : std::vector<size_t>{};
    UpdateEngine engine(*device, problem.layout,
                        make_offload_plan(settings, P, ParamRange{0, P}, cuts), std::move(rule),
                        {.working_params = working.data(),
                         .grads = grads.data(),
                         .working_dtype = bf16 ? WorkingDType::kBF16 : WorkingDType::kF32,
                         .grad_dtype = bf16 ? GradDType::kBF16 : GradDType::kF32});
    const std::vector<float> zeros(P, 0.0f);
    const float* load[] = {problem.params.data(), zeros.data()};
    engine.load_state(load, 0);
    std::vector<uint16_t> grads16(P);
    for (int s = 0; s < kSteps; s++) {
      const std::vector<float>& g = problem.grads[comm.rank()][s];
      for (size_t i = 0; i < P; i++) grads16[i] = float_to_bf16(g[i]);
      device->copy_async(grads.data(), bf16 ? static_cast<const void*>(grads16.data()) : g.data(),
                         P * elem, *stream);
      stream->synchronize();
      engine.step(lr(s), scale(s));
    }
    RankState state{std::vector<float>(P), std::vector<float>(P), std::vector<float>(P)};
    float* read[] = {state.params.data(), state.delta.data()};
    engine.read_state(read);
    std::vector<uint16_t> working16(bf16 ? P : 0);
    device->copy_async(bf16 ? static_cast<void*>(working16.data()) : state.working.data(),
                       working.data(), P * elem, *stream);
    stream->synchronize();
    if (bf16)
      for (size_t i = 0; i < P; i++) state.working[i] = bf16_to_float(working16[i]);
    out[comm.rank()] = std::move(state);
  });
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const OffloadSettings kSchedules[] = {
    {.schedule = UpdateSchedule::kDevice, .sub_group_size = 3000},
    {.schedule = UpdateSchedule::kCpu, .sub_group_size = 3000},
    {.schedule = UpdateSchedule::kInterleave, .sub_group_size = 2000, .stride = 2},
    {.schedule = UpdateSchedule::kRatio, .sub_group_size = 1500, .ratio = 0.5},
};

void expect_every_schedule_gives_the_librarys_bits(DeviceKind kind, int64_t topk = 32) {
  const Problem problem;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const std::vector<RankState> want = library_run(problem, bf16, topk);
    for (int r = 1; r < kRanks; r++) ASSERT_TRUE(same_bits(want[r].params, want[0].params));
    // The momenta differ (each rank's own gradients).
    ASSERT_FALSE(same_bits(want[1].delta, want[0].delta));
    for (const OffloadSettings& settings : kSchedules) {
      SCOPED_TRACE(update_schedule_name(settings.schedule));
      const std::vector<RankState> got = engine_run(problem, settings, true, kind, bf16, topk);
      for (int r = 0; r < kRanks; r++) {
        EXPECT_TRUE(same_bits(got[r].params, want[r].params)) << "rank " << r << " params";
        EXPECT_TRUE(same_bits(got[r].delta, want[r].delta)) << "rank " << r << " momentum";
        std::vector<float> working = want[r].params;
        if (bf16)
          for (float& w : working) w = bf16_to_float(float_to_bf16(w));
        EXPECT_TRUE(same_bits(got[r].working, working)) << "rank " << r << " working copy";
      }
    }
  }
}

TEST(DemoRule, EveryScheduleGivesTheLibrarysBitsOnEveryRank) {
  expect_every_schedule_gives_the_librarys_bits(DeviceKind::kHostOnly);
}

TEST(DemoRuleCuda, EveryScheduleGivesTheLibrarysBitsOnEveryRank) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no GPU to run on: " << why;
  expect_every_schedule_gives_the_librarys_bits(DeviceKind::kCuda);
}

// A compression_topk above some tensors' blocks is clamped to each (demo_topk, as the
// reference does), on the CPU and in the GPU's workspace and kernels alike: every schedule
// still gives the library's bits.
TEST(DemoRule, ATopkAboveSomeBlocksIsClampedPerTensorOnEverySchedule) {
  expect_every_schedule_gives_the_librarys_bits(DeviceKind::kHostOnly, 40);
}

TEST(DemoRuleCuda, ATopkAboveSomeBlocksIsClampedPerTensorOnEverySchedule) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no GPU to run on: " << why;
  expect_every_schedule_gives_the_librarys_bits(DeviceKind::kCuda, 40);
}

TEST(DemoRule, APlanThatSplitsATensorIsRefusedNamingIt) {
  const Problem problem;
  const std::string message = testing::error_of([&] {
    engine_run(problem, {.schedule = UpdateSchedule::kCpu, .sub_group_size = 1000}, false);
  });
  EXPECT_CONTAINS(message, "splits tensor transformer.wte.weight");
  EXPECT_CONTAINS(message, "subgroups must be cut at tensor boundaries");
}

// A compression_topk above a tensor's block is clamped to it, as the reference does, and
// said in one line: the first few tensors with their block's size, and how many more.
TEST(DemoRule, ATopkAboveABlockIsClampedAndTheNoteNamesTheTensors) {
  const std::vector<DemoRuleTensor> tensors = {
      {"w", {64, 64}, 0}, {"bias", {37}, 4096}, {"ln", {20}, 4096 + 37}};
  run_local_ranks(1, [&](Communicator& comm) {
    DemoRule rule(tensors, DemoHyper{.compression_topk = 40}, comm, nullptr);
    EXPECT_EQ(rule.tensor_ends(), (std::vector<size_t>{4096, 4096 + 37, 4096 + 57}));
  });
  EXPECT_EQ(DemoRule::topk_note(tensors, DemoHyper{.compression_topk = 40}),
            "DeMo: optimizer.params.compression_topk 40 is clamped to the DCT block of 2 "
            "tensors (sent whole, as the reference does): bias (37), ln (20)");
  EXPECT_EQ(DemoRule::topk_note(tensors, DemoHyper{.compression_topk = 20}), "");
  std::vector<DemoRuleTensor> many;
  for (size_t i = 0; i < 7; i++) many.push_back({cat("b", i), {7}, 7 * i});
  EXPECT_EQ(DemoRule::topk_note(many, DemoHyper{.compression_topk = 8}),
            "DeMo: optimizer.params.compression_topk 8 is clamped to the DCT block of 7 "
            "tensors (sent whole, as the reference does): b0 (7), b1 (7), b2 (7), b3 (7) and 3 "
            "more");
}

}  // namespace
}  // namespace tandem
