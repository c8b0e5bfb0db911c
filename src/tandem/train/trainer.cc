#include "tandem/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/init_from.h"
#include "tandem/ckpt/resume_check.h"
#include "tandem/ckpt/run_checkpoints.h"
#include "tandem/ckpt/sharded_checkpoint.h"
#include "tandem/ckpt/state_digest.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/comm/agreement.h"
#include "tandem/comm/cpu_binding.h"
#include "tandem/comm/communicator.h"
#include "tandem/comm/local_group.h"
#include "tandem/comm/nccl_communicator.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/config/memory_plan.h"
#include "tandem/core/checksum.h"
#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/core/rng.h"
#include "tandem/core/step_hooks.h"
#include "tandem/core/stop_signals.h"
#include "tandem/core/timer.h"
#include "tandem/core/trace.h"
#include "tandem/data/byte_tokenizer.h"
#include "tandem/data/dataset.h"
#include "tandem/data/loader.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/device/device.h"
#include "tandem/model/model_family.h"
#include "tandem/offload/update_engine.h"
#include "tandem/optim/grad_clip.h"
#include "tandem/optim/lr_schedule.h"
#include "tandem/optim/optimizer_family.h"
#include "tandem/train/evaluation.h"
#include "tandem/train/gradient_hooks.h"
#include "tandem/train/preflight.h"
#include "tandem/train/run_directory.h"
#include "tandem/train/run_report.h"
#include "tandem/train/sampler.h"
#include "tandem/train/step_runner.h"
#include "tandem/train/step_settings.h"
#include "tandem/zero/buffer_communicator.h"
#include "tandem/zero/data_parallel.h"
#include "tandem/zero/gradient_accumulator.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {

// The seed of the sampling RNG, separate from the data order and the initialisation.
constexpr uint64_t kSampleSeedSalt = 0x5eed5a3b1e5ULL;

// Options as rank `rank` uses them: only rank 0 prints, writes metrics and checkpoints.
TrainOptions options_for_rank(TrainOptions options, int rank) {
  if (rank == 0) return options;
  options.show_progress = false;
  options.metrics_path.clear();
  options.trace_path.clear();
  return options;
}

bool reduces_gradients(const TrainConfig& config) {
  return optimizer_family(config.optimizer.type).reduces_gradients;
}

BufferCommunicatorChoice buffer_choice(const TrainConfig& config) {
  return {.cuda_device = config.device.type == DeviceKind::kCuda,
          .overlapped_reduction = config.zero.overlap_comm && reduces_gradients(config)};
}

// The buffers the model allocates itself: its working parameters below stage 3, its
// gradients below stage 2 (zero/data_parallel.h holds the rest).
ModelOwnBuffers model_buffers(const TrainConfig& config, int world_size) {
  const int stage = config.zero.stage;
  return {.params = stage < 3,
          .params_capacity = DataParallel::working_params_capacity(
              static_cast<size_t>(config.model.num_parameters()), world_size, stage),
          .grads = DataParallel::model_holds_gradients(stage),
          .recompute_interval = config.activation_checkpointing.interval,
          .recompute_kept_on_host = config.activation_checkpointing.cpu_checkpointing};
}

DataParallel::ModelBuffers data_parallel_buffers(Model& model, const TrainConfig& config) {
  return {.backend = &model.backend(),
          .grads = model.grads(),
          .grad_dtype = model.dtype(),
          .working_params = model.params(),
          .working_dtype = model.dtype(),
          .num_params = model.layout().num_elements(),
          .blocks = model.blocks(),
          .micro_batches = config.gradient_accumulation_steps};
}

// The working parameters and gradients as the engine reads and writes them: the model's,
// or this rank's partitions of them (zero/data_parallel.h).
UpdateEngine::DeviceBuffers engine_buffers(Model& model, DataParallel& data_parallel) {
  const bool bf16 = model.dtype() == StorageDType::kBF16;
  return {.working_params = data_parallel.engine_working_params(),
          .grads = data_parallel.engine_grads(),
          .working_dtype = bf16 ? WorkingDType::kBF16 : WorkingDType::kF32,
          .grad_dtype = bf16 ? GradDType::kBF16 : GradDType::kF32,
          .grads_begin = data_parallel.engine_grads_begin(),
          .working_range = data_parallel.engine_working_range(),
          .producer = &model.backend().stream()};
}

TrainingMemoryPlan checked_plan(const TrainConfig& config, Device& device, ThreadPool& pool,
                                Communicator& comm, const TrainOptions& options) {
  // Every rank times the update at once: on one machine they share its cores and memory
  // bandwidth, as their updates do in every step.
  TrainingMemoryPlan plan =
      plan_training(config, device, pool, zero_state_range(config, comm.world_size(), comm.rank()),
                    comm.world_size(), &comm);
  check_fits(plan, config);
  check_plan_fits_host(plan, options.allow_host_overcommit, comm);
  return plan;
}

class Trainer {
 public:
  Trainer(const TrainConfig& config, const TrainOptions& options, Communicator& comm,
          Communicator* buffer_comm, TokenSplit data)
      : config_(config),
        options_(options_for_rank(options, comm.rank())),
        comm_(comm),
        run_dir_(config_.train.output_dir, options_.save_checkpoints),
        nccl_buffer_comm_(make_nccl_buffer_communicator(comm, buffer_comm, buffer_choice(config))),
        B_(config.micro_batch_size),
        T_(config.seq_len()),
        data_(std::move(data)),
        train_tokens_xxh3_(
            checksum_hex(checksum64(data_.train.data(), data_.train.size() * sizeof(int32_t)))),
        train_loader_(data_.train, B_, T_, config.train.seed, true, "train", data_.train_mask),
        // On the GPU NCCL picked for this rank, with several ranks on the cuda device.
        device_(make_training_device(
            config, nccl_buffer_comm_ ? nccl_communicator_device(*nccl_buffer_comm_) : 0,
            options.cpu_device_injection)),
        buffer_comms_(comm, buffer_comm, nccl_buffer_comm_.get(), buffer_choice(config), *device_),
        buffer_comm_(buffer_comms_.get()),
        plan_(checked_plan(config, *device_, optimizer_pool_, comm, options)),
        backend_(on_gpu() ? make_cuda_backend(*device_) : make_cpu_backend(*device_)),
        model_owner_(make_model(config.model, *backend_, B_, T_, config.storage_dtype(),
                                model_buffers(config, comm.world_size()))),
        model_(*model_owner_),
        data_parallel_(comm, buffer_comm_, config.zero, data_parallel_buffers(model_, config)),
        engine_(*device_, model_.layout(), plan_.offload,
                optimizer_family(config.optimizer.type)
                    .make_rule(config.optimizer, model_.layout(), comm, optimizer_pool_),
                engine_buffers(model_, data_parallel_)),
        // Stages 0 and 1 sum a rank's micro-batches in the model's gradient buffer; from
        // stage 2 the owners sum them in their partitions (zero/partitioned_gradients.h).
        accumulator_(*backend_, model_.dtype(), model_.layout().num_elements(),
                     DataParallel::model_holds_gradients(config.zero.stage)
                         ? config.gradient_accumulation_steps
                         : 1),
        checkpoints_({.config = config_,
                      .comm = comm,
                      .engine = engine_,
                      .device = *device_,
                      .data_parallel = data_parallel_,
                      .root = checkpoints_root(),
                      .snapshot = plan_.snapshot,
                      .saves = options_.save_checkpoints,
                      .train_tokens_xxh3 = train_tokens_xxh3_,
                      .train_tokens = data_.train.size(),
                      .position =
                          [this] {
                            return LoopPosition{.step = step_,
                                                .train_position = train_loader_.position(),
                                                .sample_rng = sample_rng_.state()};
                          },
                      .before_save = [this] { run_dir_.check_still_held(); },
                      .recorded = [this](CheckpointRecord r) { record_checkpoint(std::move(r)); },
                      .note = [this](const std::string& line) { report_.note(line); }}),
        data_parallel_hooks_(data_parallel_, engine_),
        local_gradient_hooks_(engine_),
        schedule_{.base_lr = config.optimizer.lr,
                  .warmup_steps = config.scheduler.warmup_num_steps,
                  .total_steps = config.train.steps,
                  .min_ratio = config.scheduler.cos_min_ratio},
        sample_rng_(config.train.seed ^ kSampleSeedSalt),
        report_(options_.metrics_path, config.train.steps, config.train.log_interval,
                options_.show_progress),
        runner_({.config = config_,
                 .comm = comm,
                 .buffer_comm = buffer_comm_,
                 .model = model_,
                 .data_parallel = data_parallel_,
                 .engine = engine_,
                 .accumulator = accumulator_,
                 .loader = train_loader_,
                 .hooks = hooks_,
                 .tracer = tracer_,
                 .nan_gradient_attempts = options.nan_gradient_attempts}) {
    model_.set_block_memory(data_parallel_.block_memory());
    // The forward after an update reads each block once its update is done, while the
    // engine updates the later ones (offload_optimizer.overlap_forward).
    // A GPU's kernels wait on its stream; the CPU backend's run as they are called.
    model_.set_parameters_needed(
        [this, reader = on_gpu() ? &backend_->stream() : nullptr](ParamRange block) {
          engine_.wait_for_parameters(block, reader);
        });
    // Stage 3 gathers a block from its owners as the model acquires it: each owner sends
    // its piece once its own update of it is done (the gather reads it from the host).
    data_parallel_.set_piece_needed(
        [this](ParamRange piece) { engine_.wait_for_parameters(piece, nullptr); });
    if (reduces_gradients(config))
      hooks_.push_back(&data_parallel_hooks_);
    else
      hooks_.push_back(&local_gradient_hooks_);
    // The optimizer's own hooks (its family row's, made by the runner; DeMo's replica check).
    if (StepHooks* optimizer_hooks = runner_.optimizer_hooks()) hooks_.push_back(optimizer_hooks);
    hooks_.insert(hooks_.end(), options.hooks.begin(), options.hooks.end());
    hooks_.push_back(&checkpoints_);
    if (config.train.eval_interval > 0 && (comm.rank() == 0 || every_rank_runs_the_model()))
      val_loader_ = std::make_unique<DataLoader>(data_.val, B_, T_, config.train.seed, false, "val",
                                                 data_.val_mask);
  }

  TrainResult run() {
    start();
    start_step_ = step_;
    result_.output_dir = config_.train.output_dir;
    if (!resumed_from_.empty() && step_ >= config_.train.steps) return nothing_to_train();
    result_.last_val_loss = std::numeric_limits<float>::quiet_NaN();
    report_.start(step_, resumed_from_, plan_);
    if (!options_.trace_path.empty()) engine_.set_tracer(&tracer_);
    const int64_t last_step = options_.stop_at_step > 0
                                  ? std::min(options_.stop_at_step, config_.train.steps)
                                  : config_.train.steps;
    while (step_ < last_step) {
      const int64_t number = step_ + 1;
      tracer_.set_enabled(!options_.trace_path.empty() && number >= options_.trace_first_step &&
                          number <= options_.trace_last_step);
      Stopwatch watch;
      const double lr = schedule_.lr_at(step_);
      StepTimes times = runner_.run(step_ + 1, lr);
      for (StepHooks* hook : hooks_) hook->step_attempted(step_ + 1);
      if (times.skipped) {
        note_skipped_step(times.figures);
        continue;
      }
      skipped_in_a_row_ = 0;
      step_++;
      record_step(times, lr, watch.millis(), last_step);
      if (evaluate_checkpoint_or_stop(last_step)) break;
    }
    return finish();
  }

 private:
  void start() {
    check_ranks_agree(comm_, config_, data_, options_);
    checkpoints_.start();
    note_plan();
    run_dir_.take(comm_, static_cast<uint64_t>(plan_.num_params) * plan_.state_bytes_per_param,
                  options_.trace_path);
    if (!options_.resume.empty()) {
      clean_up_leftovers();  // before choosing: a checkpoint moved aside comes back
      resume(options_.resume);
      return;
    }
    run_dir_.refuse_an_earlier_run(comm_);
    clean_up_leftovers();
    load_initial_state();
    report_.announce(config_, data_.train.size(), train_loader_.batches_per_epoch(),
                     comm_.world_size(), comm_.backend());
  }

  void note_plan() {
    report_.note_plan(plan_, device_->name());
    // The optimizer's word on how its settings apply to this model (DeMo's clamped top-k).
    const std::string settings =
        optimizer_family(config_.optimizer.type).note_on(config_.optimizer, model_.layout());
    if (!settings.empty()) report_.note("tandem: " + settings);
    if (!plan_.host_fits())  // allowed (checked_plan refuses it otherwise)
      report_.note(cat("tandem: warning: the plan takes ", format_bytes(plan_.host_bytes_needed()),
                       " of host memory, more than the machine's ",
                       format_bytes(plan_.machine_host_bytes),
                       " (--allow-host-overcommit); expect swapping or the OOM killer"));
    // A collective. Only processes an MPI launcher started: a single process's CPUs are what its
    // user gave it.
    if (comm_.backend() == "mpi") {
      const std::string binding = cpu_binding_warning(comm_);
      const bool works_on_the_cpu = !on_gpu() || plan_.offload.params_at(UpdateSite::kHost) > 0;
      if (!binding.empty() && works_on_the_cpu) report_.note("tandem: warning: " + binding);
    }
    if (reduces_gradients(config_) &&
        DataParallel::overlaps_communication(config_.zero, comm_.world_size()) &&
        !data_parallel_.overlaps_communication())
      report_.note(cat("zero_optimization.overlap_comm: the ", comm_.backend(),
                       " communicator cannot run collectives on a second thread (MPI without "
                       "MPI_THREAD_MULTIPLE); they run where they are called"));
  }

  // The engine holds the fp32 master weights and writes the model's working copy; the
  // optimizer's own state starts at zero. The seed's initialisation is made piece by piece
  // as the engine loads it (never the whole model in host memory: a 7B model's would be
  // 27 GB beside its pinned state); a Hugging Face model's weights are read whole.
  void load_initial_state() {
    const std::vector<float> weights =
        config_.train.init_from.empty()
            ? std::vector<float>()
            : read_init_weights(config_.train.init_from, config_.model, model_.layout());
    ThreadPool pool(0, /*pin=*/false);
    engine_.load_state(
        [&](size_t k, ParamRange range, float* out) {
          if (k > 0)
            std::fill(out, out + range.size(), 0.0f);
          else if (weights.empty())
            model_.initial_params(config_.train.seed, range, out, pool);
          else
            std::copy(weights.begin() + static_cast<ptrdiff_t>(range.begin),
                      weights.begin() + static_cast<ptrdiff_t>(range.end), out);
        },
        0);
    data_parallel_.parameters_loaded();
  }

  void clean_up_leftovers() {
    const std::vector<fs::path> cleaned = run_dir_.clean_up_leftovers(comm_);
    if (!cleaned.empty())
      report_.note(cat("tandem: cleaned up ", cleaned.size(),
                       " leftovers of interrupted checkpoint saves in ",
                       checkpoints_root().string()));
  }

  void resume(const fs::path& requested) {
    LoopPosition position;
    resumed_from_ = checkpoints_.resume(
        requested, options_.allow_inexact_resume,
        [this](const fs::path& path) { run_dir_.refuse_another_run(path); }, position);
    train_loader_.set_position(position.train_position);
    sample_rng_.set_state(position.sample_rng);
    step_ = position.step;
  }

  // A resumed run already at train.steps: say so, rather than write the same checkpoint
  // again.
  TrainResult nothing_to_train() {
    report_.note(cat("tandem: the run is finished: its checkpoint ", resumed_from_.string(),
                     " is at step ", step_, " of train.steps = ", config_.train.steps,
                     "; raise train.steps (--set train.steps=N) to train on"));
    result_.steps_done = step_;
    result_.last_checkpoint = resumed_from_;
    result_.state_digest = state_digest();
    return std::move(result_);
  }

  // A step whose loss or gradient norm was not finite: noted, and after
  // train.max_skipped_steps in a row, the end of training.
  void note_skipped_step(const StepRecord& figures) {
    skipped_in_a_row_++;
    result_.skipped_steps++;
    report_.skipped(step_ + 1, figures, skipped_in_a_row_);
    if (skipped_in_a_row_ <= config_.train.max_skipped_steps) return;
    for (StepHooks* hook : hooks_) hook->stopping_on_error();
    fail("step ", step_ + 1, ": the loss or gradient norm was not finite in ", skipped_in_a_row_,
         " attempts in a row (loss ", figures.loss, ", gradient norm ", figures.grad_norm,
         "; train.max_skipped_steps = ", config_.train.max_skipped_steps,
         "), so training stops. The optimizer state is that of step ", step_,
         ", untouched by them; ", last_intact_checkpoint(), ". Gradient clipping was ",
         config_.gradient_clipping > 0 ? cat("on (max norm ", config_.gradient_clipping,
                                             "), which cannot mend a non-finite gradient")
                                       : std::string("off"),
         "; lower optimizer.params.lr or check the data, then resume");
  }

  // The figures of step `step_`, just done in `ms`: metrics, result, progress, the trace.
  void record_step(StepTimes& times, double lr, double ms, int64_t last_step) {
    StepRecord& record = times.figures;
    record.step = step_;
    record.lr = lr;
    record.ms = ms;
    record.tokens_per_s = static_cast<double>(B_) * T_ * config_.gradient_accumulation_steps *
                          comm_.world_size() / (record.ms / 1e3);
    record.update = times.update;
    if (comm_.world_size() > 1) record.ring_allreduce_bytes = ring_allreduce_bytes();
    record.replicas_checked = times.replicas_checked;
    const nlohmann::json line = step_metrics(
        record, data_parallel_.overlaps_communication(),
        comm_.world_size() > 1 ? std::optional(per_rank_figures(record)) : std::nullopt);
    report_.step(record, line);
    result_.steps.push_back(record);
    if (tracer_.enabled() && (step_ == options_.trace_last_step || step_ == last_step)) {
      engine_.finish_update();  // the trace shows the last traced step's update whole
      tracer_.set_enabled(false);
      tracer_.write(options_.trace_path);
      trace_written_ = true;
      report_.note(cat("step ", step_, ": wrote the trace of steps ", options_.trace_first_step,
                       "-", step_, " to ", options_.trace_path.string()));
    }
    result_.last_train_loss = record.loss;
  }

  // After step `step_`: evaluation and a checkpoint when due, then whether a stop request
  // ends the run here (with a checkpoint, as if this were its last step).
  bool evaluate_checkpoint_or_stop(int64_t last_step) {
    // The signal that asks the run to stop after this step: the same on every rank (the
    // highest any received; a collective each step).
    const int stop_signal =
        options_.stop_requested ? max_over_ranks(comm_, options_.stop_requested()) : 0;
    const bool finished = step_ == last_step || stop_signal != 0;
    if (val_loader_ && stop_signal == 0 && (step_ % config_.train.eval_interval == 0 || finished)) {
      result_.last_val_loss =
          validation_loss(model_, *val_loader_, config_.train.eval_batches, B_, T_);
      report_.val_loss(step_, result_.last_val_loss);
    }
    for (StepHooks* hook : hooks_) hook->step_finished(step_, finished);
    if (stop_signal == 0) return false;
    result_.stopped_by_signal = stop_signal;
    report_.note(cat("tandem: ", StopSignals::name(stop_signal), ": stopped after step ", step_,
                     " of ", config_.train.steps,
                     options_.save_checkpoints ? " with a checkpoint" : ""));
    return true;
  }

  TrainResult finish() {
    engine_.finish_update();
    report_.end_progress();
    // With train.checkpoint_failure "continue" a run goes on past failed checkpoints, but it
    // does not end as though it had finished when its last state is nowhere on disk: a
    // scheduler reads the exit status.
    if (options_.save_checkpoints && !result_.checkpoints.empty() &&
        result_.checkpoints.back().step == step_ && !result_.checkpoints.back().error.empty())
      fail("the run's last checkpoint (step ", step_, ") failed: ", run_dir_.lost_steps_text(step_),
           ". Free space (or mend what the failure above names), then resume or rerun");
    if (!options_.trace_path.empty() && !trace_written_)
      report_.note(cat("tandem: no trace written: no step of --trace-steps ",
                       options_.trace_first_step, "-", options_.trace_last_step, " ran (steps ",
                       start_step_ + 1, "-", step_, " did)"));
    result_.steps_done = step_;
    result_.state_digest = state_digest();
    result_.peak_live_parameters = data_parallel_.peak_live_parameters();
    result_.plan = plan_;
    result_.device_bytes_in_use = device_->device_in_use();
    report_.finish(step_,
                   {{"state_digest", result_.state_digest},
                    {"peak_live_parameters", result_.peak_live_parameters},
                    {"schedule", std::string(update_schedule_name(config_.offload.schedule))}});
    sample_at_the_end();
    return std::move(result_);
  }

  // A model of another vocabulary (BPE shards) samples token ids, not bytes: that is
  // `tandem sample --tokenizer`'s job, and failing here would end a finished run in an error.
  void sample_at_the_end() {
    const bool byte_level = config_.model.vocab_size == ByteTokenizer::kVocabSize;
    if (config_.train.sample_bytes > 0 && result_.stopped_by_signal == 0 && byte_level &&
        (comm_.rank() == 0 || every_rank_runs_the_model()))
      result_.sample = sample_bytes(model_, "\n", config_.train.sample_bytes, sample_rng_);
    if (config_.train.sample_bytes > 0 && !byte_level && comm_.rank() == 0)
      report_.note(cat("tandem: no sample at the end: the model's ", config_.model.vocab_size,
                       " tokens are not bytes; `tandem sample --checkpoint DIR --tokenizer "
                       "tokenizer.json` decodes its tokens (train.sample_bytes=0 skips this)"));
  }

  // Which checkpoint a run that stops now leaves to resume from, in words.
  std::string last_intact_checkpoint() const {
    if (!result_.last_checkpoint.empty())
      return cat("the last checkpoint, ", result_.last_checkpoint.string(), ", is intact");
    if (!resumed_from_.empty())
      return cat("the checkpoint it resumed from, ", resumed_from_.string(), ", is intact");
    return "no checkpoint was written yet";
  }

  bool on_gpu() const { return config_.device.type == DeviceKind::kCuda; }
  // What each rank would send (and receive) per step in a ring all-reduce of the fp32
  // gradients at this world size, 2 (N - 1) / N x 4 bytes per parameter: the yardstick
  // next to comm_bytes_sent.
  size_t ring_allreduce_bytes() const {
    const size_t N = static_cast<size_t>(comm_.world_size());
    return 2 * (N - 1) * (model_.layout().num_elements() * sizeof(float)) / N;
  }
  // At ZeRO stage 3 a forward pass gathers parameters from every rank: evaluation and
  // sampling run on every rank (rank 0 alone reports them).
  bool every_rank_runs_the_model() const {
    return config_.zero.stage == 3 && comm_.world_size() > 1;
  }
  // A collective (ckpt/state_digest.h).
  std::string state_digest() {
    return tandem::state_digest(
        engine_, comm_, model_.layout().num_elements(),
        optimizer_family(config_.optimizer.type).state_per_rank,
        [this](float* array) { data_parallel_.gather_partitions(array, sizeof(float)); });
  }

  // The figures of a step that may differ between ranks, one array per figure indexed by
  // rank, holding only the figures that do differ (a collective: every rank calls it).
  nlohmann::json per_rank_figures(const StepRecord& record) {
    const std::vector<double> mine = per_rank_values(record);
    std::vector<double> all(mine.size() * comm_.world_size());
    comm_.all_gather(mine.data(), all.data(), mine.size() * sizeof(double));
    return differing_figures(all, comm_.world_size());
  }

  fs::path checkpoints_root() const { return run_dir_.checkpoints(); }

  // A committed (or failed, under checkpoint_failure "continue") checkpoint: metrics, a
  // note, the result.
  void record_checkpoint(CheckpointRecord record) {
    report_.checkpoint(record);
    if (record.error.empty() && !record.path.empty()) result_.last_checkpoint = record.path;
    result_.checkpoints.push_back(std::move(record));
  }

  TrainConfig config_;
  TrainOptions options_;
  Communicator& comm_;  // host exchanges
  // Rank 0's hold on train.output_dir (taken in start()); released after everything that
  // writes there, the checkpointer's background writer included.
  RunDirectory run_dir_;
  std::unique_ptr<Communicator> nccl_buffer_comm_;  // made before the device: it picks the GPU
  TraceRecorder tracer_;  // before the engine and device that may write to it
  int B_, T_;
  TokenSplit data_;
  std::string train_tokens_xxh3_;  // recorded in checkpoints for resume's checks
  fs::path resumed_from_;          // the checkpoint this invocation resumed
  DataLoader train_loader_;
  std::unique_ptr<DataLoader> val_loader_;
  // The device first: the backend's tensors and the engine's state live in it, and it
  // must outlive them.
  std::unique_ptr<Device> device_;
  BufferCommunicator buffer_comms_;  // after the device: it may hold a stream of it
  Communicator& buffer_comm_;        // the model's buffers (buffer_comms_.get())
  ThreadPool optimizer_pool_;        // pinned threads for the CPU AdamW, one per CPU
  TrainingMemoryPlan plan_;          // made before anything is allocated on the device
  std::unique_ptr<ComputeBackend> backend_;
  std::unique_ptr<Model> model_owner_;
  Model& model_;
  DataParallel data_parallel_;  // the model's BlockMemory from stage 2
  UpdateEngine engine_;
  GradientAccumulator accumulator_;
  // The run's checkpoints (a hook): snapshots the engine's state, so after it, gone before it.
  RunCheckpoints checkpoints_;
  DataParallelHooks data_parallel_hooks_;
  LocalGradientHooks local_gradient_hooks_;
  // Data parallelism (or the local gradients' hooks) first, then TrainOptions::hooks.
  std::vector<StepHooks*> hooks_;
  WarmupCosineSchedule schedule_;
  Rng sample_rng_;
  RunReport report_;
  StepRunner runner_;
  int64_t step_ = 0;
  int64_t start_step_ = 0;  // where this invocation began (after a resume: the checkpoint's)
  // What run() builds: the result, the non-finite attempts in a row, whether the trace was
  // written.
  TrainResult result_;
  int64_t skipped_in_a_row_ = 0;
  bool trace_written_ = false;
};

}  // namespace

TrainResult train(const TrainConfig& config, const TrainOptions& options) {
  LocalGroup single(1);
  const std::unique_ptr<Communicator> comm = single.communicator(0);
  return train(config, options, *comm);
}

TrainResult train(const TrainConfig& config, const TrainOptions& options, Communicator& comm,
                  Communicator* buffer_comm) {
  try {
    // A resumed run goes on in its own directory when asked to.
    TrainConfig effective = config;
    if (!options.resume.empty() && options.continue_in_resumed_run)
      if (const std::optional<fs::path> run = run_directory_of(options.resume))
        effective.train.output_dir = run->string();
    effective = with_chosen_step_settings(
        effective, comm, options.resume,
        options.show_progress && comm.rank() == 0 ? stderr : nullptr, options.cpu_device_injection);
    // The data first, and every rank stops together when one cannot read its files: the
    // commonest start-up error then ends the job without an abort.
    TokenSplit data;
    std::string error;
    try {
      data = load_dataset(config.data.train_path, config.data.val_path, config.data.val_fraction,
                          config.model.vocab_size);
    } catch (const Error& e) {
      error = e.what();
    }
    fail_together(comm, error, "another rank could not load its data (its error says why)");
    Trainer trainer(effective, options, comm, buffer_comm, std::move(data));
    return trainer.run();
  } catch (const Error& e) {
    if (comm.world_size() == 1) throw;
    // Communicator errors already start with "rank R: "; say it once.
    std::string what = e.what();
    const std::string own = cat("rank ", comm.rank(), ": ");
    if (what.rfind(own, 0) == 0) what = what.substr(own.size());
    if (const auto* together = dynamic_cast<const ErrorOnEveryRank*>(&e))
      throw ErrorOnEveryRank(what, together->own(), rank_of_world(comm));
    throw Error(cat(rank_of_world(comm), what));
  }
}

}  // namespace tandem
