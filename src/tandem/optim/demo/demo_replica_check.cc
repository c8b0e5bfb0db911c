#include "tandem/optim/demo/demo_replica_check.h"

#include <vector>

#include "tandem/comm/agreement.h"
#include "tandem/core/format.h"
#include "tandem/optim/demo/demo_rule.h"

namespace tandem {

namespace {

class DemoReplicaCheck final : public OptimizerHooks {
 public:
  DemoReplicaCheck(const OptimizerHookParts& parts, int64_t every)
      : comm_(parts.comm),
        updated_(parts.updated),
        read_params_(parts.read_params),
        every_(every) {}

  void after_update(int64_t step) override {
    if (!updated_() || step % every_ != 0) return;
    const std::vector<float> params = read_params_();
    require_same_bits_on_every_rank(
        comm_, params.data(), params.size() * sizeof(float),
        cat("DeMo: the parameters at step ", step),
        "the replicas diverged, which DeMo's fixed order of operations should make impossible: "
        "please report it, and resume from the last checkpoint");
    checked_step_ = step;
  }

  bool replicas_proved_identical(int64_t step) const override { return checked_step_ == step; }

 private:
  Communicator& comm_;
  std::function<bool()> updated_;
  std::function<std::vector<float>()> read_params_;
  int64_t every_;
  int64_t checked_step_ = 0;  // the last step checked (steps count from 1)
};

}  // namespace

std::unique_ptr<OptimizerHooks> make_demo_replica_check(const OptimizerHookParts& parts) {
  const int64_t every = own_settings<DemoSettings>(parts.config).replica_check_interval;
  if (every <= 0) return nullptr;
  return std::make_unique<DemoReplicaCheck>(parts, every);
}

}  // namespace tandem
