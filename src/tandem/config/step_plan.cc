#include "tandem/config/step_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tandem/compute/compute_backend.h"
#include "tandem/config/compute_calibration.h"
#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/model/model_family.h"
#include "tandem/model/recompute_segments.h"
#include "tandem/zero/zero_traffic.h"

namespace tandem {

namespace {

// The time of B sequences from the samples around B (seconds per sequence beyond them).
PassSeconds interpolate(const ComputeRates& rates, int B, PassSeconds ComputeRates::Sample::*pass) {
  TANDEM_CHECK(!rates.samples.empty(), "no compute rates to predict a micro-batch of ", B);
  const auto& samples = rates.samples;
  const auto scaled = [&](const ComputeRates::Sample& s) {
    const double k = static_cast<double>(B) / s.micro_batch;
    return PassSeconds{(s.*pass).layer * k, (s.*pass).rest * k};
  };
  if (B <= samples.front().micro_batch) return scaled(samples.front());
  if (B >= samples.back().micro_batch) return scaled(samples.back());
  const auto above =
      std::find_if(samples.begin(), samples.end(),
                   [&](const ComputeRates::Sample& s) { return s.micro_batch >= B; });
  const ComputeRates::Sample& hi = *above;
  const ComputeRates::Sample& lo = *(above - 1);
  const double w = static_cast<double>(B - lo.micro_batch) / (hi.micro_batch - lo.micro_batch);
  return {(1 - w) * (lo.*pass).layer + w * (hi.*pass).layer,
          (1 - w) * (lo.*pass).rest + w * (hi.*pass).rest};
}

std::string layers_text(int n) { return n == 1 ? std::string("layer") : cat(n, " layers"); }

std::string ms(double seconds) { return format_fixed(seconds * 1e3, 1); }

}  // namespace

PassSeconds ComputeRates::forward(int B) const { return interpolate(*this, B, &Sample::forward); }
PassSeconds ComputeRates::backward(int B) const { return interpolate(*this, B, &Sample::backward); }

double forward_flops_per_token(const ModelConfig& model, int T) {
  const double C = model.n_embd;
  const double matrices_of_mlp = is_llama_family(model.type) ? 3 : 2;
  const double layer_matmul =
      C * model.qkv_width() + model.attention_width() * C + matrices_of_mlp * C * model.mlp_width();
  const double attention = 4.0 * T * model.attention_width();
  return model.n_layer * (2 * layer_matmul + attention) + 2 * C * model.vocab_size;
}

ComputeRates assumed_compute_rates(const ModelConfig& model, int T, std::vector<int> micro_batches,
                                   double flops_per_s, const std::string& gpu_name) {
  std::sort(micro_batches.begin(), micro_batches.end());
  micro_batches.erase(std::unique(micro_batches.begin(), micro_batches.end()), micro_batches.end());
  const double head_flops = 2.0 * model.n_embd * model.vocab_size;
  const double layer_flops = (forward_flops_per_token(model, T) - head_flops) / model.n_layer;
  ComputeRates rates;
  for (int B : micro_batches) {
    const double tokens = static_cast<double>(B) * T;
    const PassSeconds forward{layer_flops * tokens / flops_per_s,
                              head_flops * tokens / flops_per_s};
    rates.samples.push_back(
        {.micro_batch = B, .forward = forward, .backward = {2 * forward.layer, 2 * forward.rest}});
  }
  rates.source =
      cat("assumed (no GPU here): ", gpu_name, " at ", format_fixed(flops_per_s / 1e12, 0),
          " TFLOPS of model FLOPs, backward twice forward");
  return rates;
}

std::string StepSettings::to_text() const {
  std::string text = cat("micro-batch ", micro_batch, " x ", accumulation, ", ");
  if (recompute_interval == 0) return text + "no recompute";
  return text + cat("recompute every ", layers_text(recompute_interval),
                    cpu_checkpointing ? " (kept outputs on the host)" : "");
}

std::vector<StepSettings> step_candidates(const TrainConfig& config, int world_size) {
  const int fixed_B = config.micro_batch_size, fixed_G = config.gradient_accumulation_steps;
  const int64_t total = config.train_batch_size;
  std::vector<std::pair<int, int>> splits;  // (B, G)
  if (total == 0) {
    TANDEM_CHECK(fixed_B != kAuto && fixed_G != kAuto,
                 "train_batch_size is needed to choose the micro-batch or the accumulation");
    splits.emplace_back(fixed_B, fixed_G);
  } else {
    TANDEM_CHECK(total % world_size == 0, "train_batch_size ", total, " is not a multiple of the ",
                 world_size, " ranks; set a multiple of ", world_size);
    const int64_t per_rank = total / world_size;
    TANDEM_CHECK(per_rank <= std::numeric_limits<int>::max(), "train_batch_size ", total,
                 " is too large");
    const auto split_by = [&](int64_t B, int64_t G) {
      if (B * G == per_rank) splits.emplace_back(static_cast<int>(B), static_cast<int>(G));
    };
    if (fixed_B != kAuto && fixed_G != kAuto) {
      TANDEM_CHECK(int64_t{fixed_B} * fixed_G == per_rank, "train_batch_size ", total,
                   " is not train_micro_batch_size_per_gpu x gradient_accumulation_steps x ranks (",
                   fixed_B, " x ", fixed_G, " x ", world_size, " = ",
                   int64_t{fixed_B} * fixed_G * world_size,
                   "); change one of them, or set train_micro_batch_size_per_gpu or "
                   "gradient_accumulation_steps to \"auto\"");
      split_by(fixed_B, fixed_G);
    } else if (fixed_B != kAuto) {
      TANDEM_CHECK(per_rank % fixed_B == 0, "train_batch_size ", total,
                   " is not a multiple of train_micro_batch_size_per_gpu x ranks (", fixed_B, " x ",
                   world_size, "); change one of them");
      split_by(fixed_B, per_rank / fixed_B);
    } else if (fixed_G != kAuto) {
      TANDEM_CHECK(per_rank % fixed_G == 0, "train_batch_size ", total,
                   " is not a multiple of gradient_accumulation_steps x ranks (", fixed_G, " x ",
                   world_size, "); change one of them");
      split_by(per_rank / fixed_G, fixed_G);
    } else {
      for (int64_t B = 1; B <= per_rank; B++)
        if (per_rank % B == 0) split_by(B, per_rank / B);
    }
  }
  std::vector<StepSettings> out;
  const int L = config.model.n_layer;
  for (const auto& [B, G] : splits) {
    if (config.activation_checkpointing.interval != kAuto) {
      out.push_back({B, G, config.activation_checkpointing.interval,
                     config.activation_checkpointing.cpu_checkpointing});
      continue;
    }
    out.push_back({B, G, 0, false});
    // Every interval recomputes every layer once (recompute_segments.h), so among them the
    // one that takes the least device memory leaves the most to the optimizer state.
    for (const bool kept_on_host : {false, true}) {
      int best = 1;
      size_t least = std::numeric_limits<size_t>::max();
      for (int k = 1; k <= L; k++) {
        const size_t bytes = model_activation_bytes(config.model, B, config.seq_len(),
                                                    config.storage_dtype(), k, kept_on_host);
        if (bytes < least) least = bytes, best = k;
      }
      out.push_back({B, G, best, kept_on_host});
    }
  }
  return out;
}

TrainConfig with_step_settings(const TrainConfig& config, const StepSettings& settings,
                               int world_size) {
  TrainConfig out = config;
  out.micro_batch_size = settings.micro_batch;
  out.gradient_accumulation_steps = settings.accumulation;
  out.activation_checkpointing.interval = settings.recompute_interval;
  out.activation_checkpointing.cpu_checkpointing = settings.cpu_checkpointing;
  out.train_batch_size = int64_t{settings.micro_batch} * settings.accumulation * world_size;
  return out;
}

namespace {

// p.comm_bytes and p.communication over `world_size` ranks: the rule's own exchange (DeMo's)
// in the update, beside nothing; else the ZeRO stage's traffic, each part less what the
// compute beside it hides when the collectives run on their own thread. `forward` and
// `backward` are one micro-batch's (backward with its recompute).
void predict_communication(const TrainConfig& config, int world_size, const CommRate& comm,
                           double forward, double backward, StepPrediction& p) {
  TANDEM_CHECK(comm.bytes_per_s > 0, "predicting a step over ", world_size,
               " ranks needs the rate their data moves at (measure_comm_rate)");
  const OptimizerFamily& family = optimizer_family(config.optimizer.type);
  if (family.exchange_bytes != nullptr) {
    p.comm_bytes = family.exchange_bytes(config.optimizer, model_layout(config.model), world_size);
    p.communication = p.comm_bytes / comm.bytes_per_s;
    return;
  }
  const size_t elem_bytes = storage_dtype_bytes(config.storage_dtype());
  const ZeroStepTraffic traffic =
      zero_step_traffic(config.zero.stage, static_cast<size_t>(config.model.num_parameters()),
                        world_size, elem_bytes, elem_bytes);
  const auto exposed = [&](double bytes, double beside) {
    const double seconds = bytes / comm.bytes_per_s;
    return config.zero.overlap_comm ? std::max(0.0, seconds - beside) : seconds;
  };
  const int G = config.gradient_accumulation_steps;
  p.comm_bytes = traffic.total(G);
  p.communication = G * exposed(traffic.forward_per_micro_batch, forward) +
                    (G - 1) * exposed(traffic.backward_per_micro_batch, backward) +
                    exposed(traffic.backward_per_micro_batch + traffic.last_backward, backward) +
                    traffic.after_update / comm.bytes_per_s;
}

}  // namespace

StepPrediction predict_step(const TrainConfig& config, const TrainingMemoryPlan& memory,
                            const ComputeRates& compute, const CommRate& comm) {
  const int B = config.micro_batch_size, G = config.gradient_accumulation_steps;
  const int L = config.model.n_layer, T = config.seq_len();
  const int interval = config.activation_checkpointing.interval;
  const double forward = compute.forward(B).of(L), backward = compute.backward(B).of(L);
  const double recompute = interval > 0 ? L * compute.forward(B).layer : 0;
  StepPrediction p;
  p.forward = G * forward;
  p.backward = G * backward;
  p.recompute = G * recompute;
  const UpdateRates& rates = memory.rates;
  const auto copy_seconds = [](double bytes, double rate) { return rate > 0 ? bytes / rate : 0; };
  // cpu_checkpointing: each kept output goes out during forward and comes back during
  // backward, each beside that pass's compute.
  if (config.activation_checkpointing.cpu_checkpointing && interval > 0) {
    const auto kept = static_cast<double>(
        model_kept_output_host_bytes(config.model, B, T, config.storage_dtype(), interval));
    p.copies +=
        G * (std::max(0.0, copy_seconds(kept, rates.d2h_bytes_per_s) - forward) +
             std::max(0.0, copy_seconds(kept, rates.h2d_bytes_per_s) - (backward + recompute)));
  }
  // The host subgroups' gradients leave during the last micro-batch's backward.
  const double host_grads =
      static_cast<double>(memory.offload.params_at(UpdateSite::kHost)) * memory.model_elem_bytes;
  p.copies +=
      std::max(0.0, copy_seconds(host_grads, rates.d2h_bytes_per_s) - (backward + recompute));
  p.update = memory.prediction.seconds;
  const double hidden = memory.offload.settings.overlap_forward && p.update > 0
                            ? predict_hidden_update(memory.offload, memory.prediction, forward)
                            : 0;
  p.exposed_update = std::max(0.0, p.update - hidden);
  if (memory.world_size > 1)
    predict_communication(config, memory.world_size, comm, forward, backward + recompute, p);
  return p;
}

StepPlan rank_step_candidates(const TrainConfig& config, int world_size,
                              const std::vector<StepSettings>& candidates,
                              const ComputeRates& compute, const PlanMemoryFn& plan_memory,
                              const CommRate& comm) {
  StepPlan plan;
  plan.compute = compute;
  plan.seq_len = config.seq_len();
  plan.world_size = world_size;
  plan.comm = comm;
  // Every candidate splits the same share of train_batch_size.
  if (!candidates.empty())
    plan.sequences_per_rank = candidates.front().micro_batch * candidates.front().accumulation;
  for (const StepSettings& settings : candidates) {
    const TrainConfig resolved = with_step_settings(config, settings, world_size);
    TrainingMemoryPlan memory = plan_memory(resolved);
    if (!memory.fits() || !memory.host_fits()) {
      plan.not_fitting.push_back(settings);
      continue;
    }
    StepPrediction prediction = predict_step(resolved, memory, compute, comm);
    StepCandidate candidate{
        .settings = settings, .memory = std::move(memory), .prediction = prediction};
    candidate.tokens_per_s = static_cast<double>(plan.sequences_per_rank) * config.seq_len() /
                             candidate.prediction.seconds();
    plan.ranked.push_back(std::move(candidate));
  }
  // Equal predictions (a tie within a part in a million): the simpler setting first.
  std::stable_sort(plan.ranked.begin(), plan.ranked.end(),
                   [](const StepCandidate& a, const StepCandidate& b) {
                     if (std::abs(a.tokens_per_s - b.tokens_per_s) >
                         1e-6 * std::max(a.tokens_per_s, b.tokens_per_s))
                       return a.tokens_per_s > b.tokens_per_s;
                     if (a.settings.recompute_interval != b.settings.recompute_interval)
                       return a.settings.recompute_interval < b.settings.recompute_interval;
                     if (a.settings.cpu_checkpointing != b.settings.cpu_checkpointing)
                       return !a.settings.cpu_checkpointing;
                     return a.settings.micro_batch > b.settings.micro_batch;
                   });
  return plan;
}

std::string StepPlan::to_text(int runners_up) const {
  std::string text =
      cat("step plan: ", sequences_per_rank, " sequences (", int64_t{sequences_per_rank} * seq_len,
          " tokens) per optimizer step and rank; ", ranked.size(), " of ",
          ranked.size() + not_fitting.size(), " candidate settings fit\n");
  text += cat("compute ", compute.source, ":");
  for (const ComputeRates::Sample& s : compute.samples)
    text +=
        cat(" B=", s.micro_batch, " forward ", ms(s.forward.layer), "/layer + ", ms(s.forward.rest),
            ", backward ", ms(s.backward.layer), "/layer + ", ms(s.backward.rest), " ms;");
  text.back() = '\n';
  if (world_size > 1)
    text += cat("communication between the ", world_size, " ranks ", comm.source, ": ",
                format_fixed(comm.bytes_per_s / 1e9, 2), " GB/s per rank\n");
  const auto row = [this](const StepCandidate& c) {
    const StepPrediction& p = c.prediction;
    return cat(c.settings.to_text(), ", ", update_schedule_name(c.memory.offload.settings.schedule),
               " (", c.memory.offload.count(UpdateSite::kHost), " host, ",
               c.memory.offload.count(UpdateSite::kDeviceResident), " resident, ",
               c.memory.offload.count(UpdateSite::kDeviceStaged),
               " staged): ", format_fixed(c.tokens_per_s, 0), " tokens/s, step ", ms(p.seconds()),
               " ms = forward ", ms(p.forward), " + backward ", ms(p.backward), " + recompute ",
               ms(p.recompute), " + copies ", ms(p.copies), " + exposed update ",
               ms(p.exposed_update), " (of ", ms(p.update), ")",
               world_size > 1 ? cat(" + communication ", ms(p.communication), " (",
                                    format_bytes(static_cast<size_t>(p.comm_bytes)), " sent)")
                              : std::string());
  };
  if (ranked.empty()) return text + "none fits\n";
  text += cat("chosen: ", row(chosen()), "\n");
  for (size_t i = 1; i < ranked.size() && static_cast<int>(i) <= runners_up; i++)
    text += cat("  runner-up ", i, ": ", row(ranked[i]), "\n");
  return text;
}

namespace {

// The candidate that needs the least device memory for activations: the one to measure the
// update rates with (they do not depend on the micro-batch) and to name when none fits.
StepSettings leanest(const TrainConfig& config, const std::vector<StepSettings>& candidates) {
  const auto bytes = [&](const StepSettings& s) {
    return model_activation_bytes(config.model, s.micro_batch, config.seq_len(),
                                  config.storage_dtype(), s.recompute_interval,
                                  s.cpu_checkpointing);
  };
  return *std::min_element(
      candidates.begin(), candidates.end(),
      [&](const StepSettings& a, const StepSettings& b) { return bytes(a) < bytes(b); });
}

CommRate assumed_peer_rate(const AssumedGpu& gpu) {
  return {gpu.peer_bytes_per_s, gpu.peer_source};
}

using MeasureCompute = std::function<ComputeRates(const std::vector<int>& micro_batches)>;

StepPlan plan_step_with(const TrainConfig& config, int world_size,
                        const std::vector<StepSettings>& candidates,
                        const PlanMemoryFn& plan_memory, const MeasureCompute& measure,
                        const CommRate& comm) {
  std::vector<int> fitting;
  for (const StepSettings& settings : candidates) {
    const TrainingMemoryPlan memory = plan_memory(with_step_settings(config, settings, world_size));
    if (memory.fits() && memory.host_fits()) fitting.push_back(settings.micro_batch);
  }
  if (fitting.empty()) {
    const TrainConfig lean = with_step_settings(config, leanest(config, candidates), world_size);
    check_fits(plan_memory(lean), lean);
    fail("no setting of train_batch_size ", config.train_batch_size,
         " fits the machine's host memory (`tandem plan` shows each tier)");
  }
  return rank_step_candidates(config, world_size, candidates, measure(fitting), plan_memory, comm);
}

}  // namespace

StepPlan plan_step(const TrainConfig& config, Device& device, ThreadPool& pool, int world_size,
                   CommRate comm, Communicator* peers) {
  const std::vector<StepSettings> candidates = step_candidates(config, world_size);
  const ParamRange state_range = zero_state_range(config, world_size, 0);
  const std::optional<UpdateRates> rates =
      measure_update_rates(with_step_settings(config, leanest(config, candidates), world_size),
                           device, pool, state_range, world_size, peers);
  const DeviceKind kind = device.kind();
  const size_t capacity = device.device_capacity();
  // Beyond this many tokens a micro-batch's time per sequence hardly changes on a GPU, and
  // on a CPU not at all: fewer, shorter timings.
  const int max_tokens = kind == DeviceKind::kCuda ? 65536 : 8192;
  if (world_size > 1 && comm.bytes_per_s <= 0 && kind == DeviceKind::kCuda)
    comm = assumed_peer_rate(AssumedGpu{});
  return plan_step_with(
      config, world_size, candidates,
      [&](const TrainConfig& c) {
        return plan_training_at_rates(c, kind, capacity, state_range, world_size, rates);
      },
      [&](const std::vector<int>& micro_batches) {
        return calibrate_compute_rates(
            config, device, calibration_batches(micro_batches, config.seq_len(), max_tokens),
            kCalibrationPasses, peers);
      },
      comm);
}

StepPlan plan_step_without_gpu(const TrainConfig& config, ThreadPool& pool, int world_size,
                               const AssumedGpu& gpu) {
  const std::vector<StepSettings> candidates = step_candidates(config, world_size);
  const ParamRange state_range = zero_state_range(config, world_size, 0);
  const std::optional<UpdateRates> rates =
      assumed_gpu_update_rates(with_step_settings(config, leanest(config, candidates), world_size),
                               pool, state_range, world_size, gpu);
  return plan_step_with(
      config, world_size, candidates,
      [&](const TrainConfig& c) {
        return plan_training_on_assumed_gpu(c, rates, state_range, world_size, gpu);
      },
      [&](const std::vector<int>& micro_batches) {
        return assumed_compute_rates(config.model, config.seq_len(), micro_batches,
                                     gpu.model_flops_per_s, gpu.name);
      },
      world_size > 1 ? assumed_peer_rate(gpu) : CommRate{});
}

}  // namespace tandem
