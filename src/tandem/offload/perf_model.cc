#include "tandem/offload/perf_model.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <latch>
#include <limits>
#include <thread>
#include <vector>

#include "tandem/core/half.h"
#include "tandem/core/timer.h"
#include "tandem/optim/adamw_rule.h"

namespace tandem {
namespace {

constexpr int kPasses = 3;

}  // namespace

std::string UpdateRates::to_text() const {
  std::string text =
      cat("CPU update ", cpu_params_per_s / 1e9, " G params/s, device update ",
          device_params_per_s / 1e9, " G params/s, host-to-device ", h2d_bytes_per_s / 1e9,
          " GB/s, device-to-host ", d2h_bytes_per_s / 1e9, " GB/s");
  if (shared.measured())
    text += cat("; all at once: CPU ", shared.cpu_params_per_s / 1e9, ", device ",
                shared.device_params_per_s / 1e9, " G params/s, host-to-device ",
                shared.h2d_bytes_per_s / 1e9, ", device-to-host ", shared.d2h_bytes_per_s / 1e9,
                " GB/s");
  return text;
}

AdamWArrays fill_adamw_timing_state(Device& device, Stream& stream, float* state, size_t n) {
  std::vector<float> init(4 * n, 0.0f);
  std::fill(init.begin(), init.begin() + n, 1.0f);
  std::fill(init.begin() + 3 * n, init.end(), 1e-3f);
  device.copy_async(state, init.data(), init.size() * sizeof(float), stream);
  stream.synchronize();
  AdamWArrays arrays;
  arrays.params = state;
  arrays.m = state + n;
  arrays.v = state + 2 * n;
  arrays.grads = state + 3 * n;
  return arrays;
}

namespace {

// Work repeated on a thread of its own while the calibration times the CPU: the repetitions
// that ran entirely before stop() are counted.
class RepeatedWork {
 public:
  RepeatedWork(std::function<void()> once, std::latch& ready, std::latch& start)
      : thread_([this, once = std::move(once), &ready, &start] {
          try {
            once();  // warm-up, not counted
            ready.count_down();
            start.wait();
            while (!stop_.load()) {
              Stopwatch watch;
              once();
              if (stop_.load()) break;
              seconds_ += watch.seconds();
              done_.fetch_add(1);
            }
          } catch (...) {
            error_ = std::current_exception();
            ready.count_down();
          }
        }) {}
  ~RepeatedWork() { stop(); }
  RepeatedWork(const RepeatedWork&) = delete;
  RepeatedWork& operator=(const RepeatedWork&) = delete;

  int done() const { return done_.load(); }
  bool failed() const { return error_ != nullptr; }
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // Amount per second over the counted repetitions, each of `amount`; rethrows a failure.
  double rate(double amount) {
    stop();
    if (error_) std::rethrow_exception(error_);
    return done_.load() > 0 ? done_.load() * amount / seconds_ : 0;
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> done_{0};
  double seconds_ = 0;  // written by the thread alone, read after it is joined
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace

UpdateRates calibrate_update_rates(Device& device, UpdateRule& rule, size_t sample_params,
                                   const UpdateDTypes& types) {
  const size_t n = std::max<size_t>(sample_params, 1024);
  const size_t arrays = rule.state_floats();
  const size_t bytes = n * arrays * sizeof(float);
  const bool working16 =
      types.working == WorkingDType::kBF16 || types.working == WorkingDType::kF16;
  const size_t grad_bytes = types.grads == GradDType::kBF16 ? 2 : sizeof(float);
  const size_t working_bytes = working16 ? 2 : sizeof(float);
  // In each space: the state arrays (params 1, the rest 0) and the gradients (1e-3: no
  // denormals, no overflow), and the working copy the engine writes beside an update: in
  // the same pass when it is 16-bit, copied from the params after it when it is fp32 (on
  // the host the working copy of fp32 params is the params themselves). For copies beside
  // them, one array more each way.
  const size_t copy_bytes = n * sizeof(float);
  DeviceAllocation host = device.allocate(MemorySpace::kPinnedHost, bytes + n * grad_bytes);
  DeviceAllocation dev = device.allocate(MemorySpace::kDevice, bytes + n * grad_bytes);
  DeviceAllocation host_working =
      device.allocate(MemorySpace::kPinnedHost, working16 ? n * working_bytes : 0);
  DeviceAllocation dev_working = device.allocate(MemorySpace::kDevice, n * working_bytes);
  DeviceAllocation host_copies = device.allocate(MemorySpace::kPinnedHost, 2 * copy_bytes);
  DeviceAllocation dev_copies = device.allocate(MemorySpace::kDevice, 2 * copy_bytes);
  auto stream = device.create_stream("calibration");
  std::vector<float> state(arrays * n, 0.0f);
  std::fill(state.begin(), state.begin() + n, 1.0f);
  const std::vector<float> grads32(types.grads == GradDType::kBF16 ? 0 : n, 1e-3f);
  const std::vector<uint16_t> grads16(types.grads == GradDType::kBF16 ? n : 0,
                                      float_to_bf16(1e-3f));
  const void* grads = grads16.empty() ? static_cast<const void*>(grads32.data()) : grads16.data();
  for (DeviceAllocation* a : {&host, &dev}) {
    device.copy_async(a->data(), state.data(), bytes, *stream);
    device.copy_async(a->as<char>() + bytes, grads, n * grad_bytes, *stream);
  }
  stream->synchronize();
  auto over = [&](DeviceAllocation& a, DeviceAllocation& working) {
    RuleArrays r;
    r.state = a.as<float>();
    r.size = n;
    r.grads = a.as<char>() + bytes;
    r.grad_dtype = types.grads;
    if (working16) {
      r.params16 = working.data();
      r.params16_dtype = types.working;
    }
    return r;
  };
  const RuleArrays on_host = over(host, host_working), on_device = over(dev, dev_working);
  const UpdateSegment all{0, n, true};
  rule.begin_step(1, 1e-4f, 1.0f);
  UpdateRates rates;
  rates.state_bytes_per_param = arrays * sizeof(float);
  rates.working_bytes_per_param = working_bytes;
  const auto cpu_pass = [&] { rule.update_on_host(on_host, {&all, 1}); };
  const auto device_pass = [&](Stream& s) {
    device.launch_async(rule.device_update(on_device, {&all, 1}), s);
    if (!working16) device.copy_async(dev_working.data(), on_device.state, n * sizeof(float), s);
    s.synchronize();
  };
  const auto copy_pass = [&](Stream& s, void* to, const void* from, size_t size) {
    device.copy_async(to, from, size, s);
    s.synchronize();
  };
  rates.cpu_params_per_s = n / best_seconds(kPasses, cpu_pass);
  rates.device_params_per_s = n / best_seconds(kPasses, [&] { device_pass(*stream); });
  rates.h2d_bytes_per_s =
      bytes / best_seconds(kPasses, [&] { copy_pass(*stream, dev.data(), host.data(), bytes); });
  rates.d2h_bytes_per_s =
      bytes / best_seconds(kPasses, [&] { copy_pass(*stream, host.data(), dev.data(), bytes); });

  // All four at once, as while the CPU updates host subgroups and the device lane stages
  // others: the copies and device updates repeat on streams of their own around the CPU's
  // passes, which go on until each of them has also repeated a few times.
  auto h2d_stream = device.create_stream("calibration h2d");
  auto d2h_stream = device.create_stream("calibration d2h");
  auto compute_stream = device.create_stream("calibration compute");
  char* host_bytes = host_copies.as<char>();
  char* dev_bytes = dev_copies.as<char>();
  std::latch ready(3), start(1);
  RepeatedWork h2d([&] { copy_pass(*h2d_stream, dev_bytes, host_bytes, copy_bytes); }, ready,
                   start);
  RepeatedWork d2h(
      [&] { copy_pass(*d2h_stream, host_bytes + copy_bytes, dev_bytes + copy_bytes, copy_bytes); },
      ready, start);
  RepeatedWork compute([&] { device_pass(*compute_stream); }, ready, start);
  ready.wait();
  start.count_down();
  constexpr int kOthersRepetitions = 3;
  constexpr double kMaxSeconds = 10;
  int passes = 0;
  Stopwatch watch;
  const auto others_running = [&] { return !h2d.failed() && !d2h.failed() && !compute.failed(); };
  while (others_running() &&
         (passes < kPasses ||
          std::min({h2d.done(), d2h.done(), compute.done()}) < kOthersRepetitions) &&
         watch.seconds() < kMaxSeconds) {
    cpu_pass();
    passes++;
  }
  const double cpu_seconds = watch.seconds();
  rates.shared.h2d_bytes_per_s = h2d.rate(static_cast<double>(copy_bytes));
  rates.shared.d2h_bytes_per_s = d2h.rate(static_cast<double>(copy_bytes));
  rates.shared.device_params_per_s = compute.rate(static_cast<double>(n));
  rates.shared.cpu_params_per_s = passes * static_cast<double>(n) / cpu_seconds;
  // A kind of work that never finished a repetition beside the CPU (a slow link within
  // the time limit) is taken at its rate alone: the model then assumes no sharing for it.
  if (rates.shared.h2d_bytes_per_s == 0) rates.shared.h2d_bytes_per_s = rates.h2d_bytes_per_s;
  if (rates.shared.d2h_bytes_per_s == 0) rates.shared.d2h_bytes_per_s = rates.d2h_bytes_per_s;
  if (rates.shared.device_params_per_s == 0)
    rates.shared.device_params_per_s = rates.device_params_per_s;
  return rates;
}

UpdateRates calibrate_update_rates(Device& device, ThreadPool& pool, size_t sample_params,
                                   const UpdateDTypes& types) {
  AdamWRule adamw(AdamWHyper{.lr = 1e-4f, .weight_decay = 0.01f}, pool);
  return calibrate_update_rates(device, adamw, sample_params, types);
}

UpdateRates UpdateRates::while_shared() const {
  if (!shared.measured()) return *this;
  UpdateRates r = *this;
  r.cpu_params_per_s = shared.cpu_params_per_s;
  r.device_params_per_s = shared.device_params_per_s;
  r.h2d_bytes_per_s = shared.h2d_bytes_per_s;
  r.d2h_bytes_per_s = shared.d2h_bytes_per_s;
  return r;
}

namespace {

// Each lane's time alone at `rates` (see the top of perf_model.h).
UpdatePrediction lane_times(const OffloadPlan& plan, const UpdateRates& rates) {
  const double host = static_cast<double>(plan.params_at(UpdateSite::kHost));
  const double resident = static_cast<double>(plan.params_at(UpdateSite::kDeviceResident));
  const double staged = static_cast<double>(plan.params_at(UpdateSite::kDeviceStaged));
  const auto state = static_cast<double>(rates.state_bytes_per_param);
  const auto working = static_cast<double>(rates.working_bytes_per_param);
  double last_host = 0, largest_staged = 0;
  for (const Subgroup& s : plan.subgroups) {
    if (s.site == UpdateSite::kHost) last_host = static_cast<double>(s.size());
    if (s.site == UpdateSite::kDeviceStaged)
      largest_staged = std::max(largest_staged, static_cast<double>(s.size()));
  }
  UpdatePrediction p;
  if (host > 0)
    p.host_seconds = host / rates.cpu_params_per_s + last_host * working / rates.h2d_bytes_per_s;
  p.h2d_seconds = (host * working + staged * state) / rates.h2d_bytes_per_s;
  p.d2h_seconds = staged * state / rates.d2h_bytes_per_s;
  p.compute_seconds = (resident + staged) / rates.device_params_per_s;
  if (staged == 0) {
    p.device_seconds = std::max(p.h2d_seconds, p.compute_seconds);
  } else if (plan.settings.staging_buffers >= 2) {
    // A pipeline: its slowest stage throughout, and the other stages of one subgroup to
    // fill and drain it.
    const double in = largest_staged * state / rates.h2d_bytes_per_s;
    const double out = largest_staged * state / rates.d2h_bytes_per_s;
    const double update = largest_staged / rates.device_params_per_s;
    const double slowest = std::max({p.h2d_seconds, p.d2h_seconds, p.compute_seconds});
    const double fill = in + out + update -
                        (slowest == p.h2d_seconds   ? in
                         : slowest == p.d2h_seconds ? out
                                                    : update);
    p.device_seconds = slowest + fill;
  } else {
    // One staging buffer: prefetch, update and write-back of staged subgroups serialise.
    p.device_seconds = p.h2d_seconds + p.d2h_seconds + p.compute_seconds;
  }
  return p;
}

}  // namespace

std::string UpdatePrediction::to_text() const {
  std::string text = cat("predicted update time: ", seconds * 1e3, " ms (CPU ", host_seconds * 1e3,
                         " ms, device ", device_seconds * 1e3, " ms alone");
  if (overlap_seconds > 0) text += cat("; both at once for ", overlap_seconds * 1e3, " ms");
  return text + ")";
}

UpdatePrediction predict_update(const OffloadPlan& plan, const UpdateRates& rates) {
  UpdatePrediction p = lane_times(plan, rates);
  const UpdatePrediction shared = lane_times(plan, rates.while_shared());
  const double H = p.host_seconds, D = p.device_seconds;
  const double Hs = shared.host_seconds, Ds = shared.device_seconds;
  if (H == 0 || D == 0) {
    p.seconds = std::max(H, D);
  } else if (Hs <= Ds) {
    p.overlap_seconds = Hs;
    p.seconds = Hs + (1 - Hs / Ds) * D;
  } else {
    p.overlap_seconds = Ds;
    p.seconds = Ds + (1 - Ds / Hs) * H;
  }
  return p;
}

namespace {

// Residency within `budget`, then the best stride over `slots` staging buffers.
OffloadPlan best_plan_with_slots(const OffloadPlan& all_host, const UpdateRates& rates,
                                 size_t budget, int slots) {
  OffloadPlan plan = all_host;
  const size_t state_bytes = rates.state_bytes_per_param;
  for (Subgroup& s : plan.subgroups) {
    if (s.size() * state_bytes > budget) continue;
    s.site = UpdateSite::kDeviceResident;
    budget -= s.size() * state_bytes;
  }
  plan.settings.staging_buffers = std::max(slots, 1);
  if (slots == 0) return plan;
  OffloadPlan best = plan;
  double best_time = predict_update(plan, rates).seconds;
  for (int stride = 1; stride <= 16; stride++) {
    OffloadPlan candidate = plan;
    int x = 0;
    for (Subgroup& s : candidate.subgroups) {
      if (s.site != UpdateSite::kHost) continue;
      if (++x % stride == 0) s.site = UpdateSite::kDeviceStaged;
    }
    candidate.settings.stride = stride;
    const double seconds = predict_update(candidate, rates).seconds;
    if (seconds < best_time) {
      best_time = seconds;
      best = candidate;
    }
  }
  return best;
}

}  // namespace

OffloadPlan make_auto_plan(const OffloadSettings& settings, size_t num_params,
                           const UpdateRates& rates, size_t device_bytes_for_state) {
  return make_auto_plan(settings, num_params, ParamRange{0, num_params}, rates,
                        device_bytes_for_state);
}

OffloadPlan make_auto_plan(const OffloadSettings& settings, size_t num_params, ParamRange partition,
                           const UpdateRates& rates, size_t device_bytes_for_state) {
  OffloadSettings base = settings;
  base.schedule = UpdateSchedule::kCpu;
  OffloadPlan all_host = make_offload_plan(base, num_params, partition);
  all_host.settings.schedule = UpdateSchedule::kAuto;
  // Keeping state resident saves 24 bytes of transfers per parameter and step, but the
  // memory could instead hold staging buffers that put many more subgroups through the
  // device: try each number of staging buffers and keep the fastest prediction.
  const size_t slot_bytes = all_host.max_subgroup_size * rates.state_bytes_per_param;
  OffloadPlan best = best_plan_with_slots(all_host, rates, device_bytes_for_state, 0);
  double best_time = predict_update(best, rates).seconds;
  for (int slots = 1; slots <= std::max(settings.staging_buffers, 1); slots++) {
    if (slots * slot_bytes > device_bytes_for_state) break;
    const OffloadPlan candidate =
        best_plan_with_slots(all_host, rates, device_bytes_for_state - slots * slot_bytes, slots);
    const double seconds = predict_update(candidate, rates).seconds;
    if (seconds < best_time) {
      best_time = seconds;
      best = candidate;
    }
  }
  return best;
}

}  // namespace tandem
