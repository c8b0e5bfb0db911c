#include "tandem/train/step_runner.h"

#include <cmath>
#include <limits>

#include "tandem/ckpt/state_digest.h"
#include "tandem/comm/agreement.h"
#include "tandem/core/format.h"
#include "tandem/core/step_hooks.h"
#include "tandem/core/timer.h"
#include "tandem/core/trace.h"
#include "tandem/data/loader.h"
#include "tandem/model/model.h"
#include "tandem/optim/grad_clip.h"
#include "tandem/optim/optimizer_family.h"
#include "tandem/zero/data_parallel.h"
#include "tandem/zero/gradient_accumulator.h"

namespace tandem {

StepRunner::StepRunner(Parts parts)
    : parts_(std::move(parts)),
      B_(parts_.config.micro_batch_size),
      T_(parts_.config.seq_len()),
      inputs_(static_cast<size_t>(B_) * T_),
      targets_(static_cast<size_t>(B_) * T_) {
  const OptimizerFamily& family = optimizer_family(parts_.config.optimizer.type);
  if (family.make_hooks != nullptr)
    optimizer_hooks_ =
        family.make_hooks({.config = parts_.config.optimizer,
                           .comm = parts_.comm,
                           .updated = [this] { return updated_; },
                           .read_params =
                               [this] {
                                 return std::move(read_engine_state(
                                     parts_.engine, parts_.model.layout().num_elements())[0]);
                               }});
}

StepRunner::~StepRunner() = default;

StepHooks* StepRunner::optimizer_hooks() const { return optimizer_hooks_.get(); }

bool StepRunner::micro_major() const {
  return !DataParallel::model_holds_gradients(parts_.config.zero.stage);
}

bool StepRunner::reduces_gradients() const {
  return optimizer_family(parts_.config.optimizer.type).reduces_gradients;
}

StepTimes StepRunner::run(int64_t step, double lr) {
  StepTimes times;
  DataParallel& data_parallel = parts_.data_parallel;
  const CommunicatorTraffic traffic_before = traffic();
  const double collective_before = data_parallel.collective_seconds();
  const double collective_wait_before = data_parallel.collective_wait_seconds();
  const std::vector<float> micro_losses = forward_backward(times.figures);
  {
    TraceScope scope(&parts_.tracer, "compute", "before update (gradient reduction)");
    for (StepHooks* hooks : parts_.hooks) hooks->before_update(step);
  }
  times.figures.loss = data_parallel.global_mean_loss(micro_losses, micro_major());
  times.figures.grad_norm = std::sqrt(
      data_parallel.grad_sum_of_squares([this] { return parts_.model.grad_sum_of_squares(); }));
  update(step, lr, times);
  {
    TraceScope scope(&parts_.tracer, "compute", "after update (parameter gather)");
    for (StepHooks* hooks : parts_.hooks) hooks->after_update(step);
  }
  times.replicas_checked =
      optimizer_hooks_ != nullptr && optimizer_hooks_->replicas_proved_identical(step);
  const CommunicatorTraffic traffic_after = traffic();
  times.figures.comm_bytes_sent = traffic_after.bytes_sent - traffic_before.bytes_sent;
  times.figures.comm_bytes_received = traffic_after.bytes_received - traffic_before.bytes_received;
  times.figures.collective_ms = 1e3 * (data_parallel.collective_seconds() - collective_before);
  times.figures.collective_wait_ms =
      1e3 * (data_parallel.collective_wait_seconds() - collective_wait_before);
  return times;
}

// With a loss mask the step's loss is the mean over every target of the step the mask
// counts (PyTorch's ignore_index on the whole batch), so a micro-batch weighs by its
// counted targets: loss_scale_m = counted_m / counted over the micro-batches the mean is
// over (every rank's when the gradients are reduced). The loader knows every rank's
// batches, so each rank counts them alone.
StepRunner::MaskWeights StepRunner::mask_weights() const {
  const DataLoader& loader = parts_.loader;
  const uint64_t A = static_cast<uint64_t>(parts_.config.gradient_accumulation_steps);
  MaskWeights weights;
  uint64_t ahead = 0;
  for (uint64_t micro = 0; micro < A; micro++) {
    ahead += others_before(static_cast<int>(micro));
    weights.own.push_back(loader.counted_targets_ahead(ahead));
    ahead += 1 + others_after(static_cast<int>(micro));
  }
  if (reduces_gradients()) {
    for (uint64_t batch = 0; batch < ahead; batch++)
      weights.total += loader.counted_targets_ahead(batch);
  } else {
    for (const uint64_t counted : weights.own) weights.total += counted;
  }
  weights.micro_batches = reduces_gradients() ? ahead : A;
  return weights;
}

// This rank's micro-batches of the step, forward and backward; returns their losses.
std::vector<float> StepRunner::forward_backward(StepRecord& figures) {
  const int accum = parts_.config.gradient_accumulation_steps;
  // The mean over the global batch; without a reduction, over this rank's micro-batches.
  attempts_++;
  const bool inject_nan = parts_.nan_gradient_attempts.count(attempts_) != 0;
  const float loss_scale =
      inject_nan ? std::numeric_limits<float>::quiet_NaN()
                 : 1.0f / static_cast<float>(reduces_gradients() ? accum * parts_.comm.world_size()
                                                                 : accum);
  const bool masked = parts_.loader.has_loss_mask();
  const MaskWeights weights = masked ? mask_weights() : MaskWeights{};
  if (masked) figures.counted_targets = static_cast<int64_t>(weights.total);
  std::vector<float> micro_losses;
  parts_.accumulator.start_step();
  for (int micro = 0; micro < accum; micro++) {
    parts_.loader.skip_batches(others_before(micro));
    parts_.loader.next_batch(inputs_, targets_);
    parts_.loader.skip_batches(others_after(micro));
    Stopwatch watch;
    {
      TraceScope scope(&parts_.tracer, "compute", cat("forward ", micro));
      micro_losses.push_back(parts_.model.forward(inputs_.data(), targets_.data(), B_, T_));
    }
    // The last step's update may have run on behind this forward (overlap_forward), and
    // still read the gradients that backward overwrites.
    if (micro == 0) {
      const UpdateEngine::OverlapTimes overlap = parts_.engine.finish_update();
      figures.update_hidden_ms = overlap.hidden_ms;
      figures.update_wait_ms = overlap.waited_ms;
    }
    figures.forward_ms += watch.millis();
    watch.reset();
    float scale = loss_scale;
    if (masked && !inject_nan) {
      // The step's mean as global_mean_loss forms it (the plain mean of the micro-batch
      // losses it is given): each loss weighed by micro_batches * counted_m / total. A step
      // of which the mask counts nothing has no loss: NaN, and update() skips it.
      const double share = weights.total == 0 ? 0.0
                                              : static_cast<double>(weights.own[micro]) /
                                                    static_cast<double>(weights.total);
      scale = static_cast<float>(share);
      micro_losses.back() = weights.total == 0
                                ? std::numeric_limits<float>::quiet_NaN()
                                : static_cast<float>(micro_losses.back() * share *
                                                     static_cast<double>(weights.micro_batches));
    }
    backward(micro, scale);
    figures.backward_ms += watch.millis();
  }
  return micro_losses;
}

void StepRunner::backward(int micro, float loss_scale) {
  Model& model = parts_.model;
  TraceScope scope(&parts_.tracer, "compute", cat("backward ", micro));
  model.zero_grads();
  parts_.data_parallel.start_micro_batch(micro);
  if (micro + 1 == parts_.config.gradient_accumulation_steps) {
    // The last micro-batch makes the gradients final block by block: each block is summed
    // with the earlier micro-batches, reduced over the ranks, and the engine starts
    // offloading it, while backward goes on with the blocks below.
    model.backward(loss_scale, [this, &model](size_t begin, size_t end) {
      if (!micro_major()) parts_.accumulator.finish(model.grads(), begin, end);
      for (StepHooks* hooks : parts_.hooks) hooks->gradients_final(begin, end);
    });
  } else {
    model.backward(loss_scale);
    if (!micro_major()) parts_.accumulator.add(model.grads());
  }
  parts_.data_parallel.finish_micro_batch();
  // On a GPU backward only queues kernels: wait for them, so that backward_ms is their time
  // rather than the launches' (the gradient norm after them waits anyway).
  model.backend().stream().synchronize();
}

// A non-finite loss or gradient never reaches the optimizer state: the step is skipped, on
// every rank alike (without a reduction, DeMo's norms are each rank's own).
void StepRunner::update(int64_t step, double lr, StepTimes& times) {
  const bool finite = std::isfinite(times.figures.loss) && std::isfinite(times.figures.grad_norm);
  times.skipped = parts_.comm.world_size() > 1 && !reduces_gradients()
                      ? !all_ranks_ok(parts_.comm, finite)
                      : !finite;
  updated_ = !times.skipped;
  if (times.skipped) {
    parts_.engine.skip_step();
    return;
  }
  const float scale = clip_scale(times.figures.grad_norm, parts_.config.gradient_clipping);
  TraceScope scope(&parts_.tracer, "update", cat("optimizer step ", step));
  times.update = parts_.engine.step(lr, scale);
}

uint64_t StepRunner::others_before(int micro) const {
  const uint64_t rank = parts_.comm.rank();
  const uint64_t A = parts_.config.gradient_accumulation_steps;
  if (micro_major()) return rank;
  return micro == 0 ? rank * A : 0;
}

uint64_t StepRunner::others_after(int micro) const {
  const uint64_t later_ranks = parts_.comm.world_size() - 1 - parts_.comm.rank();
  const int A = parts_.config.gradient_accumulation_steps;
  if (micro_major()) return later_ranks;
  return micro + 1 == A ? later_ranks * A : 0;
}

// What this rank moved so far through both communicators (one object on the cpu device).
CommunicatorTraffic StepRunner::traffic() const {
  CommunicatorTraffic total = parts_.comm.traffic();
  if (&parts_.buffer_comm != &parts_.comm) {
    total.bytes_sent += parts_.buffer_comm.traffic().bytes_sent;
    total.bytes_received += parts_.buffer_comm.traffic().bytes_received;
  }
  return total;
}

}  // namespace tandem
