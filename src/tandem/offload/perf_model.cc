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

namespace tandem {
namespace {

constexpr int kPasses = 5;

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
  if (shared_h2d.measured())
    text += cat("; beside host-to-device copies alone: CPU ", shared_h2d.cpu_params_per_s / 1e9,
                " G params/s, host-to-device ", shared_h2d.h2d_bytes_per_s / 1e9, " GB/s");
  if (ranks_at_once > 1)
    text += cat("; each the slowest of ", ranks_at_once, " ranks measuring at once");
  return text;
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

namespace {

// Work repeated beside the CPU's passes: one repetition, and what it does (bytes, params).
struct Beside {
  std::function<void()> once;
  double amount = 0;
};

// The CPU's passes (each `cpu_amount` params) timed while each of `others` repeats on a
// thread of its own; they go on until each of the others has also repeated a few times (or
// a time limit). Returns the CPU's params/s, then each other's amount/s (0: it never
// finished a repetition beside the CPU, a slow link within the time limit; the caller then
// takes its rate alone).
std::vector<double> measure_beside(const std::function<void()>& cpu_pass, size_t cpu_amount,
                                   const std::vector<Beside>& others) {
  constexpr int kOthersRepetitions = 3;
  constexpr double kMaxSeconds = 10;
  std::latch ready(static_cast<std::ptrdiff_t>(others.size())), start(1);
  std::vector<std::unique_ptr<RepeatedWork>> threads;
  for (const Beside& other : others)
    threads.push_back(std::make_unique<RepeatedWork>(other.once, ready, start));
  ready.wait();
  start.count_down();
  const auto keep_going = [&] {
    for (const auto& t : threads)
      if (t->failed()) return false;
    for (const auto& t : threads)
      if (t->done() < kOthersRepetitions) return true;
    return false;
  };
  int passes = 0;
  Stopwatch watch;
  while ((passes < kPasses || keep_going()) && watch.seconds() < kMaxSeconds) {
    cpu_pass();
    passes++;
  }
  std::vector<double> rates = {passes * static_cast<double>(cpu_amount) / watch.seconds()};
  for (size_t i = 0; i < others.size(); i++) rates.push_back(threads[i]->rate(others[i].amount));
  return rates;
}

}  // namespace

UpdateRates calibrate_update_rates(Device& device, UpdateRule& rule, size_t sample_params,
                                   const UpdateDTypes& types, size_t pass_params,
                                   const std::function<void()>& before_each_kind) {
  const size_t n = std::max<size_t>(sample_params, 1024);
  // Each pass updates a slice of `pass` params, the next pass the next slice: a subgroup's
  // state comes from memory as in training, where a step has gone by since it was last
  // touched, while the engine's own reuse within a subgroup (its working copy made right
  // after its update) still finds what the cache holds of it.
  const size_t pass = pass_params == 0 ? n : std::clamp<size_t>(pass_params, 1024, n);
  const size_t slices = n / pass;
  const size_t arrays = rule.state_floats();
  const bool working16 =
      types.working == WorkingDType::kBF16 || types.working == WorkingDType::kF16;
  const size_t grad_bytes = types.grads == GradDType::kBF16 ? 2 : sizeof(float);
  const size_t working_bytes = working16 ? 2 : sizeof(float);
  // In each space, per slice: the state arrays (params 1, the rest 0) and the gradients
  // (1e-3: no denormals, no overflow); and the working copy the engine writes beside an
  // update: in the same pass when it is 16-bit, copied from the params after it when it is
  // fp32 (on the host the working copy of fp32 params is the params themselves). For copies
  // beside them, one array of the whole sample more each way.
  const size_t state_bytes = pass * arrays * sizeof(float);
  const size_t slice_bytes = state_bytes + pass * grad_bytes;
  const size_t copy_bytes = n * sizeof(float);
  DeviceAllocation host = device.allocate(MemorySpace::kPinnedHost, slices * slice_bytes);
  DeviceAllocation dev = device.allocate(MemorySpace::kDevice, slices * slice_bytes);
  DeviceAllocation host_working =
      device.allocate(MemorySpace::kPinnedHost, working16 ? pass * working_bytes : 0);
  DeviceAllocation dev_working = device.allocate(MemorySpace::kDevice, pass * working_bytes);
  DeviceAllocation host_copies = device.allocate(MemorySpace::kPinnedHost, 2 * copy_bytes);
  DeviceAllocation dev_copies = device.allocate(MemorySpace::kDevice, 2 * copy_bytes);
  auto stream = device.create_stream("calibration");
  std::vector<char> slice(slice_bytes);
  std::fill_n(reinterpret_cast<float*>(slice.data()), pass, 1.0f);
  std::fill_n(reinterpret_cast<float*>(slice.data()) + pass, (arrays - 1) * pass, 0.0f);
  if (types.grads == GradDType::kBF16)
    std::fill_n(reinterpret_cast<uint16_t*>(slice.data() + state_bytes), pass,
                float_to_bf16(1e-3f));
  else
    std::fill_n(reinterpret_cast<float*>(slice.data() + state_bytes), pass, 1e-3f);
  for (DeviceAllocation* a : {&host, &dev})
    for (size_t i = 0; i < slices; i++)
      device.copy_async(a->as<char>() + i * slice_bytes, slice.data(), slice_bytes, *stream);
  stream->synchronize();
  auto over = [&](DeviceAllocation& a, DeviceAllocation& working) {
    std::vector<RuleArrays> all(slices);
    for (size_t i = 0; i < slices; i++) {
      RuleArrays& r = all[i];
      r.state = reinterpret_cast<float*>(a.as<char>() + i * slice_bytes);
      r.size = pass;
      r.grads = a.as<char>() + i * slice_bytes + state_bytes;
      r.grad_dtype = types.grads;
      if (working16) {
        r.params16 = working.data();
        r.params16_dtype = types.working;
      }
    }
    return all;
  };
  const std::vector<RuleArrays> on_host = over(host, host_working);
  const std::vector<RuleArrays> on_device = over(dev, dev_working);
  const UpdateSegment whole{0, pass, true};
  rule.begin_step(1, 1e-4f, 1.0f);
  UpdateRates rates;
  rates.state_bytes_per_param = arrays * sizeof(float);
  rates.working_bytes_per_param = working_bytes;
  size_t next_host = 0, next_device = 0;  // the slices the next passes update
  const auto cpu_pass = [&] { rule.update_on_host(on_host[next_host++ % slices], {&whole, 1}); };
  const auto device_pass = [&](Stream& s) {
    const RuleArrays& r = on_device[next_device++ % slices];
    device.launch_async(rule.device_update(r, {&whole, 1}), s);
    if (!working16) device.copy_async(dev_working.data(), r.state, pass * sizeof(float), s);
    s.synchronize();
  };
  const auto copy_pass = [&](Stream& s, void* to, const void* from, size_t size) {
    device.copy_async(to, from, size, s);
    s.synchronize();
  };
  const size_t all_bytes = slices * slice_bytes;
  const auto next_kind = [&] {
    if (before_each_kind) before_each_kind();
  };
  // Medians, not bests: a prediction of a real run wants the typical pass.
  next_kind();
  rates.cpu_params_per_s = pass / median_seconds(kPasses, cpu_pass);
  next_kind();
  rates.device_params_per_s = pass / median_seconds(kPasses, [&] { device_pass(*stream); });
  next_kind();
  rates.h2d_bytes_per_s = all_bytes / median_seconds(kPasses, [&] {
                            copy_pass(*stream, dev.data(), host.data(), all_bytes);
                          });
  next_kind();
  rates.d2h_bytes_per_s = all_bytes / median_seconds(kPasses, [&] {
                            copy_pass(*stream, host.data(), dev.data(), all_bytes);
                          });

  // Beside the CPU's passes, as while it updates host subgroups: the device lane's copies and
  // updates, each repeating on a stream of its own; and the working copies alone, the lane
  // of the cpu schedule.
  auto h2d_stream = device.create_stream("calibration h2d");
  auto d2h_stream = device.create_stream("calibration d2h");
  auto compute_stream = device.create_stream("calibration compute");
  char* host_bytes = host_copies.as<char>();
  char* dev_bytes = dev_copies.as<char>();
  const Beside h2d{[&] { copy_pass(*h2d_stream, dev_bytes, host_bytes, copy_bytes); },
                   static_cast<double>(copy_bytes)};
  const Beside d2h{
      [&] { copy_pass(*d2h_stream, host_bytes + copy_bytes, dev_bytes + copy_bytes, copy_bytes); },
      static_cast<double>(copy_bytes)};
  const Beside compute{[&] { device_pass(*compute_stream); }, static_cast<double>(pass)};
  next_kind();
  const std::vector<double> all = measure_beside(cpu_pass, pass, {h2d, d2h, compute});
  rates.shared = {.cpu_params_per_s = all[0],
                  .device_params_per_s = all[3] > 0 ? all[3] : rates.device_params_per_s,
                  .h2d_bytes_per_s = all[1] > 0 ? all[1] : rates.h2d_bytes_per_s,
                  .d2h_bytes_per_s = all[2] > 0 ? all[2] : rates.d2h_bytes_per_s};
  next_kind();
  const std::vector<double> copies = measure_beside(cpu_pass, pass, {h2d});
  rates.shared_h2d = {.cpu_params_per_s = copies[0],
                      .device_params_per_s = rates.device_params_per_s,
                      .h2d_bytes_per_s = copies[1] > 0 ? copies[1] : rates.h2d_bytes_per_s,
                      .d2h_bytes_per_s = rates.d2h_bytes_per_s};
  return rates;
}

UpdateRates UpdateRates::while_shared(bool device_lane_copies_only) const {
  const SharedRates& with = device_lane_copies_only && shared_h2d.measured() ? shared_h2d : shared;
  if (!with.measured()) return *this;
  UpdateRates r = *this;
  r.cpu_params_per_s = with.cpu_params_per_s;
  r.device_params_per_s = with.device_params_per_s;
  r.h2d_bytes_per_s = with.h2d_bytes_per_s;
  r.d2h_bytes_per_s = with.d2h_bytes_per_s;
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
  const bool copies_only =
      plan.count(UpdateSite::kDeviceStaged) == 0 && plan.count(UpdateSite::kDeviceResident) == 0;
  // Without staged or resident subgroups the device lane is the host subgroups' working
  // copies alone, which take less of the host than a lane that also stages and updates.
  const UpdatePrediction shared = lane_times(plan, rates.while_shared(copies_only));
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

double predict_hidden_update(const OffloadPlan& plan, const UpdatePrediction& prediction,
                             double forward_seconds) {
  const double U = prediction.seconds, F = forward_seconds;
  const double P = static_cast<double>(plan.partition.size());
  if (U <= 0 || F <= 0 || P == 0) return 0.0;
  const double slower = std::max(prediction.host_seconds, prediction.device_seconds);
  // Each lane's end, and its parameters (device lane: staged and resident subgroups).
  auto on_host = [](const Subgroup& s) { return s.site == UpdateSite::kHost; };
  double lane_end[2] = {U * prediction.host_seconds / slower,
                        U * prediction.device_seconds / slower};
  double lane_params[2] = {0, 0};
  for (const Subgroup& s : plan.subgroups) lane_params[on_host(s) ? 0 : 1] += s.size();
  double done[2] = {0, 0};
  double forward_end = F;
  for (const Subgroup& s : plan.subgroups) {
    const int lane = on_host(s) ? 0 : 1;
    done[lane] += s.size();
    const double t = lane_end[lane] * done[lane] / lane_params[lane];
    const double rest = F * (P - static_cast<double>(s.begin - plan.partition.begin)) / P;
    forward_end = std::max(forward_end, t + rest);
  }
  return std::max(0.0, U + F - forward_end);
}

namespace {

// Over `slots` staging buffers: the first r subgroups that fit in `budget` resident, for
// every r from none to as many as fit (resident state needs no copies, but a device slower
// than the CPU, as the cpu device's one thread is, updates it more slowly), and among the
// others every stride, or none; the plan with the smallest prediction.
OffloadPlan best_plan_with_slots(const OffloadPlan& all_host, const UpdateRates& rates,
                                 size_t budget, int slots) {
  OffloadPlan best;
  double best_time = std::numeric_limits<double>::infinity();
  const auto consider = [&](const OffloadPlan& candidate) {
    const double seconds = predict_update(candidate, rates).seconds;
    if (seconds < best_time) {
      best_time = seconds;
      best = candidate;
    }
  };
  const auto with_strides = [&](const OffloadPlan& plan) {
    consider(plan);
    for (int stride = 1; slots > 0 && stride <= 16; stride++) {
      OffloadPlan candidate = plan;
      int x = 0;
      for (Subgroup& s : candidate.subgroups) {
        if (s.site != UpdateSite::kHost) continue;
        if (++x % stride == 0) s.site = UpdateSite::kDeviceStaged;
      }
      candidate.settings.stride = stride;
      consider(candidate);
    }
  };
  OffloadPlan plan = all_host;
  plan.settings.staging_buffers = std::max(slots, 1);
  with_strides(plan);
  const size_t state_bytes = rates.state_bytes_per_param;
  for (Subgroup& s : plan.subgroups) {
    if (s.size() * state_bytes > budget) continue;
    s.site = UpdateSite::kDeviceResident;
    budget -= s.size() * state_bytes;
    with_strides(plan);
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
