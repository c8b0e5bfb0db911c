// The update engine on the CPU device backend: every schedule (device, cpu, ratio,
// interleave) with several subgroup sizes, strides and staging-buffer counts gives
// parameters, m and v bit-identical to one plain AdamW over the flat arrays; a failed
// copy in the middle of a step leaves every subgroup entirely old or entirely new; a
// device too small is refused with the bytes and the settings to change.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/test_util.h"
#include "tandem/core/half.h"
#include "tandem/core/rng.h"
#include "tandem/core/thread_pool.h"
#include "tandem/device/cpu/cpu_device.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/device/device.h"
#include "tandem/model/model_family.h"
#include "tandem/model/param_layout.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/offload/perf_model.h"
#include "tandem/offload/snapshot_pool.h"
#include "tandem/offload/update_engine.h"
#include "tandem/offload/update_rule.h"
#include "tandem/optim/adamw/adamw_rule.h"
#include "tandem/optim/adamw/adamw_timing.h"
#include "tandem/optim/adamw/cpu_adamw.h"

namespace tandem {
namespace {

const ModelConfig kModel{
    .vocab_size = 64, .context_length = 16, .n_layer = 2, .n_head = 2, .n_embd = 32};
const AdamWHyper kHyper{
    .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
constexpr int kSteps = 3;

struct Problem {
  ParamLayout layout = model_layout(kModel);
  size_t P = layout.num_elements();
  std::vector<float> params, m, v;
  std::vector<std::vector<float>> grads;  // per step

  Problem() : params(P), m(P, 0.0f), v(P, 0.0f) {
    Rng rng(17);
    for (float& p : params) p = rng.normal();
    for (int s = 0; s < kSteps; s++) {
      grads.emplace_back(P);
      for (float& g : grads.back()) g = rng.normal() * 0.1f;
    }
  }
  // bf16 gradients hold exactly the bf16-rounded values.
  static std::vector<float> rounded(const std::vector<float>& g, GradDType dtype) {
    if (dtype == GradDType::kF32) return g;
    std::vector<float> r(g.size());
    for (size_t i = 0; i < g.size(); i++) r[i] = bf16_to_float(float_to_bf16(g[i]));
    return r;
  }
  static float lr(int s) { return kHyper.lr * (1.0f - 0.2f * s); }
  static float scale(int s) { return s == 1 ? 0.5f : 1.0f; }

  // Plain AdamW over the flat arrays: the expected result of every schedule.
  void reference(std::vector<float>& p, std::vector<float>& mm, std::vector<float>& vv, int steps,
                 GradDType grad_dtype = GradDType::kF32) const {
    p = params;
    mm = m;
    vv = v;
    for (int s = 0; s < steps; s++) {
      AdamWHyper hyper = kHyper;
      hyper.lr = lr(s);
      const std::vector<float> g = rounded(grads[s], grad_dtype);
      for (const UpdateSegment& seg : decay_segments(layout))
        adamw_reference(
            AdamWArrays{.params = p.data(), .m = mm.data(), .v = vv.data(), .grads = g.data()}
                .slice(seg.begin),
            seg.end - seg.begin, adamw_step_scalars(hyper, s + 1, seg.weight_decay, scale(s)));
    }
  }
};

struct EngineRun {
  std::unique_ptr<Device> device;
  ThreadPool pool{2};
  DeviceAllocation working, grads;
  std::unique_ptr<UpdateEngine> engine;

  WorkingDType working_dtype;

  EngineRun(const Problem& problem, const OffloadSettings& settings, CpuDeviceOptions options = {},
            WorkingDType working_dtype = WorkingDType::kF32)
      : EngineRun(problem, settings, make_cpu_device(options), working_dtype) {}

  GradDType grad_dtype = GradDType::kF32;

  EngineRun(const Problem& problem, const OffloadSettings& settings,
            std::unique_ptr<Device> device_in, WorkingDType working_dtype,
            GradDType grad_dtype = GradDType::kF32)
      : device(std::move(device_in)), working_dtype(working_dtype), grad_dtype(grad_dtype) {
    working = device->allocate(MemorySpace::kDevice, problem.P * sizeof(float));
    grads = device->allocate(MemorySpace::kDevice, problem.P * sizeof(float));
    engine = std::make_unique<UpdateEngine>(
        *device, problem.layout, make_offload_plan(settings, problem.P),
        std::make_unique<AdamWRule>(kHyper, pool),
        UpdateEngine::DeviceBuffers{working.data(), grads.data(), working_dtype, grad_dtype});
    engine->load_state(problem.params.data(), problem.m.data(), problem.v.data(), 0);
  }
  void upload_grads(const std::vector<float>& g) {
    auto stream = device->create_stream("test");
    std::vector<uint16_t> g16;
    if (grad_dtype == GradDType::kBF16) {
      for (float x : g) g16.push_back(float_to_bf16(x));
      device->copy_async(grads.data(), g16.data(), g16.size() * 2, *stream);
    } else {
      device->copy_async(grads.data(), g.data(), g.size() * sizeof(float), *stream);
    }
    stream->synchronize();
  }
  void read(const Problem& problem, std::vector<float>& p, std::vector<float>& m,
            std::vector<float>& v, std::vector<float>& w) {
    p.assign(problem.P, 0);
    m.assign(problem.P, 0);
    v.assign(problem.P, 0);
    w.assign(problem.P, 0);
    engine->read_state(p.data(), m.data(), v.data());
    auto stream = device->create_stream("test");
    if (working_dtype == WorkingDType::kF32) {
      device->copy_async(w.data(), working.data(), problem.P * sizeof(float), *stream);
      stream->synchronize();
      return;
    }
    // 16-bit working copy: widen to float, so that tests compare it with the rounded params.
    std::vector<uint16_t> w16(problem.P);
    device->copy_async(w16.data(), working.data(), problem.P * 2, *stream);
    stream->synchronize();
    for (size_t i = 0; i < problem.P; i++)
      w[i] = working_dtype == WorkingDType::kBF16 ? bf16_to_float(w16[i]) : fp16_to_float(w16[i]);
  }
};

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string describe(const OffloadSettings& s) {
  return cat(update_schedule_name(s.schedule), " sub_group_size=", s.sub_group_size,
             " ratio=", s.ratio, " stride=", s.stride, " staging=", s.staging_buffers);
}

// Every schedule x subgroup size x stride x staging count, with fp32, bf16 and fp16
// working copies in turn, on the device that make_device returns.
// The expected state after kSteps for one gradient dtype, and the working copy as each
// working dtype rounds the params.
struct Want {
  std::vector<float> p, m, v, p_bf16, p_fp16;

  Want(const Problem& problem, GradDType grad_dtype) {
    problem.reference(p, m, v, kSteps, grad_dtype);
    for (float x : p) {
      p_bf16.push_back(bf16_to_float(float_to_bf16(x)));
      p_fp16.push_back(fp16_to_float(float_to_fp16(x)));
    }
  }
  const std::vector<float>& working(WorkingDType dtype) const {
    return dtype == WorkingDType::kF32 ? p : dtype == WorkingDType::kBF16 ? p_bf16 : p_fp16;
  }
};

// Every schedule x subgroup size x stride x staging count, with fp32/bf16/fp16 working
// copies and fp32/bf16 gradients in turn, on the device that make_device returns.
void check_every_schedule(const std::function<std::unique_ptr<Device>()>& make_device) {
  const Problem problem;
  const Want want_f32_grads(problem, GradDType::kF32), want_bf16_grads(problem, GradDType::kBF16);

  std::vector<OffloadSettings> cases;
  for (size_t sub_group_size : {size_t{777}, size_t{4096}, problem.P, problem.P + 5}) {
    cases.push_back({.schedule = UpdateSchedule::kCpu, .sub_group_size = sub_group_size});
    cases.push_back({.schedule = UpdateSchedule::kDevice, .sub_group_size = sub_group_size});
    for (double ratio : {0.0, 0.25, 0.5, 1.0})
      cases.push_back(
          {.schedule = UpdateSchedule::kRatio, .sub_group_size = sub_group_size, .ratio = ratio});
    for (int stride : {1, 2, 3})
      for (int staging : {1, 2})
        cases.push_back({.schedule = UpdateSchedule::kInterleave,
                         .sub_group_size = sub_group_size,
                         .stride = stride,
                         .staging_buffers = staging});
  }
  size_t index = 0;
  for (const OffloadSettings& settings : cases) {
    const WorkingDType working_dtype =
        std::array{WorkingDType::kF32, WorkingDType::kBF16, WorkingDType::kF16}[index % 3];
    // Out of step with the working dtypes, so that every pair occurs.
    const GradDType grad_dtype = (index / 3) % 2 == 0 ? GradDType::kF32 : GradDType::kBF16;
    index++;
    const Want& want = grad_dtype == GradDType::kF32 ? want_f32_grads : want_bf16_grads;
    EngineRun run(problem, settings, make_device(), working_dtype, grad_dtype);
    const size_t working_bytes = working_dtype == WorkingDType::kF32 ? 4 : 2;
    const size_t grad_bytes = grad_dtype == GradDType::kF32 ? 4 : 2;
    for (int s = 0; s < kSteps; s++) {
      run.upload_grads(problem.grads[s]);
      const UpdateStepStats stats = run.engine->step(Problem::lr(s), Problem::scale(s));
      if (settings.schedule == UpdateSchedule::kDevice) {
        EXPECT_EQ(stats.h2d_bytes + stats.d2h_bytes, 0u);
      }
      if (settings.schedule == UpdateSchedule::kCpu) {
        EXPECT_EQ(stats.d2h_bytes, problem.P * grad_bytes) << "gradients";
        EXPECT_EQ(stats.h2d_bytes, problem.P * working_bytes) << "working params";
      }
    }
    std::vector<float> p, m, v, w;
    run.read(problem, p, m, v, w);
    const std::string what =
        describe(settings) + cat(" working dtype ", static_cast<int>(working_dtype), " grad dtype ",
                                 static_cast<int>(grad_dtype));
    EXPECT_TRUE(bitwise_equal(p, want.p)) << what;
    EXPECT_TRUE(bitwise_equal(m, want.m)) << what;
    EXPECT_TRUE(bitwise_equal(v, want.v)) << what;
    EXPECT_TRUE(bitwise_equal(w, want.working(working_dtype))) << "working params, " << what;
    EXPECT_EQ(run.engine->step_count(), kSteps);
  }
  // The two gradient dtypes really lead to different states (the test could tell them apart).
  EXPECT_FALSE(bitwise_equal(want_f32_grads.p, want_bf16_grads.p));
}

TEST(UpdateEngine, EveryScheduleIsBitIdenticalToPlainAdamW) {
  check_every_schedule([] { return make_cpu_device({}); });
}

// The same on a GPU: the CUDA AdamW kernel, cudaMemcpyAsync staging and CUDA events
// must give the CPU's bits.
TEST(UpdateEngine, EveryScheduleIsBitIdenticalOnTheCudaDevice) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no GPU to run on: " << why;
  check_every_schedule([] { return make_cuda_device({}); });
}

TEST(UpdateEngine, GradientsAnnouncedDuringBackwardStartEarlyAndChangeNothing) {
  const Problem problem;
  std::vector<float> want_p, want_m, want_v;
  problem.reference(want_p, want_m, want_v, kSteps);
  const OffloadSettings settings{
      .schedule = UpdateSchedule::kInterleave, .sub_group_size = 1000, .stride = 3};
  EngineRun run(problem, settings);
  const OffloadPlan& plan = run.engine->plan();
  for (int s = 0; s < kSteps; s++) {
    run.upload_grads(problem.grads[s]);
    // As backward does: from the end of the flat space down, in uneven pieces.
    size_t expected_early = 0;
    const size_t low = problem.P / 3;
    for (size_t end = problem.P; end > low;) {
      const size_t begin = std::max(low, end > 1700 ? end - 1700 : 0);
      run.engine->gradients_ready(begin, end);
      end = begin;
    }
    for (const Subgroup& sg : plan.subgroups)
      if (sg.site == UpdateSite::kHost && sg.begin >= low) expected_early++;
    const UpdateStepStats stats = run.engine->step(Problem::lr(s), Problem::scale(s));
    EXPECT_EQ(stats.early_gradient_subgroups, expected_early);
    EXPECT_GT(expected_early, 0u);
  }
  std::vector<float> p, m, v, w;
  run.read(problem, p, m, v, w);
  EXPECT_TRUE(bitwise_equal(p, want_p));
  EXPECT_TRUE(bitwise_equal(m, want_m));
  EXPECT_TRUE(bitwise_equal(v, want_v));
}

// A lazy snapshot taken after step 1 holds step 1's state though step 2 runs while its
// copies are still queued: the snapshot stream is slowed (each copy sleeps first), so
// without the per-subgroup waits step 2 would overwrite state before it was copied. Every
// site: host, resident and staged subgroups, under each schedule. The step's result is
// unchanged, and the wait is counted.
TEST(UpdateEngine, ALazySnapshotHoldsItsStepsStateWhileTheNextStepRuns) {
  const Problem problem;
  std::vector<float> want_p1, want_m1, want_v1, want_p2, want_m2, want_v2;
  problem.reference(want_p1, want_m1, want_v1, 1);
  problem.reference(want_p2, want_m2, want_v2, 2);
  for (const OffloadSettings& settings : std::vector<OffloadSettings>{
           {.schedule = UpdateSchedule::kCpu, .sub_group_size = 777},
           {.schedule = UpdateSchedule::kDevice, .sub_group_size = 777},
           {.schedule = UpdateSchedule::kRatio, .sub_group_size = 777, .ratio = 0.5},
           {.schedule = UpdateSchedule::kInterleave,
           .sub_group_size = 777,
           .stride = 2,
           .staging_buffers = 1}}) {
    EngineRun run(problem, settings, {.slow_stream = "snapshot", .slow_copy_ms = 2});
    run.upload_grads(problem.grads[0]);
    run.engine->step(Problem::lr(0), Problem::scale(0));
    DeviceAllocation snapshot =
        run.device->allocate(MemorySpace::kPinnedHost, 3 * problem.P * sizeof(float));
    std::fill_n(snapshot.as<float>(), 3 * problem.P, -1.0f);
    float* arrays[] = {snapshot.as<float>(), snapshot.as<float>() + problem.P,
                       snapshot.as<float>() + 2 * problem.P};
    run.engine->begin_capture(arrays);
    EXPECT_TRUE(run.engine->capturing());
    run.upload_grads(problem.grads[1]);
    const UpdateStepStats stats = run.engine->step(Problem::lr(1), Problem::scale(1));
    EXPECT_GT(stats.capture_wait_ms, 0.0) << describe(settings);
    run.engine->finish_capture();
    EXPECT_FALSE(run.engine->capturing());
    const auto copy = [&](int k) { return std::vector<float>(arrays[k], arrays[k] + problem.P); };
    EXPECT_TRUE(bitwise_equal(copy(0), want_p1)) << describe(settings);
    EXPECT_TRUE(bitwise_equal(copy(1), want_m1)) << describe(settings);
    EXPECT_TRUE(bitwise_equal(copy(2), want_v1)) << describe(settings);
    std::vector<float> p, m, v, w;
    run.read(problem, p, m, v, w);
    EXPECT_TRUE(bitwise_equal(p, want_p2)) << describe(settings);
    EXPECT_TRUE(bitwise_equal(m, want_m2)) << describe(settings);
    EXPECT_TRUE(bitwise_equal(v, want_v2)) << describe(settings);
  }
}

// The same snapshot streamed through a pool of 2 small slots (offload/snapshot_pool.h)
// drained by a slow writer: every piece holds step 1's state though step 2 runs, the
// pieces cover every parameter exactly once, step 2 waits for the writer (back-pressure)
// and its result is unchanged. A writer that gives up after its first piece (a failed
// write) lets the capture end without it.
TEST(UpdateEngine, AStreamedSnapshotThroughABoundedPoolHoldsItsStepsState) {
  const Problem problem;
  std::vector<float> want_p1, want_m1, want_v1, want_p2, want_m2, want_v2;
  problem.reference(want_p1, want_m1, want_v1, 1);
  problem.reference(want_p2, want_m2, want_v2, 2);
  for (const bool abandon : {false, true})
    for (const OffloadSettings& settings :
         std::vector<OffloadSettings>{{.schedule = UpdateSchedule::kCpu, .sub_group_size = 777},
                                      {.schedule = UpdateSchedule::kDevice, .sub_group_size = 777},
                                      {.schedule = UpdateSchedule::kInterleave,
                                      .sub_group_size = 777,
                                      .stride = 2,
                                      .staging_buffers = 1}}) {
      const std::string what = describe(settings) + (abandon ? ", writer gives up" : "");
      EngineRun run(problem, settings);
      run.upload_grads(problem.grads[0]);
      run.engine->step(Problem::lr(0), Problem::scale(0));
      SnapshotPool pool(*run.device, 2, 3 * 500);  // pieces of at most 500 parameters
      std::vector<float> p(problem.P, -1.0f), m(problem.P, -1.0f), v(problem.P, -1.0f);
      std::vector<int> covered(problem.P, 0);
      size_t pieces = 0;
      run.engine->begin_streamed_capture(pool);
      std::thread writer([&] {
        while (std::optional<SnapshotPool::Piece> piece = pool.next()) {
          pool.copied(piece->slot).synchronize();
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          const float* data = pool.data(piece->slot);
          const size_t n = piece->range.size();
          std::copy_n(data, n, p.begin() + piece->range.begin);
          std::copy_n(data + n, n, m.begin() + piece->range.begin);
          std::copy_n(data + 2 * n, n, v.begin() + piece->range.begin);
          for (size_t i = piece->range.begin; i < piece->range.end; i++) covered[i]++;
          pieces++;
          if (abandon) {
            pool.abandon();
            return;
          }
          pool.release(piece->slot);
        }
      });
      run.upload_grads(problem.grads[1]);
      const UpdateStepStats stats = run.engine->step(Problem::lr(1), Problem::scale(1));
      run.engine->finish_capture();
      writer.join();
      if (abandon) {
        EXPECT_EQ(pieces, 1u) << what;
      } else {
        EXPECT_GT(stats.capture_wait_ms, 0.0) << what;
        EXPECT_GT(pool.acquire_wait_ms(), 0.0) << what;
        EXPECT_GE(pieces, problem.P / 500) << what;
        EXPECT_TRUE(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }))
            << what;
        EXPECT_TRUE(bitwise_equal(p, want_p1)) << what;
        EXPECT_TRUE(bitwise_equal(m, want_m1)) << what;
        EXPECT_TRUE(bitwise_equal(v, want_v1)) << what;
      }
      std::vector<float> p2, m2, v2, w2;
      run.read(problem, p2, m2, v2, w2);
      EXPECT_TRUE(bitwise_equal(p2, want_p2)) << what;
      EXPECT_TRUE(bitwise_equal(m2, want_m2)) << what;
      EXPECT_TRUE(bitwise_equal(v2, want_v2)) << what;
    }
}

// A step whose gradients are not finite is skipped (skip_step): gradient copies begun
// during backward (gradients_ready) are waited for and forgotten, the state is that of
// the step before, bit for bit, and the next step gives the reference's bits, as if the
// skipped one had never been.
TEST(UpdateEngine, ASkippedStepLeavesTheStateAsItWas) {
  const Problem problem;
  std::vector<float> want_p1, want_m1, want_v1, want_p2, want_m2, want_v2;
  problem.reference(want_p1, want_m1, want_v1, 1);
  problem.reference(want_p2, want_m2, want_v2, 2);
  const std::vector<float> nans(problem.P, std::numeric_limits<float>::quiet_NaN());
  for (const OffloadSettings& settings : std::vector<OffloadSettings>{
           {.schedule = UpdateSchedule::kCpu, .sub_group_size = 777},
           {.schedule = UpdateSchedule::kDevice, .sub_group_size = 777},
           {.schedule = UpdateSchedule::kInterleave, .sub_group_size = 777, .stride = 2}}) {
    EngineRun run(problem, settings);
    run.upload_grads(problem.grads[0]);
    run.engine->step(Problem::lr(0), Problem::scale(0));
    run.upload_grads(nans);
    run.engine->gradients_ready(0, problem.P);  // host subgroups start copying them
    run.engine->skip_step();
    EXPECT_EQ(run.engine->step_count(), 1) << describe(settings);
    std::vector<float> p, m, v, w;
    run.read(problem, p, m, v, w);
    EXPECT_TRUE(bitwise_equal(p, want_p1)) << describe(settings);
    EXPECT_TRUE(bitwise_equal(m, want_m1)) << describe(settings);
    EXPECT_TRUE(bitwise_equal(v, want_v1)) << describe(settings);
    run.upload_grads(problem.grads[1]);
    run.engine->step(Problem::lr(1), Problem::scale(1));
    run.read(problem, p, m, v, w);
    EXPECT_TRUE(bitwise_equal(p, want_p2)) << describe(settings);
    EXPECT_TRUE(bitwise_equal(m, want_m2)) << describe(settings);
    EXPECT_TRUE(bitwise_equal(v, want_v2)) << describe(settings);
  }
}

// state_span hands out each array's elements as read_state gives them: a pointer into the
// engine's memory for a range inside one subgroup (every subgroup is readable on the cpu
// device), the scratch filled for a range across subgroups; a range past the partition is
// refused.
TEST(UpdateEngine, StateSpansAreTheStateReadStateGives) {
  const Problem problem;
  for (const OffloadSettings& settings : std::vector<OffloadSettings>{
           {.schedule = UpdateSchedule::kCpu, .sub_group_size = 777},
           {.schedule = UpdateSchedule::kInterleave, .sub_group_size = 500, .stride = 2}}) {
    EngineRun run(problem, settings);
    run.upload_grads(problem.grads[0]);
    run.engine->step(Problem::lr(0), Problem::scale(0));
    std::vector<float> p, m, v, w;
    run.read(problem, p, m, v, w);
    const std::vector<float>* arrays[] = {&p, &m, &v};
    std::vector<float> scratch(problem.P, -1.0f);
    for (const ParamRange range : {ParamRange{0, 10}, ParamRange{770, 790},
                                   ParamRange{100, problem.P}, ParamRange{0, problem.P}}) {
      for (size_t k = 0; k < 3; k++) {
        const float* got = run.engine->state_span(k, range, scratch.data());
        const bool within_one =
            range.begin / settings.sub_group_size == (range.end - 1) / settings.sub_group_size;
        EXPECT_EQ(got == scratch.data(), !within_one) << describe(settings) << ", array " << k;
        EXPECT_TRUE(std::equal(got, got + range.size(), arrays[k]->begin() + range.begin))
            << describe(settings) << ", array " << k << ", [" << range.begin << ", " << range.end
            << ")";
      }
    }
    EXPECT_CONTAINS(testing::error_of([&] {
                      run.engine->state_span(0, {problem.P - 1, problem.P + 1}, scratch.data());
                    }),
                    "run past this engine's partition");
  }
}

// A resume hands the engine pieces in the order its files hold them: any cut of the
// arrays, in any order, mixed, some read where the engine keeps them, loads the bits
// loading whole arrays loads (the working copy too, in its dtype); a piece missing or given
// twice is refused.
TEST(UpdateEngine, StateLoadedInPiecesOfAnyOrderIsTheStateOfWholeArrays) {
  const Problem problem;
  for (const WorkingDType dtype : {WorkingDType::kF32, WorkingDType::kBF16})
    for (const OffloadSettings& settings : std::vector<OffloadSettings>{
             {.schedule = UpdateSchedule::kCpu, .sub_group_size = 777},
             {.schedule = UpdateSchedule::kInterleave, .sub_group_size = 500, .stride = 2},
             {.schedule = UpdateSchedule::kDevice, .sub_group_size = 300}}) {
      SCOPED_TRACE(describe(settings) + (dtype == WorkingDType::kBF16 ? ", bf16" : ", fp32"));
      // The state after a step, read whole.
      EngineRun stepped(problem, settings, CpuDeviceOptions{}, dtype);
      stepped.upload_grads(problem.grads[0]);
      stepped.engine->step(Problem::lr(0), Problem::scale(0));
      std::vector<float> p, m, v, w;
      stepped.read(problem, p, m, v, w);
      const std::vector<float>* arrays[] = {&p, &m, &v};
      // The same in pieces of 7, 1000 and 1 floats (across subgroups), shuffled over all
      // three arrays.
      std::vector<std::pair<size_t, ParamRange>> cut;
      for (size_t k = 0; k < 3; k++)
        for (size_t b = 0, i = 0; b < problem.P; i++) {
          const size_t e = std::min(problem.P, b + std::array<size_t, 3>{7, 1000, 1}[i % 3]);
          cut.push_back({k, {b, e}});
          b = e;
        }
      Rng rng(5);
      for (size_t i = cut.size(); i > 1; i--) std::swap(cut[i - 1], cut[rng.next_u64() % i]);
      size_t placed = 0;
      const auto feed = [&](size_t skip, size_t twice) {
        return [&, skip, twice](const UpdateEngine::StateSink& put,
                                const UpdateEngine::StatePlace& place) {
          for (size_t i = 0; i < cut.size(); i++) {
            const auto& [k, range] = cut[i];
            // Each piece from a buffer of its own, gone after the call; every other one,
            // where the engine has room for it in its own memory, written there.
            std::vector<float> piece(arrays[k]->begin() + range.begin,
                                     arrays[k]->begin() + range.end);
            const float* values = piece.data();
            if (float* in_place = i % 2 ? place(k, range) : nullptr) {
              std::copy(piece.begin(), piece.end(), in_place);
              values = in_place;
              placed++;
            }
            if (i != skip) put(k, range, values);
            if (i == twice) put(k, range, values);
          }
        };
      };
      EngineRun loaded(problem, settings, CpuDeviceOptions{}, dtype);
      loaded.engine->load_state(feed(SIZE_MAX, SIZE_MAX), 1);
      std::vector<float> lp, lm, lv, lw;
      loaded.read(problem, lp, lm, lv, lw);
      EXPECT_TRUE(bitwise_equal(lp, p));
      EXPECT_TRUE(bitwise_equal(lm, m));
      EXPECT_TRUE(bitwise_equal(lv, v));
      EXPECT_TRUE(bitwise_equal(lw, w));
      EXPECT_EQ(loaded.engine->step_count(), 1);
      // On the cpu device the host holds every subgroup: the pieces within one were placed.
      EXPECT_GT(placed, cut.size() / 4);
      EXPECT_CONTAINS(testing::error_of([&] { loaded.engine->load_state(feed(3, SIZE_MAX), 1); }),
                      "were given, of the");
      EXPECT_CONTAINS(testing::error_of([&] { loaded.engine->load_state(feed(SIZE_MAX, 4), 1); }),
                      "each must come once");
    }
}

// A GPU's backward is still running when it announces gradients: the engine must order
// its copies after the producer stream's work with an event. Here the producer writes
// each step's gradients only after a delay, while the engine is told at once.
TEST(UpdateEngine, WaitsForTheProducerStreamWithoutTheHostWaiting) {
  const Problem problem;
  std::vector<float> want_p, want_m, want_v;
  problem.reference(want_p, want_m, want_v, kSteps);
  for (const UpdateSchedule schedule :
       {UpdateSchedule::kCpu, UpdateSchedule::kDevice, UpdateSchedule::kInterleave}) {
    std::unique_ptr<Device> device = make_cpu_device({});
    const DeviceAllocation working = device->allocate(MemorySpace::kDevice, problem.P * 4);
    const DeviceAllocation grads = device->allocate(MemorySpace::kDevice, problem.P * 4);
    const std::unique_ptr<Stream> producer = device->create_stream("model");
    ThreadPool pool{2};
    UpdateEngine engine(
        *device, problem.layout,
        make_offload_plan({.schedule = schedule, .sub_group_size = 1000, .stride = 2}, problem.P),
        std::make_unique<AdamWRule>(kHyper, pool),
        {.working_params = working.data(), .grads = grads.data(), .producer = producer.get()});
    engine.load_state(problem.params.data(), problem.m.data(), problem.v.data(), 0);
    std::vector<float> stale(problem.P, 123.0f);
    for (int s = 0; s < kSteps; s++) {
      std::memcpy(grads.data(), stale.data(), problem.P * 4);
      const std::vector<float>& g = problem.grads[s];
      launch_host_task(*producer, [&grads, &g] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        std::memcpy(grads.data(), g.data(), g.size() * 4);
      });
      engine.gradients_ready(problem.P / 2, problem.P);  // "the last layers are done"
      engine.gradients_ready(0, problem.P / 2);
      engine.step(Problem::lr(s), Problem::scale(s));
    }
    std::vector<float> p(problem.P), m(problem.P), v(problem.P);
    engine.read_state(p.data(), m.data(), v.data());
    EXPECT_TRUE(bitwise_equal(p, want_p)) << update_schedule_name(schedule);
    EXPECT_TRUE(bitwise_equal(m, want_m)) << update_schedule_name(schedule);
    EXPECT_TRUE(bitwise_equal(v, want_v)) << update_schedule_name(schedule);
  }
}

// offload_optimizer.overlap_forward: step() returns with the update still running; a forward
// that asks for its blocks in flat order finds each block's working parameters final, bit
// for bit, while the later subgroups are still being updated (slow host-to-device copies keep
// them in flight), and finish_update() ends the step with plain AdamW's state. Both ways a
// model reads: on a stream of its own (a GPU's kernels, queued behind the wait) and at once
// on the host (the CPU backend's).
TEST(UpdateEngine, AnOverlappedUpdateHandsEachBlockOverFinalInFlatOrder) {
  const Problem problem;
  for (const bool on_a_stream : {false, true})
    for (const UpdateSchedule schedule : {UpdateSchedule::kCpu, UpdateSchedule::kRatio,
                                          UpdateSchedule::kInterleave, UpdateSchedule::kDevice}) {
      const std::string what = cat(update_schedule_name(schedule),
                                   on_a_stream ? ", read on a stream" : ", read at once");
      std::unique_ptr<Device> device =
          make_cpu_device({.slow_stream = "host-to-device", .slow_copy_ms = 2});
      const DeviceAllocation working = device->allocate(MemorySpace::kDevice, problem.P * 4);
      const DeviceAllocation grads = device->allocate(MemorySpace::kDevice, problem.P * 4);
      const std::unique_ptr<Stream> model_stream = device->create_stream("model");
      Stream* reader = on_a_stream ? model_stream.get() : nullptr;
      ThreadPool pool{2};
      UpdateEngine engine(*device, problem.layout,
                          make_offload_plan({.schedule = schedule,
                                             .sub_group_size = 700,
                                             .ratio = 0.5,
                                             .stride = 2,
                                             .overlap_forward = true},
                                            problem.P),
                          std::make_unique<AdamWRule>(kHyper, pool),
                          {.working_params = working.data(), .grads = grads.data()});
      engine.load_state(problem.params.data(), problem.m.data(), problem.v.data(), 0);
      for (int s = 0; s < kSteps; s++) {
        std::memcpy(grads.data(), problem.grads[s].data(), problem.P * 4);
        engine.step(Problem::lr(s), Problem::scale(s));
        EXPECT_TRUE(engine.update_in_flight()) << what;
        std::vector<float> want_p, want_m, want_v;
        problem.reference(want_p, want_m, want_v, s + 1);
        for (const ParamRange& block : problem.layout.blocks()) {
          engine.wait_for_parameters(block, reader);
          std::vector<float> got(block.size());
          const float* source = working.as<float>() + block.begin;
          if (reader != nullptr) {
            device->copy_async(got.data(), source, block.size() * 4, *reader);
            reader->synchronize();
          } else {
            std::memcpy(got.data(), source, block.size() * 4);
          }
          EXPECT_EQ(std::memcmp(got.data(), want_p.data() + block.begin, block.size() * 4), 0)
              << what << ", step " << s + 1 << ", block at " << block.begin;
        }
        const UpdateEngine::OverlapTimes times = engine.finish_update();
        EXPECT_FALSE(engine.update_in_flight());
        // Read at once, the blocks of the CPU's subgroups were waited for behind their slow
        // copies, and the wait is counted.
        if (schedule == UpdateSchedule::kCpu && reader == nullptr) {
          EXPECT_GT(times.waited_ms, 0.0) << what << ", step " << s + 1;
        }
        EXPECT_EQ(engine.step_count(), s + 1);
      }
      std::vector<float> want_p, want_m, want_v;
      problem.reference(want_p, want_m, want_v, kSteps);
      std::vector<float> p(problem.P), m(problem.P), v(problem.P);
      engine.read_state(p.data(), m.data(), v.data());
      EXPECT_TRUE(bitwise_equal(p, want_p)) << what;
      EXPECT_TRUE(bitwise_equal(m, want_m)) << what;
      EXPECT_TRUE(bitwise_equal(v, want_v)) << what;
    }
}

// A copy that fails behind step() is reported by the next wait for parameters as the step's
// failure, and the engine refuses further steps, as when the step waits for itself.
TEST(UpdateEngine, AFailureBehindAnOverlappedStepIsReportedByTheNextWait) {
  const Problem problem;
  const OffloadSettings settings{
      .schedule = UpdateSchedule::kCpu, .sub_group_size = 1000, .overlap_forward = true};
  const size_t subgroups = make_offload_plan(settings, problem.P).subgroups.size();
  // load_state's copies (3 per subgroup + 1), the gradients' upload, then the step's: the
  // gradients to the host (one per subgroup), then the working copies back; fail the middle
  // working copy.
  const int64_t failing =
      3 * static_cast<int64_t>(subgroups) + 1 + 1 + static_cast<int64_t>(subgroups + subgroups / 2);
  EngineRun run(problem, settings, CpuDeviceOptions{.fail_copy_number = failing});
  run.upload_grads(problem.grads[0]);
  run.engine->step(Problem::lr(0), Problem::scale(0));
  const std::string error = testing::error_of([&] {
    for (const ParamRange& block : problem.layout.blocks())
      run.engine->wait_for_parameters(block, nullptr);
    run.engine->finish_update();
  });
  EXPECT_CONTAINS(error, "optimizer step 1 failed");
  EXPECT_CONTAINS(error, "injected copy failure");
  EXPECT_CONTAINS(error, "training cannot continue");
  EXPECT_FALSE(run.engine->update_in_flight());
  EXPECT_CONTAINS(testing::error_of([&] { run.engine->step(Problem::lr(1), 1.0f); }),
                  "stopped after a failed step");
}

TEST(UpdateEngine, AFailedCopyLeavesNoSubgroupHalfUpdated) {
  const Problem problem;
  std::vector<float> after_p, after_m, after_v;
  problem.reference(after_p, after_m, after_v, 1);
  const OffloadSettings settings{.schedule = UpdateSchedule::kInterleave,
                                 .sub_group_size = 1000,
                                 .stride = 2,
                                 .staging_buffers = 2};
  const OffloadPlan plan = make_offload_plan(settings, problem.P);
  // load_state issues 3 copies per subgroup + 1; then the step's copies follow.
  const int64_t first_step_copy = 3 * static_cast<int64_t>(plan.subgroups.size()) + 1;
  int failures_seen = 0;
  for (int64_t k = first_step_copy; k < first_step_copy + 40; k += 3) {
    EngineRun run(problem, settings,
                  CpuDeviceOptions{.fail_copy_number = k + 1});  // +1: the grads upload
    run.upload_grads(problem.grads[0]);
    try {
      run.engine->step(Problem::lr(0), Problem::scale(0));
      continue;  // k is past the step's last copy
    } catch (const Error& e) {
      failures_seen++;
      EXPECT_CONTAINS(std::string(e.what()), "training cannot continue");
      EXPECT_CONTAINS(std::string(e.what()), "injected copy failure");
    }
    EXPECT_THROW(run.engine->step(Problem::lr(1), 1.0f), Error);
    std::vector<float> p, m, v, w;
    run.read(problem, p, m, v, w);
    for (const Subgroup& sg : plan.subgroups) {
      auto equal = [&](const std::vector<float>& a, const std::vector<float>& b) {
        return std::memcmp(a.data() + sg.begin, b.data() + sg.begin, sg.size() * sizeof(float)) ==
               0;
      };
      const bool old_state = equal(p, problem.params) && equal(m, problem.m) && equal(v, problem.v);
      const bool new_state = equal(p, after_p) && equal(m, after_m) && equal(v, after_v);
      EXPECT_TRUE(old_state || new_state) << "copy " << k << ": subgroup at " << sg.begin << " ("
                                          << update_site_name(sg.site) << ") is half-updated";
    }
  }
  EXPECT_GT(failures_seen, 5);
}

// A rule the engine has never seen: heavy-ball SGD with two state arrays (param,
// momentum), written here. The engine runs it under every schedule with the bits of the
// rule applied to the flat arrays: placement, staging and copies follow the rule's state
// size, and the arithmetic is the rule's alone.
class MomentumSgdRule final : public UpdateRule {
 public:
  std::string_view name() const override { return "momentum-sgd"; }
  const std::vector<std::string>& state_arrays() const override { return arrays_; }
  void begin_step(int64_t, double lr, float grad_scale) override {
    lr_ = static_cast<float>(lr);
    scale_ = grad_scale;
  }
  // b = 0.9 b + scale g; p = p - lr b (each one rounding, no fma).
  static void update(float* p, float* b, const float* g, size_t n, float lr, float scale) {
    for (size_t i = 0; i < n; i++) {
      b[i] = 0.9f * b[i] + scale * g[i];
      p[i] = p[i] - lr * b[i];
    }
  }
  void update_on_host(const RuleArrays& a, std::span<const UpdateSegment>) override {
    update(a.array(0), a.array(1), static_cast<const float*>(a.grads), a.size, lr_, scale_);
  }
  DeviceKernel device_update(const RuleArrays& a, std::span<const UpdateSegment>) const override {
    DeviceKernel kernel;
    kernel.name = "momentum-sgd";
    kernel.work_items = a.size;
    kernel.on_host = [a, lr = lr_, scale = scale_] {
      update(a.array(0), a.array(1), static_cast<const float*>(a.grads), a.size, lr, scale);
    };
    return kernel;
  }

 private:
  std::vector<std::string> arrays_{"param", "momentum"};
  float lr_ = 0, scale_ = 1;
};

TEST(UpdateEngine, AnyRuleRunsUnderEverySchedule) {
  const Problem problem;
  const size_t P = problem.P;
  std::vector<float> want_p = problem.params, want_b(P, 0.0f);
  for (int s = 0; s < kSteps; s++)
    MomentumSgdRule::update(want_p.data(), want_b.data(), problem.grads[s].data(), P,
                            Problem::lr(s), Problem::scale(s));
  for (UpdateSchedule schedule : {UpdateSchedule::kDevice, UpdateSchedule::kCpu,
                                  UpdateSchedule::kInterleave, UpdateSchedule::kRatio}) {
    SCOPED_TRACE(update_schedule_name(schedule));
    auto device = make_cpu_device({});
    DeviceAllocation working = device->allocate(MemorySpace::kDevice, P * sizeof(float));
    DeviceAllocation grads = device->allocate(MemorySpace::kDevice, P * sizeof(float));
    UpdateEngine engine(*device, problem.layout,
                        make_offload_plan({.schedule = schedule,
                                           .sub_group_size = 1000,
                                           .ratio = 0.5,
                                           .stride = 2,
                                           .staging_buffers = 2},
                                          P),
                        std::make_unique<MomentumSgdRule>(),
                        {.working_params = working.data(), .grads = grads.data()});
    EXPECT_EQ(engine.rule().state_floats(), 2u);
    const std::vector<float> zeros(P, 0.0f);
    const float* load[] = {problem.params.data(), zeros.data()};
    engine.load_state(load, 0);
    for (int s = 0; s < kSteps; s++) {
      std::memcpy(grads.data(), problem.grads[s].data(), P * sizeof(float));
      engine.step(Problem::lr(s), Problem::scale(s));
    }
    std::vector<float> got_p(P), got_b(P);
    float* read[] = {got_p.data(), got_b.data()};
    engine.read_state(read);
    EXPECT_EQ(std::memcmp(got_p.data(), want_p.data(), P * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(got_b.data(), want_b.data(), P * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(working.data(), want_p.data(), P * sizeof(float)), 0)
        << "the working parameters";
    // AdamW's three arrays do not fit this rule.
    std::vector<float> m(P), v(P);
    EXPECT_CONTAINS(testing::error_of([&] { engine.read_state(got_p.data(), m.data(), v.data()); }),
                    "3 state arrays for the momentum-sgd rule, which keeps 2");
  }
}

TEST(UpdateEngine, ADeviceTooSmallIsRefusedWithTheBytesAndTheSettings) {
  const Problem problem;
  const size_t P = problem.P;
  // Room for working params and grads, not for the resident fp32 state.
  CpuDeviceOptions options{.memory_bytes = 2 * P * sizeof(float) + 1024};
  auto device = make_cpu_device(options);
  ThreadPool pool(1);
  DeviceAllocation working = device->allocate(MemorySpace::kDevice, P * sizeof(float));
  DeviceAllocation grads = device->allocate(MemorySpace::kDevice, P * sizeof(float));
  const std::string message = testing::error_of([&] {
    UpdateEngine engine(
        *device, problem.layout,
        make_offload_plan({.schedule = UpdateSchedule::kDevice, .sub_group_size = 4096}, P),
        std::make_unique<AdamWRule>(kHyper, pool), {working.data(), grads.as<const float>()});
  });
  EXPECT_CONTAINS(message, "device.memory_gb");
  EXPECT_CONTAINS(message, "'device' schedule needs");
  // The CPU schedule fits: its state lives in pinned host memory.
  UpdateEngine engine(
      *device, problem.layout,
      make_offload_plan({.schedule = UpdateSchedule::kCpu, .sub_group_size = 4096}, P),
      std::make_unique<AdamWRule>(kHyper, pool), {working.data(), grads.as<const float>()});
  EXPECT_EQ(engine.plan().count(UpdateSite::kHost), engine.plan().subgroups.size());
}

TEST(OffloadPlan, SitesFollowTheSchedule) {
  const OffloadPlan interleave = make_offload_plan(
      {.schedule = UpdateSchedule::kInterleave, .sub_group_size = 10, .stride = 3}, 95);
  ASSERT_EQ(interleave.subgroups.size(), 10u);
  EXPECT_EQ(interleave.subgroups.back().size(), 5u);
  for (size_t x = 0; x < 10; x++)
    EXPECT_EQ(interleave.subgroups[x].site,
              (x + 1) % 3 == 0 ? UpdateSite::kDeviceStaged : UpdateSite::kHost)
        << x;
  const OffloadPlan ratio = make_offload_plan(
      {.schedule = UpdateSchedule::kRatio, .sub_group_size = 10, .ratio = 0.3}, 100);
  EXPECT_EQ(ratio.count(UpdateSite::kDeviceResident), 3u);
  EXPECT_EQ(ratio.count(UpdateSite::kHost), 7u);
  EXPECT_CONTAINS(testing::error_of([] {
                    make_offload_plan({.schedule = UpdateSchedule::kRatio, .ratio = 1.5}, 10);
                  }),
                  "offload_optimizer.ratio = 1.5 is out of range; allowed: 0 to 1");
  EXPECT_CONTAINS(testing::error_of([] {
                    make_offload_plan({.schedule = UpdateSchedule::kInterleave, .stride = 0}, 10);
                  }),
                  "offload_optimizer.stride = 0 is out of range; allowed: 1 or more");
  const TierBytes needs = engine_memory_needs(interleave, 4, 4);
  EXPECT_EQ(needs.device, 95u * 8 + 2 * 3 * 10 * 4);  // working + grads, 2 staging buffers
  EXPECT_EQ(needs.pinned_host, 95u * 12 + 65u * 8);   // all state; grads + working of host ones
}

TEST(PerfModel, PredictsTheSlowerOfCpuAndDevice) {
  const UpdateRates rates{.cpu_params_per_s = 1e9,
                          .device_params_per_s = 1e10,
                          .h2d_bytes_per_s = 24e9,
                          .d2h_bytes_per_s = 24e9};
  const OffloadPlan cpu =
      make_offload_plan({.schedule = UpdateSchedule::kCpu, .sub_group_size = 1000}, 100000);
  // 1e5 params at 1e9/s, then the last subgroup's 1000 working params (4 bytes) to the device.
  const double tail = 1000.0 * 4 / 24e9;
  EXPECT_NEAR(predict_update(cpu, rates).seconds, 1e-4 + tail, 1e-12);
  const OffloadPlan half = make_offload_plan(
      {.schedule = UpdateSchedule::kInterleave, .sub_group_size = 1000, .stride = 2}, 100000);
  const UpdatePrediction p = predict_update(half, rates);
  EXPECT_NEAR(p.host_seconds, 0.5e-4 + tail, 1e-12);
  // Staged: 12 bytes each way per parameter, plus 4 for the host half's gradients/params.
  EXPECT_NEAR(p.h2d_seconds, (50000.0 * 12 + 50000.0 * 4) / 24e9, 1e-12);
  EXPECT_NEAR(p.seconds, std::max(p.host_seconds, p.device_seconds), 1e-15);
  EXPECT_LT(p.seconds, predict_update(cpu, rates).seconds);
}

// The model measures the rule it is given and moves that rule's state: a rule of two
// arrays stages 8 bytes per parameter each way, not AdamW's 12.
// overlap_forward: with N equal subgroups updated one after another over U seconds and a
// forward of F seconds reading them in order, the forward of the last (N - 1) / N of the
// smaller of the two runs behind the update: the hidden time is min(U, F) (N - 1) / N.
TEST(PerfModel, PredictsTheUpdateTheNextForwardHides) {
  for (const size_t subgroups : {size_t{1}, size_t{4}, size_t{10}}) {
    const OffloadPlan plan = make_offload_plan(
        {.schedule = UpdateSchedule::kCpu, .sub_group_size = 1000}, 1000 * subgroups);
    for (const auto& [U, F] : {std::pair{8.0, 4.0}, std::pair{1.0, 4.0}, std::pair{3.0, 3.0}}) {
      UpdatePrediction prediction;
      prediction.seconds = prediction.host_seconds = U;
      const double want = std::min(U, F) * static_cast<double>(subgroups - 1) / subgroups;
      EXPECT_NEAR(predict_hidden_update(plan, prediction, F), want, 1e-12)
          << subgroups << " subgroups, U " << U << ", F " << F;
    }
  }
  // Two lanes: ratio 0.5 over 4 subgroups puts 0 and 2 on the host (8 s: done at 4 and 8)
  // and 1 and 3 on the device (4 s: done at 2 and 4). The forward (4 s, 1 s a subgroup)
  // can end no sooner than 4 + 4, 2 + 3, 8 + 2, 4 + 1: at 10 instead of 12, so 2 s are hidden.
  const OffloadPlan ratio = make_offload_plan(
      {.schedule = UpdateSchedule::kRatio, .sub_group_size = 1000, .ratio = 0.5}, 4000);
  UpdatePrediction both;
  both.seconds = both.host_seconds = 8.0;
  both.device_seconds = 4.0;
  EXPECT_NEAR(predict_hidden_update(ratio, both, 4.0), 2.0, 1e-12);
  const OffloadPlan cpu =
      make_offload_plan({.schedule = UpdateSchedule::kCpu, .sub_group_size = 1000}, 4000);
  UpdatePrediction host_only;
  host_only.seconds = host_only.host_seconds = 8.0;
  EXPECT_EQ(predict_hidden_update(cpu, host_only, 0.0), 0.0);
}

TEST(PerfModel, MeasuresAndMovesTheRulesOwnState) {
  auto device = make_cpu_device({});
  MomentumSgdRule sgd;
  const UpdateRates measured = calibrate_update_rates(*device, sgd, 1 << 14);
  EXPECT_EQ(measured.state_bytes_per_param, 8u);
  EXPECT_GT(measured.cpu_params_per_s, 0.0);
  EXPECT_GT(measured.device_params_per_s, 0.0);
  ThreadPool pool(1);
  EXPECT_EQ(calibrate_adamw_rates(*device, pool, 1 << 14).state_bytes_per_param, 12u);

  UpdateRates rates{.cpu_params_per_s = 1e9,
                    .device_params_per_s = 1e10,
                    .state_bytes_per_param = 8,
                    .h2d_bytes_per_s = 24e9,
                    .d2h_bytes_per_s = 24e9};
  const OffloadPlan half = make_offload_plan(
      {.schedule = UpdateSchedule::kInterleave, .sub_group_size = 1000, .stride = 2}, 100000);
  EXPECT_NEAR(predict_update(half, rates).h2d_seconds, (50000.0 * 8 + 50000.0 * 4) / 24e9, 1e-12);
  EXPECT_EQ(engine_memory_needs(half, 4, 4, 8).pinned_host,
            engine_memory_needs(half, 4, 4).pinned_host - 100000 * 4);
}

// While both lanes work, each runs at the rates measured with everything at once; the lane
// that is left runs on at its rates alone. Numbers worked out by hand.
TEST(PerfModel, LanesRunAtTheirSharedRatesWhileTheyOverlap) {
  UpdateRates rates{.cpu_params_per_s = 1e9,
                    .device_params_per_s = 1e12,
                    .h2d_bytes_per_s = 12e9,
                    .d2h_bytes_per_s = 12e9};
  // 50 host and 50 staged subgroups of 1000 parameters, two staging buffers.
  const OffloadPlan half = make_offload_plan(
      {.schedule = UpdateSchedule::kInterleave, .sub_group_size = 1000, .stride = 2}, 100000);
  // Alone. Host: 5e4 params at 1e9/s + the last 4000 bytes at 12e9 B/s = 5.0333e-5 s.
  // Device: 5e4 x 4 + 5e4 x 12 bytes in (6.6667e-5 s, the slowest stage), 5e4 x 12 out
  // (5e-5 s), and one subgroup's write-back (1e-6 s) and update (1e-9 s) to fill the pipe.
  UpdatePrediction p = predict_update(half, rates);
  EXPECT_NEAR(p.host_seconds, 5.0333333e-5, 1e-11);
  EXPECT_NEAR(p.device_seconds, 6.7667667e-5, 1e-11);
  EXPECT_NEAR(p.seconds, p.device_seconds, 1e-15);  // nothing shared: the slower lane
  EXPECT_NEAR(p.overlap_seconds, p.host_seconds, 1e-15);

  // Sharing halves the CPU and both links: host 1.0066667e-4 s and device 1.3533433e-4 s
  // at the shared rates. The host lane ends first, at 1.0066667e-4 s, with the device lane
  // 0.7438369 of the way; the rest, 0.2561631 of its time alone, takes 1.7333961e-5 s.
  rates.shared = {.cpu_params_per_s = 0.5e9,
                  .device_params_per_s = 1e12,
                  .h2d_bytes_per_s = 6e9,
                  .d2h_bytes_per_s = 6e9};
  p = predict_update(half, rates);
  EXPECT_NEAR(p.overlap_seconds, 1.0066667e-4, 1e-11);
  EXPECT_NEAR(p.seconds, 1.0066667e-4 + 1.7333961e-5, 1e-11);
  EXPECT_NEAR(p.host_seconds, 5.0333333e-5, 1e-11);  // the lanes alone are reported unchanged

  // The device lane ending first: a fast link, a slow shared CPU. Device alone: 8e5 bytes in
  // (8e-6 s) and 1.21e-7 s to fill (a write-back and an update); shared: 1.6e-5 + 2.41e-7 =
  // 1.6241e-5 s. Host alone 5.004e-5 s (tail 4e-8); shared 2e-4 + 8e-8. Then
  // 1 - 1.6241e-5 / 2.0008e-4 of the host's time alone remains: 6.2219127e-5 s in all.
  rates.h2d_bytes_per_s = rates.d2h_bytes_per_s = 100e9;
  rates.shared.h2d_bytes_per_s = rates.shared.d2h_bytes_per_s = 50e9;
  rates.shared.cpu_params_per_s = 0.25e9;
  p = predict_update(half, rates);
  EXPECT_NEAR(p.overlap_seconds, 1.6241e-5, 1e-11);
  EXPECT_NEAR(p.seconds, 6.2219127e-5, 1e-11);

  // A lane with nothing to do shares nothing: all on the device. All on the CPU, the working
  // parameters' copies (4e5 bytes: 4e-6 s alone, 8e-6 s shared) slow it for their own time:
  // 8e-6 + (1 - 8e-6 / 4.0008e-4) x 1.0004e-4 s (host alone 1e-4 + the tail's 4e-8).
  const OffloadPlan device = make_offload_plan({.schedule = UpdateSchedule::kDevice}, 100000);
  EXPECT_NEAR(predict_update(device, rates).seconds, 100000 / 1e12, 1e-15);
  const OffloadPlan cpu =
      make_offload_plan({.schedule = UpdateSchedule::kCpu, .sub_group_size = 1000}, 100000);
  EXPECT_NEAR(predict_update(cpu, rates).seconds, 1.0603960e-4, 1e-11);

  // Beside a lane of working copies alone, the rates measured with those two alone: CPU
  // 0.8e9, the link at 9e9. Shared: host 1.25e-4 + 4000 / 9e9, device 4e5 / 9e9; the device
  // lane ends first: 4.4444e-5 + (1 - 4.4444e-5 / 1.2544444e-4) x 1.0004e-4 s.
  rates.shared_h2d = {.cpu_params_per_s = 0.8e9,
                      .device_params_per_s = rates.device_params_per_s,
                      .h2d_bytes_per_s = 9e9,
                      .d2h_bytes_per_s = rates.d2h_bytes_per_s};
  EXPECT_NEAR(predict_update(cpu, rates).seconds,
              4.4444444e-5 + (1 - 4.4444444e-5 / 1.2544444e-4) * 1.0004e-4, 1e-11);
  // Staging still shares at the rates of everything at once.
  EXPECT_NEAR(predict_update(half, rates).seconds, 6.2219127e-5, 1e-11);
}

// A device slower than the CPU (the cpu device's one stream thread against a pool): auto
// keeps the state on the host although all of it fits on the device.
TEST(PerfModel, AutoLeavesStateOnTheHostWhenTheDeviceIsSlower) {
  UpdateRates rates{.cpu_params_per_s = 2e9,
                    .device_params_per_s = 1e9,
                    .h2d_bytes_per_s = 10e9,
                    .d2h_bytes_per_s = 10e9};
  rates.shared = {.cpu_params_per_s = 1.5e9,
                  .device_params_per_s = 0.8e9,
                  .h2d_bytes_per_s = 8e9,
                  .d2h_bytes_per_s = 8e9};
  const size_t P = 100000;
  const OffloadSettings settings{.schedule = UpdateSchedule::kAuto, .sub_group_size = 1000};
  const OffloadPlan chosen = make_auto_plan(settings, P, rates, P * 12 * 2);
  const OffloadPlan cpu =
      make_offload_plan({.schedule = UpdateSchedule::kCpu, .sub_group_size = 1000}, P);
  const OffloadPlan device = make_offload_plan({.schedule = UpdateSchedule::kDevice}, P);
  EXPECT_LE(predict_update(chosen, rates).seconds, predict_update(cpu, rates).seconds);
  EXPECT_LT(predict_update(chosen, rates).seconds, predict_update(device, rates).seconds);
  EXPECT_GT(chosen.count(UpdateSite::kHost), 50u) << "most updates on the faster CPU";
}

TEST(PerfModel, CalibrationMeasuresTheRatesSharedAsWell) {
  auto device = make_cpu_device({});
  ThreadPool pool(1);
  const UpdateRates rates = calibrate_adamw_rates(*device, pool, 1 << 14);
  EXPECT_TRUE(rates.shared.measured());
  for (double rate : {rates.shared.cpu_params_per_s, rates.shared.device_params_per_s,
                      rates.shared.h2d_bytes_per_s, rates.shared.d2h_bytes_per_s})
    EXPECT_GT(rate, 0.0);
  EXPECT_NE(rates.to_text().find("all at once"), std::string::npos) << rates.to_text();
  EXPECT_EQ(rates.working_bytes_per_param, 4u);
  // Mixed precision: bf16 gradients read, the bf16 working copy written in the same pass.
  const UpdateRates bf16 = calibrate_adamw_rates(
      *device, pool, 1 << 14, {.grads = GradDType::kBF16, .working = WorkingDType::kBF16});
  EXPECT_EQ(bf16.working_bytes_per_param, 2u);
  EXPECT_GT(bf16.cpu_params_per_s, 0.0);
  EXPECT_GT(bf16.shared.device_params_per_s, 0.0);
}

TEST(PerfModel, AutoIsNeverPredictedSlowerThanAFixedScheduleThatFits) {
  UpdateRates shared_rates{.cpu_params_per_s = 2e9,
                           .device_params_per_s = 5e10,
                           .h2d_bytes_per_s = 25e9,
                           .d2h_bytes_per_s = 25e9};
  shared_rates.shared = {.cpu_params_per_s = 1.2e9,
                         .device_params_per_s = 5e10,
                         .h2d_bytes_per_s = 15e9,
                         .d2h_bytes_per_s = 18e9};
  for (const UpdateRates& rates : {shared_rates, [&] {
                                     UpdateRates alone = shared_rates;
                                     alone.shared = {};
                                     return alone;
                                   }()}) {
    const size_t P = 100000;
    const OffloadSettings settings{.schedule = UpdateSchedule::kAuto, .sub_group_size = 1000};
    for (size_t budget : {size_t{0}, size_t{12000}, size_t{24000}, P * 3, P * 6, P * 12}) {
      const OffloadPlan chosen = make_auto_plan(settings, P, rates, budget);
      const double chosen_seconds = predict_update(chosen, rates).seconds;
      EXPECT_LE(engine_memory_needs(chosen, 4, 4).device - P * 8, budget) << "budget " << budget;
      std::vector<OffloadSettings> fixed = {
          {.schedule = UpdateSchedule::kCpu, .sub_group_size = 1000}};
      for (int k = 1; k <= 4; k++)
        for (int slots = 1; slots <= 2; slots++)
          fixed.push_back({.schedule = UpdateSchedule::kInterleave,
                           .sub_group_size = 1000,
                           .stride = k,
                           .staging_buffers = slots});
      for (double r : {0.1, 0.25, 0.5, 1.0})
        fixed.push_back({.schedule = UpdateSchedule::kRatio, .sub_group_size = 1000, .ratio = r});
      for (const OffloadSettings& f : fixed) {
        const OffloadPlan plan = make_offload_plan(f, P);
        if (engine_memory_needs(plan, 4, 4).device - P * 8 > budget) continue;  // does not fit
        EXPECT_LE(chosen_seconds, predict_update(plan, rates).seconds * (1 + 1e-12))
            << "budget " << budget << " vs " << update_schedule_name(f.schedule) << " stride "
            << f.stride << " ratio " << f.ratio;
      }
    }
    // No device memory: everything stays on the CPU. Plenty: nearly everything resident.
    EXPECT_EQ(make_auto_plan(settings, P, rates, 0).count(UpdateSite::kHost), 100u);
    EXPECT_GE(make_auto_plan(settings, P, rates, P * 12).count(UpdateSite::kDeviceResident), 90u);
    // Room for two staging buffers only: with the brief's rates (CPU 2e9 params/s, 25 GB/s)
    // and no sharing, about half of the subgroups go through the device, the measured optimum
    // k = 2. A CPU and a link that slow each other down make mixing them pay less.
    const OffloadPlan staged = make_auto_plan(settings, P, rates, 2 * 12000);
    if (!rates.shared.measured()) {
      EXPECT_GE(staged.count(UpdateSite::kDeviceStaged), 30u);
      EXPECT_LE(staged.count(UpdateSite::kDeviceStaged), 70u);
    } else {
      EXPECT_GE(staged.count(UpdateSite::kDeviceStaged),
                make_auto_plan(settings, P, shared_rates.while_shared(), 2 * 12000)
                    .count(UpdateSite::kDeviceStaged));
    }
  }
}

}  // namespace
}  // namespace tandem
