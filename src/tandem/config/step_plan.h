// The step planner: what "auto" means for train_micro_batch_size_per_gpu,
// gradient_accumulation_steps and activation_checkpointing.interval. Given the sequences a
// user wants per optimizer step (train_batch_size), it predicts the step time of every
// split of them into micro-batches, with and without recompute, each with the placement of
// the optimizer state that the memory left over allows (the `auto` schedule's, when the
// config asks for it), and keeps the one with the highest predicted tokens/s that fits.
//
// A step of G micro-batches of B sequences of T tokens, on a model of L layers:
//   forward    G x (L x layer_forward(B) + rest_forward(B))       (rest: embeddings, head, loss)
//   backward   G x (L x layer_backward(B) + rest_backward(B))
//   recompute  G x L x layer_forward(B)                            (interval > 0: every segment
//                                                                   runs forward again)
//   copies     what the copy engines cannot hide: cpu_checkpointing's kept outputs (out during
//              each forward, back during each backward) and the host subgroups' gradients
//              (during the last backward), each beyond the compute it runs beside
//   update     the performance model's (perf_model.h), less what the next forward hides of it
//              (offload_optimizer.overlap_forward)
//   communication  with several ranks, the ZeRO stage's traffic (zero/zero_traffic.h) at the
//              ranks' measured rate (comm/comm_rate.h), less what the compute beside it hides
//              when the collectives run on their own thread (zero_optimization.overlap_comm):
//              stage 3's gathers beside each forward, the reductions beside the backward
//              (stages 2 and 3: every micro-batch's; 0 and 1: the last's), and stages 1 and
//              2's gather of the updated parameters beside nothing
//              (DeMo: its own exchange of compressed momentum, in the update, beside nothing)
// The per-layer and rest times come from calibration on the run's device (compute_calibration.h)
// or, for a GPU that is not here, from an assumed rate of model FLOPs (said so in the text).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tandem/comm/comm_rate.h"
#include "tandem/comm/communicator.h"
#include "tandem/config/memory_plan.h"
#include "tandem/config/train_config.h"

namespace tandem {

// Seconds of one micro-batch's pass: each layer's, and the rest's (embeddings, head, loss).
struct PassSeconds {
  double layer = 0, rest = 0;
  double of(int layers) const { return layers * layer + rest; }
};

// The forward and backward times of one micro-batch of B sequences, at a few B.
struct ComputeRates {
  struct Sample {
    int micro_batch = 0;
    PassSeconds forward, backward;
  };
  std::vector<Sample> samples;  // by micro_batch, ascending
  // "measured on the cpu device (1 and 2 layers, 3 passes each)", or what was assumed.
  std::string source;

  // At B: interpolated linearly between the samples around it; below the first and beyond
  // the last, the nearest sample's time per sequence.
  PassSeconds forward(int B) const;
  PassSeconds backward(int B) const;
  bool empty() const { return samples.empty(); }
};

// The rates a GPU that is not here is assumed to reach: model FLOPs (2 per parameter and
// token forward plus attention's, twice that backward) at `flops_per_s`.
ComputeRates assumed_compute_rates(const ModelConfig& model, int T, std::vector<int> micro_batches,
                                   double flops_per_s, const std::string& gpu_name);
// Model FLOPs of one token's forward pass at sequence T: 2 per parameter of the matmuls
// (embedding lookups excluded) plus attention's scores and weighted sum, 4 x T x (width of
// the heads) per layer (causal masking not subtracted: the kernels compute whole tiles).
double forward_flops_per_token(const ModelConfig& model, int T);

// The settings the planner chooses.
struct StepSettings {
  int micro_batch = 0;
  int accumulation = 0;
  int recompute_interval = 0;
  bool cpu_checkpointing = false;
  std::string to_text() const;  // "micro-batch 4 x 8, recompute every 2 layers (kept on host)"
  bool operator==(const StepSettings&) const = default;
};

struct StepPrediction {
  double forward = 0, backward = 0, recompute = 0, copies = 0, exposed_update = 0;
  double communication = 0;  // exposed; 0 with one rank
  double update = 0;         // the whole update, of which exposed_update is not hidden
  double comm_bytes = 0;     // what this rank sends per step
  double seconds() const {
    return forward + backward + recompute + copies + exposed_update + communication;
  }
};

struct StepCandidate {
  StepSettings settings;
  TrainingMemoryPlan memory;  // its memory and update plan
  StepPrediction prediction;
  double tokens_per_s = 0;  // of this rank
};

struct StepPlan {
  std::vector<StepCandidate> ranked;  // the candidates that fit, fastest first
  // Those that do not fit, for the message when none does.
  std::vector<StepSettings> not_fitting;
  ComputeRates compute;
  int sequences_per_rank = 0;  // per optimizer step
  int seq_len = 0;             // tokens per sequence
  int world_size = 1;
  CommRate comm;  // between the ranks (none with one)
  const StepCandidate& chosen() const { return ranked.front(); }
  // The choice, up to `runners_up` others, and each one's predicted split.
  std::string to_text(int runners_up = 4) const;
};

// The candidates of `config` on `world_size` ranks: the micro-batches that divide the ranks'
// share of train_batch_size (or the fixed one), and for each no recompute, recompute with the
// interval that leaves the most device memory, and that with the kept outputs on the host
// (or the fixed interval). Throws tandem::Error naming the keys when train_batch_size cannot be
// split so (not a multiple of the ranks, of a fixed micro-batch or accumulation).
std::vector<StepSettings> step_candidates(const TrainConfig& config, int world_size);

// `config` with `settings` in place of its "auto" ones (and train_batch_size set to match).
TrainConfig with_step_settings(const TrainConfig& config, const StepSettings& settings,
                               int world_size);

// The predicted step of a config with every setting fixed, on `memory`, its plan (for
// memory.world_size ranks, whose data move at `comm`: needed when there are several).
StepPrediction predict_step(const TrainConfig& config, const TrainingMemoryPlan& memory,
                            const ComputeRates& compute, const CommRate& comm = {});

// How one candidate's memory is planned (plan_training_at_rates, with the device and rates
// of the caller): the planner's one tie to the device, so that tests give synthetic ones.
using PlanMemoryFn = std::function<TrainingMemoryPlan(const TrainConfig&)>;

// Every candidate planned and predicted; those that fit ranked by predicted tokens/s (ties:
// less recompute, then the larger micro-batch). `compute` must cover the candidates' B.
StepPlan rank_step_candidates(const TrainConfig& config, int world_size,
                              const std::vector<StepSettings>& candidates,
                              const ComputeRates& compute, const PlanMemoryFn& plan_memory,
                              const CommRate& comm = {});

// The plan on this machine: the update rates and the compute measured on `device` (the run's,
// nothing allocated on it yet), every candidate planned for rank 0 of `world_size` (which
// holds the most). `comm`: the ranks' rate, measured by the run's own ranks (needed over
// several on a cpu device); when not given on a cuda one, the assumed NVLink rate
// (AssumedGpu). `peers`: the ranks planning at this moment on the same cores, which time their
// passes and the update together (calibrate_compute_rates, measure_update_rates). Throws
// DeviceOutOfMemory, as check_fits does for the candidate that needs the least device memory,
// when none fits.
StepPlan plan_step(const TrainConfig& config, Device& device, ThreadPool& pool, int world_size = 1,
                   CommRate comm = {}, Communicator* peers = nullptr);
// The plan for a cuda device that is not here: `gpu`'s assumed rates (compute from its model
// FLOPs, communication over its NVLink), this machine's CPU update rate.
StepPlan plan_step_without_gpu(const TrainConfig& config, ThreadPool& pool, int world_size = 1,
                               const AssumedGpu& gpu = {});

}  // namespace tandem
