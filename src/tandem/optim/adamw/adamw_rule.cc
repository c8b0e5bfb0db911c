#include "tandem/optim/adamw/adamw_rule.h"

#include "tandem/core/error.h"
#include "tandem/optim/adamw/adamw_device_kernel.h"
#include "tandem/optim/adamw/adamw_timing.h"
#include "tandem/optim/optimizer_family.h"

namespace tandem {

AdamWRule::AdamWRule(const AdamWHyper& hyper, ThreadPool& pool, SimdTarget target)
    : hyper_(hyper), cpu_(pool, target), target_(target) {}

void AdamWRule::begin_step(int64_t step, double lr, float grad_scale) {
  TANDEM_CHECK(step >= 1, "AdamW: step ", step, " (steps count from 1)");
  AdamWHyper hyper = hyper_;
  hyper.lr = static_cast<float>(lr);  // AdamW's scalars come from its float hyper-parameters
  with_decay_ = adamw_step_scalars(hyper, step, true, grad_scale);
  without_decay_ = adamw_step_scalars(hyper, step, false, grad_scale);
}

AdamWArrays AdamWRule::adamw_arrays(const RuleArrays& arrays) const {
  AdamWArrays a;
  a.params = arrays.array(0);
  a.m = arrays.array(1);
  a.v = arrays.array(2);
  a.grads = arrays.grads;
  a.grad_dtype = arrays.grad_dtype;
  a.params16 = arrays.params16;
  a.params16_dtype = arrays.params16 != nullptr ? arrays.params16_dtype : WorkingDType::kNone;
  return a;
}

void AdamWRule::update_on_host(const RuleArrays& arrays, std::span<const UpdateSegment> segments) {
  cpu_.update(adamw_arrays(arrays), segments, with_decay_, without_decay_);
}

DeviceKernel AdamWRule::device_update(const RuleArrays& arrays,
                                      std::span<const UpdateSegment> segments) const {
  return adamw_device_kernel(adamw_arrays(arrays), segments, with_decay_, without_decay_, target_);
}

namespace {

using ParamKeys = JsonKeys<OptimizerConfig>;

// "betas": [beta1, beta2], each in [0, 1).
ParamKeys::Key betas_key() {
  constexpr std::string_view kName = "betas";
  return {kName,
          [=](const JsonSection& params, OptimizerConfig& o) {
            const nlohmann::json* betas = params.find(kName);
            if (betas == nullptr) return;
            const std::string where = params.path(kName);
            if (!betas->is_array() || betas->size() != 2)
              fail(where, " must be an array of two numbers [beta1, beta2], each in [0, 1), got ",
                   describe_json(*betas));
            const auto in_unit = [](double v) { return v >= 0 && v < 1; };
            AdamWSettings& own = own_settings<AdamWSettings>(o);
            own.beta1 = JsonSection::real_value<float>((*betas)[0], where + "[0]",
                                                       "a number in [0, 1)", in_unit);
            own.beta2 = JsonSection::real_value<float>((*betas)[1], where + "[1]",
                                                       "a number in [0, 1)", in_unit);
          },
          [](const OptimizerConfig& o) {
            const AdamWSettings& own = own_settings<AdamWSettings>(o);
            return nlohmann::json::array({float_json(own.beta1), float_json(own.beta2)});
          }};
}

std::unique_ptr<UpdateRule> make_adamw(const OptimizerConfig& config, const ParamLayout&,
                                       Communicator&, ThreadPool& pool) {
  const AdamWSettings& own = own_settings<AdamWSettings>(config);
  // No lr: each step's comes with begin_step.
  return std::make_unique<AdamWRule>(
      AdamWHyper{.beta1 = own.beta1,
                 .beta2 = own.beta2,
                 .eps = own.eps,
                 .weight_decay = static_cast<float>(config.weight_decay)},
      pool);
}

}  // namespace

OptimizerFamily adamw_family() {
  return {
      .type = OptimizerType::kAdamW,
      .name = "AdamW",
      .defaults = {.type = OptimizerType::kAdamW, .own = AdamWSettings{}},
      .params = {lr_param(), betas_key(),
                 ParamKeys::real("eps", TANDEM_OWN_FIELD(AdamWSettings, eps), "a number > 0",
                                 [](double v) { return v > 0; }),
                 weight_decay_param()},
      .state_arrays = AdamWRule::kStateArrays,
      .state_label = "fp32 params, m, v",
      .make_rule = make_adamw,
      .calibrate_rates = calibrate_adamw_rates,
      // fp32 params, m and v read and written (24), the bf16 gradient read and the bf16
      // working copy written (4).
      .gpu_bytes_per_param = 28,
  };
}

}  // namespace tandem
