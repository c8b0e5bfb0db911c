#include "tandem/config/optimizer_family.h"

#include <cmath>
#include <limits>

#include "tandem/model/param_layout.h"
#include "tandem/offload/perf_model.h"
#include "tandem/optim/adamw_rule.h"
#include "tandem/optim/adamw_timing.h"
#include "tandem/optim/demo_rule.h"

namespace tandem {

namespace {

using Keys = JsonKeys<OptimizerConfig>;

// lr and weight_decay are kept as doubles, but AdamW rounds them to float: both must be
// floats too (1e39 is inf, 1e-50 is 0 as a float).
bool fits_a_float(double v) {
  return std::fabs(v) <= std::numeric_limits<float>::max() &&
         (v == 0 || static_cast<float>(v) != 0);
}

Keys::Key lr_key() {
  return Keys::real("lr", TANDEM_FIELD(lr), "a number > 0",
                    [](double v) { return v > 0 && fits_a_float(v); });
}

Keys::Key weight_decay_key() {
  return Keys::real("weight_decay", TANDEM_FIELD(weight_decay), "a number >= 0",
                    [](double v) { return v >= 0 && fits_a_float(v); });
}

// "betas": [beta1, beta2], each in [0, 1).
Keys::Key betas_key() {
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
            o.beta1 = JsonSection::real_value<float>((*betas)[0], where + "[0]",
                                                     "a number in [0, 1)", in_unit);
            o.beta2 = JsonSection::real_value<float>((*betas)[1], where + "[1]",
                                                     "a number in [0, 1)", in_unit);
          },
          [](const OptimizerConfig& o) {
            return nlohmann::json::array({float_json(o.beta1), float_json(o.beta2)});
          }};
}

std::unique_ptr<UpdateRule> make_adamw(const OptimizerConfig& config, const ParamLayout&,
                                       Communicator&, ThreadPool& pool) {
  return std::make_unique<AdamWRule>(
      AdamWHyper{.lr = static_cast<float>(config.lr),
                 .beta1 = config.beta1,
                 .beta2 = config.beta2,
                 .eps = config.eps,
                 .weight_decay = static_cast<float>(config.weight_decay)},
      pool);
}

std::vector<DemoRuleTensor> demo_tensors(const ParamLayout& layout) {
  std::vector<DemoRuleTensor> tensors;
  for (const ParamView& view : layout.views())
    tensors.push_back({.name = view.name, .shape = view.shape, .begin = view.offset});
  return tensors;
}

DemoHyper demo_hyper(const OptimizerConfig& config) {
  return {.compression_decay = config.compression_decay,
          .compression_topk = config.compression_topk,
          .compression_chunk = config.compression_chunk,
          .weight_decay = config.weight_decay,
          .compression_values = config.compression_values};
}

std::unique_ptr<UpdateRule> make_demo(const OptimizerConfig& config, const ParamLayout& layout,
                                      Communicator& comm, ThreadPool& pool) {
  return std::make_unique<DemoRule>(demo_tensors(layout), demo_hyper(config), comm, &pool);
}

size_t demo_workspace_bytes(const OptimizerConfig& config, const ParamLayout& layout,
                            const OffloadPlan& plan, int world_size, DeviceKind kind) {
  return DemoRule::device_workspace_bytes(demo_tensors(layout), demo_hyper(config), world_size,
                                          plan, kind);
}

std::vector<OptimizerFamily> make_families() {
  std::vector<OptimizerFamily> families;
  families.push_back({
      .type = OptimizerType::kAdamW,
      .name = "AdamW",
      .defaults = {.type = OptimizerType::kAdamW},
      .params = {lr_key(), betas_key(),
                 Keys::real("eps", TANDEM_FIELD(eps), "a number > 0",
                            [](double v) { return v > 0; }),
                 weight_decay_key()},
      .state_arrays = AdamWRule::kStateArrays,
      .state_label = "fp32 params, m, v",
      .make_rule = make_adamw,
      .calibrate_rates = calibrate_adamw_rates,
  });
  families.push_back({
      .type = OptimizerType::kDeMo,
      .name = "DeMo",
      .defaults = {.type = OptimizerType::kDeMo, .weight_decay = 0.0},
      .params = {lr_key(),
                 Keys::real("compression_decay", TANDEM_FIELD(compression_decay),
                            "a number in [0, 1)", [](double v) { return v >= 0 && v < 1; }),
                 // Whether it fits each tensor's blocks is checked when the blocks are known
                 // (optim/demo.h).
                 Keys::integer("compression_topk", TANDEM_FIELD(compression_topk), 1),
                 Keys::integer("compression_chunk", TANDEM_FIELD(compression_chunk), 1),
                 Keys::choice("compression_values", TANDEM_FIELD(compression_values),
                              kDemoValueFormatNames),
                 weight_decay_key()},
      .state_arrays = DemoRule::kStateArrays,
      .state_label = "fp32 params, delta",
      .state_per_rank = true,
      .reduces_gradients = false,
      .cuts_at_tensor_ends = true,
      .make_rule = make_demo,
      .device_workspace_bytes = demo_workspace_bytes,
  });
  return families;
}

}  // namespace

std::span<const OptimizerFamily> optimizer_families() {
  static const std::vector<OptimizerFamily> families = make_families();
  return families;
}

const OptimizerFamily& optimizer_family(OptimizerType type) {
  for (const OptimizerFamily& family : optimizer_families())
    if (family.type == type) return family;
  fail("optimizer type ", static_cast<int>(type), " has no family (config/optimizer_family.cc)");
}

const OptimizerFamily* find_optimizer_family(std::string_view name) {
  for (const OptimizerFamily& family : optimizer_families())
    if (ascii_lower(family.name) == ascii_lower(name)) return &family;
  return nullptr;
}

std::vector<std::string> OptimizerFamily::state_names() const {
  return {state_arrays.begin() + 1, state_arrays.end()};
}

std::vector<size_t> OptimizerFamily::subgroup_cut_points(const ParamLayout& layout) const {
  std::vector<size_t> cuts;
  if (!cuts_at_tensor_ends) return cuts;
  for (const ParamView& view : layout.views()) cuts.push_back(view.offset + view.numel);
  return cuts;
}

}  // namespace tandem
