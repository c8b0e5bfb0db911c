#include "tandem/train/trainer.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "tandem/compute/compute_backend.h"
#include "tandem/core/checksum.h"
#include "tandem/core/error.h"
#include "tandem/core/rng.h"
#include "tandem/core/timer.h"
#include "tandem/core/trace.h"
#include "tandem/data/dataset.h"
#include "tandem/data/loader.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/device/device.h"
#include "tandem/model/gpt.h"
#include "tandem/offload/update_engine.h"
#include "tandem/optim/grad_clip.h"
#include "tandem/optim/lr_schedule.h"
#include "tandem/train/memory_plan.h"
#include "tandem/train/metrics_log.h"
#include "tandem/train/progress.h"
#include "tandem/train/sampler.h"
#include "tandem/train/train_checkpoint.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {

// The seed of the sampling RNG, separate from the data order and the initialisation.
constexpr uint64_t kSampleSeedSalt = 0x5eed5a3b1e5ULL;

std::string describe_model_difference(const GptConfig& a, const GptConfig& b) {
  std::string diff;
  auto compare = [&](const char* key, int x, int y) {
    if (x != y) diff += cat(diff.empty() ? "" : ", ", "model.", key, " ", x, " vs ", y);
  };
  compare("vocab_size", a.vocab_size, b.vocab_size);
  compare("context_length", a.context_length, b.context_length);
  compare("n_layer", a.n_layer, b.n_layer);
  compare("n_head", a.n_head, b.n_head);
  compare("n_embd", a.n_embd, b.n_embd);
  return diff;
}

class Trainer {
 public:
  Trainer(const TrainConfig& config, const TrainOptions& options)
      : config_(config),
        options_(options),
        B_(config.micro_batch_size),
        T_(config.seq_len()),
        data_(load_dataset(config.data.train_path, config.data.val_path, config.data.val_fraction,
                           config.model.vocab_size)),
        train_loader_(data_.train, B_, T_, config.train.seed, true, "train"),
        device_(make_training_device(config)),
        optimizer_pool_(),
        plan_(checked_plan(config, *device_, optimizer_pool_)),
        backend_(on_gpu() ? make_cuda_backend(*device_) : make_cpu_backend(*device_)),
        model_(config.model, *backend_, B_, T_, config.storage_dtype()),
        engine_(*device_, optimizer_pool_, model_.layout(), plan_.offload,
                AdamWHyper{.lr = config.optimizer.lr,
                           .beta1 = config.optimizer.beta1,
                           .beta2 = config.optimizer.beta2,
                           .eps = config.optimizer.eps,
                           .weight_decay = config.optimizer.weight_decay},
                device_buffers(model_)),
        schedule_{.base_lr = config.optimizer.lr,
                  .warmup_steps = config.scheduler.warmup_num_steps,
                  .total_steps = config.train.steps,
                  .min_ratio = config.scheduler.cos_min_ratio},
        sample_rng_(config.train.seed ^ kSampleSeedSalt),
        progress_(config.train.steps, config.train.log_interval, options.show_progress),
        inputs_(static_cast<size_t>(B_) * T_),
        targets_(static_cast<size_t>(B_) * T_) {
    if (config.train.eval_interval > 0)
      val_loader_ =
          std::make_unique<DataLoader>(data_.val, B_, T_, config.train.seed, false, "val");
  }

  TrainResult run() {
    start();
    start_step_ = step_;
    const int64_t last_step = options_.stop_at_step > 0
                                  ? std::min(options_.stop_at_step, config_.train.steps)
                                  : config_.train.steps;
    TrainResult result;
    result.last_val_loss = std::numeric_limits<float>::quiet_NaN();
    MetricsLog metrics(options_.metrics_path);
    const double tokens_per_step =
        static_cast<double>(B_) * T_ * config_.gradient_accumulation_steps;
    if (!options_.trace_path.empty()) engine_.set_tracer(&tracer_);
    bool trace_written = false;
    while (step_ < last_step) {
      const int64_t number = step_ + 1;
      tracer_.set_enabled(!options_.trace_path.empty() && number >= options_.trace_first_step &&
                          number <= options_.trace_last_step);
      Stopwatch watch;
      const float lr = schedule_.lr_at(step_);
      const StepTimes times = train_step(lr);
      const float loss = times.loss;
      step_++;
      const double ms = watch.millis();
      const double tokens_per_s = tokens_per_step / (ms / 1e3);
      metrics.write({{"step", step_},
                     {"loss", loss},
                     {"lr", lr},
                     {"grad_norm", times.grad_norm},
                     {"tokens_per_s", tokens_per_s},
                     {"ms", ms},
                     {"forward_ms", times.forward_ms},
                     {"backward_ms", times.backward_ms},
                     {"update_ms", times.update.ms},
                     {"h2d_bytes", times.update.h2d_bytes},
                     {"d2h_bytes", times.update.d2h_bytes},
                     {"early_gradient_subgroups", times.update.early_gradient_subgroups}});
      result.steps.push_back({.step = step_,
                              .loss = loss,
                              .ms = ms,
                              .forward_ms = times.forward_ms,
                              .backward_ms = times.backward_ms,
                              .update_ms = times.update.ms,
                              .tokens_per_s = tokens_per_s,
                              .h2d_bytes = times.update.h2d_bytes,
                              .d2h_bytes = times.update.d2h_bytes});
      progress_.update(step_, loss, tokens_per_s, ms);
      if (tracer_.enabled() && (step_ == options_.trace_last_step || step_ == last_step)) {
        tracer_.set_enabled(false);
        tracer_.write(options_.trace_path);
        trace_written = true;
        progress_.note(cat("step ", step_, ": wrote the trace of steps ", options_.trace_first_step,
                           "-", step_, " to ", options_.trace_path.string()));
      }
      result.last_train_loss = loss;

      const bool finished = step_ == last_step;
      const int64_t eval_every = config_.train.eval_interval;
      if (val_loader_ && (step_ % eval_every == 0 || finished)) {
        result.last_val_loss = evaluate();
        metrics.write({{"step", step_}, {"val_loss", result.last_val_loss}});
        progress_.note(cat("step ", step_, ": val_loss ", result.last_val_loss));
      }
      const int64_t ckpt_every = config_.train.checkpoint_interval;
      if (options_.save_checkpoints && (finished || (ckpt_every > 0 && step_ % ckpt_every == 0))) {
        result.last_checkpoint = save();
        progress_.note(cat("step ", step_, ": saved ", result.last_checkpoint.string()));
      }
    }
    progress_.finish();
    if (!options_.trace_path.empty() && !trace_written)
      progress_.note(cat("tandem: no trace written: no step of --trace-steps ",
                         options_.trace_first_step, "-", options_.trace_last_step, " ran (steps ",
                         start_step_ + 1, "-", step_, " did)"));
    result.steps_done = step_;
    result.state_digest = state_digest();
    metrics.write({{"step", step_},
                   {"state_digest", result.state_digest},
                   {"schedule", std::string(update_schedule_name(config_.offload.schedule))}});
    if (config_.train.sample_bytes > 0)
      result.sample = sample_bytes(model_, "\n", config_.train.sample_bytes, sample_rng_);
    return result;
  }

 private:
  void start() {
    progress_.note(describe_plan());
    const fs::path checkpoints = checkpoints_root();
    if (!options_.resume.empty()) {
      resume(options_.resume);
      return;
    }
    TANDEM_CHECK(!options_.save_checkpoints || !fs::exists(checkpoints / "latest"),
                 "train.output_dir '", config_.train.output_dir,
                 "' already holds checkpoints of an earlier run; resume it "
                 "with --resume ",
                 config_.train.output_dir,
                 ", or start afresh in another directory with --set train.output_dir=DIR");
    // The engine holds the fp32 master weights and writes the model's working copy.
    const std::vector<float> params = model_.initial_params(config_.train.seed);
    const std::vector<float> zeros(params.size(), 0.0f);
    engine_.load_state(params.data(), zeros.data(), zeros.data(), 0);
    progress_.note(cat("tandem: training GPT-2 (", config_.model.n_layer, " layers, ",
                       config_.model.n_embd, " channels, ", config_.model.num_parameters(),
                       " parameters) on ", data_.train.size(), " tokens (",
                       train_loader_.batches_per_epoch(), " batches of ", B_, "x", T_,
                       " per epoch), ", config_.train.steps, " steps"));
  }

  bool on_gpu() const { return config_.device.type == "cuda"; }

  // The model's working parameters and gradients, as the engine reads and writes them.
  static UpdateEngine::DeviceBuffers device_buffers(Gpt& model) {
    const bool bf16 = model.dtype() == StorageDType::kBF16;
    return {.working_params = model.params(),
            .grads = model.grads(),
            .working_dtype = bf16 ? WorkingDType::kBF16 : WorkingDType::kF32,
            .grad_dtype = bf16 ? GradDType::kBF16 : GradDType::kF32,
            .producer = &model.backend().stream()};
  }

  static TrainingMemoryPlan checked_plan(const TrainConfig& config, Device& device,
                                         ThreadPool& pool) {
    TrainingMemoryPlan plan = plan_training(config, device, pool);
    check_fits(plan, config);
    return plan;
  }

  std::string describe_plan() const {
    std::string text = plan_.to_text();
    while (!text.empty() && text.back() == '\n') text.pop_back();
    std::string indented =
        "tandem: optimizer update plan on the " + std::string(device_->name()) + " device:\n  ";
    for (char c : text) indented += c == '\n' ? std::string("\n  ") : std::string(1, c);
    return indented;
  }

  // XXH3-64 over params, m and v: equal digests mean bit-identical optimizer state.
  std::string state_digest() {
    const size_t P = model_.layout().num_elements();
    std::vector<float> state(3 * P);
    engine_.read_state(state.data(), state.data() + P, state.data() + 2 * P);
    return checksum_hex(checksum64(state.data(), state.size() * sizeof(float)));
  }

  void resume(const fs::path& path) {
    TrainingState state = load_training_checkpoint(path);
    const std::string diff = describe_model_difference(state.config.model, config_.model);
    TANDEM_CHECK(diff.empty(), path.string(), ": the checkpoint's model differs from the config (",
                 diff, "); resume with the config the run started with");
    TANDEM_CHECK(state.step <= config_.train.steps, path.string(), ": the checkpoint is at step ",
                 state.step, ", beyond train.steps = ", config_.train.steps,
                 "; raise train.steps to continue");
    engine_.load_state(state.params.data(), state.exp_avg.data(), state.exp_avg_sq.data(),
                       state.step);
    train_loader_.set_position(state.train_position);
    sample_rng_.set_state(state.sample_rng);
    step_ = state.step;
    progress_.note(
        cat("tandem: resumed ", path.string(), " at step ", step_, " of ", config_.train.steps));
  }

  struct StepTimes {
    float loss = 0;
    double grad_norm = 0;
    double forward_ms = 0, backward_ms = 0;
    UpdateStepStats update;
  };

  StepTimes train_step(float lr) {
    StepTimes times;
    model_.zero_grads();
    const int accum = config_.gradient_accumulation_steps;
    double loss_sum = 0.0;
    for (int micro = 0; micro < accum; micro++) {
      train_loader_.next_batch(inputs_, targets_);
      Stopwatch watch;
      {
        TraceScope scope(&tracer_, "compute", cat("forward ", micro));
        loss_sum += model_.forward(inputs_.data(), targets_.data(), B_, T_);
      }
      times.forward_ms += watch.millis();
      watch.reset();
      {
        TraceScope scope(&tracer_, "compute", cat("backward ", micro));
        // The last micro-batch makes the gradients final: the engine starts offloading
        // each block's gradients as soon as backward is done with it.
        if (micro + 1 == accum) {
          model_.backward(1.0f / accum, [this](size_t begin, size_t end) {
            engine_.gradients_ready(begin, end);
          });
        } else {
          model_.backward(1.0f / accum);
        }
      }
      times.backward_ms += watch.millis();
    }
    const float loss = static_cast<float>(loss_sum / accum);
    times.loss = loss;
    TANDEM_CHECK(
        std::isfinite(loss), "the training loss became ", loss, " at step ", step_ + 1,
        "; lower optimizer.params.lr or set gradient_clipping (the last checkpoint is intact)");
    times.grad_norm = std::sqrt(model_.grad_sum_of_squares());
    const float scale = clip_scale(times.grad_norm, config_.gradient_clipping);
    TraceScope scope(&tracer_, "update", cat("optimizer step ", step_ + 1));
    times.update = engine_.step(lr, scale);
    return times;
  }

  float evaluate() {
    val_loader_->reset();
    const int64_t batches =
        std::min<int64_t>(config_.train.eval_batches, val_loader_->batches_per_epoch());
    double sum = 0.0;
    for (int64_t i = 0; i < batches; i++) {
      val_loader_->next_batch(inputs_, targets_);
      sum += model_.forward(inputs_.data(), targets_.data(), B_, T_);
    }
    return static_cast<float>(sum / batches);
  }

  fs::path checkpoints_root() const { return fs::path(config_.train.output_dir) / "checkpoints"; }

  fs::path save() {
    TrainingState state;
    state.config = config_;
    state.step = step_;
    state.train_position = train_loader_.position();
    state.sample_rng = sample_rng_.state();
    const size_t P = model_.layout().num_elements();
    state.params.resize(P);
    state.exp_avg.resize(P);
    state.exp_avg_sq.resize(P);
    engine_.read_state(state.params.data(), state.exp_avg.data(), state.exp_avg_sq.data());
    return save_training_checkpoint(checkpoints_root(), state);
  }

  TrainConfig config_;
  TrainOptions options_;
  TraceRecorder tracer_;  // before the engine and device that may write to it
  int B_, T_;
  TokenSplit data_;
  DataLoader train_loader_;
  std::unique_ptr<DataLoader> val_loader_;
  // The device first: the backend's tensors and the engine's state live in it, and it
  // must outlive them.
  std::unique_ptr<Device> device_;
  ThreadPool optimizer_pool_;  // pinned threads for the CPU AdamW, one per CPU
  TrainingMemoryPlan plan_;    // made before anything is allocated on the device
  std::unique_ptr<ComputeBackend> backend_;
  Gpt model_;
  UpdateEngine engine_;
  WarmupCosineSchedule schedule_;
  Rng sample_rng_;
  ProgressLine progress_;
  std::vector<int32_t> inputs_, targets_;
  int64_t step_ = 0;
  int64_t start_step_ = 0;  // where this invocation began (after a resume: the checkpoint's)
};

}  // namespace

TrainResult train(const TrainConfig& config, const TrainOptions& options) {
  Trainer trainer(config, options);
  return trainer.run();
}

}  // namespace tandem
