// Where a step's final gradients go (core/step_hooks.h), by whether the optimizer has
// them reduced over the ranks (optim/optimizer_family.h, reduces_gradients).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/core/step_hooks.h"
#include "tandem/offload/update_engine.h"
#include "tandem/zero/data_parallel.h"

namespace tandem {

// Data parallelism at the step's named points: gradients reduced as they become final
// (and handed to the update engine, which starts offloading them), the rest before the
// update, the working parameters gathered after it.
class DataParallelHooks final : public StepHooks {
 public:
  DataParallelHooks(DataParallel& data_parallel, UpdateEngine& engine)
      : data_parallel_(data_parallel), engine_(engine) {}
  void gradients_final(size_t begin, size_t end) override {
    data_parallel_.gradients_final(begin, end, offload());
  }
  void before_update(int64_t) override { data_parallel_.finish_reduction(offload()); }
  void after_update(int64_t) override {
    // A gather reads this rank's new parameters at once (the forward that would wait for
    // them block by block comes after it).
    if (data_parallel_.gathers_working_params()) engine_.finish_update();
    data_parallel_.gather_working_params();
  }

 private:
  DataParallel::Reduced offload() {
    return [this](size_t b, size_t e) { engine_.gradients_ready(b, e); };
  }
  DataParallel& data_parallel_;
  UpdateEngine& engine_;
};

// An optimizer that never reduces gradients (DeMo): each rank's own gradients go to the
// update engine as they become final; the rule exchanges with the other ranks itself.
class LocalGradientHooks final : public StepHooks {
 public:
  explicit LocalGradientHooks(UpdateEngine& engine) : engine_(engine) {}
  void gradients_final(size_t begin, size_t end) override { engine_.gradients_ready(begin, end); }

 private:
  UpdateEngine& engine_;
};

}  // namespace tandem
