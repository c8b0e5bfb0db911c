// One optimizer step of one rank: its micro-batches of the global batch, forward and
// backward, the gradients handed to the step's hooks as backward makes them final, the
// loss and gradient norm over the global batch, and the update, or none for a non-finite
// loss or norm (the state untouched, on every rank alike). The trainer (trainer.h) decides
// what a step is for; this is how one runs.
//
// The global batch is accumulation x world size micro-batches. At stages 0 and 1 rank r
// takes the micro-batches [r A, (r + 1) A): each micro-batch's gradients are computed into
// zeroed buffers and summed as a tree (zero/gradient_accumulator.h), then over the ranks in
// the same tree order. From stage 2 rank r takes the micro-batches a N + r: each is reduced
// over the ranks as backward releases its blocks, and the owners sum the reduced
// micro-batches as a tree. Either way any split of the global batch over ranks and
// micro-batches gives the same bits (powers of two; or one rank; see
// zero/partitioned_gradients.h).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/config/train_config.h"
#include "tandem/offload/update_engine.h"
#include "tandem/train/step_record.h"

namespace tandem {

class Communicator;
class DataLoader;
class DataParallel;
class GradientAccumulator;
class Model;
class OptimizerHooks;
class StepHooks;
class TraceRecorder;

struct StepTimes {
  StepRecord figures;  // the runner fills the loss, norm, times and traffic; the trainer the rest
  UpdateStepStats update;
  // The optimizer's own hooks proved the ranks' replicas identical after the update
  // (OptimizerHooks::replicas_proved_identical: DeMo's replica check ran and passed).
  bool replicas_checked = false;
  bool skipped = false;  // the loss or gradient norm was not finite: no update
};

class StepRunner {
 public:
  // Everything a step touches; none of it owned, all of it outliving the runner.
  struct Parts {
    const TrainConfig& config;
    Communicator& comm;         // host exchanges
    Communicator& buffer_comm;  // the model's buffers (the same object on the cpu device)
    Model& model;
    DataParallel& data_parallel;
    UpdateEngine& engine;
    GradientAccumulator& accumulator;
    DataLoader& loader;
    const std::vector<StepHooks*>& hooks;  // called in order at each named point
    TraceRecorder& tracer;
    // Test injection: the attempts (1-based, skipped ones included) whose backward runs
    // with a NaN loss scale (TrainOptions::nan_gradient_attempts).
    std::set<int64_t> nan_gradient_attempts;
  };
  explicit StepRunner(Parts parts);
  ~StepRunner();

  // The optimizer's own step hooks (its family row's make_hooks, optim/optimizer_family.h),
  // for the trainer to register with the others; null: it has none.
  StepHooks* optimizer_hooks() const;

  // Optimizer step `step` (1-based) at learning rate `lr`.
  StepTimes run(int64_t step, double lr);

  // From stage 2 a rank takes the micro-batches a N + r of the global batch, reducing each
  // as it goes (micro-major); below, r A + a, summing its own first (rank-major).
  bool micro_major() const;

 private:
  std::vector<float> forward_backward(StepRecord& figures);
  void backward(int micro, float loss_scale);
  void update(int64_t step, double lr, StepTimes& times);
  // The targets a loss mask counts in this rank's micro-batches of the next step (own),
  // and over the micro-batches (micro_batches of them) the step's mean is over (total).
  struct MaskWeights {
    std::vector<uint64_t> own;
    uint64_t total = 0;
    uint64_t micro_batches = 0;
  };
  MaskWeights mask_weights() const;
  // The global batch's micro-batches that other ranks take, right before and right after
  // this rank's micro-batch `micro`.
  uint64_t others_before(int micro) const;
  uint64_t others_after(int micro) const;
  CommunicatorTraffic traffic() const;
  bool reduces_gradients() const;

  Parts parts_;
  int B_, T_;
  std::vector<int32_t> inputs_, targets_;
  int64_t attempts_ = 0;  // run() calls so far
  bool updated_ = false;  // the last attempt updated the parameters (not skipped)
  std::unique_ptr<OptimizerHooks> optimizer_hooks_;
};

}  // namespace tandem
