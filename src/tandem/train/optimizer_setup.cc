#include "tandem/train/optimizer_setup.h"

#include "tandem/optim/adamw_rule.h"
#include "tandem/optim/demo_rule.h"

namespace tandem {

namespace {

bool is_demo(const OptimizerConfig& config) { return config.type == OptimizerType::kDeMo; }

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

}  // namespace

std::unique_ptr<UpdateRule> make_update_rule(const OptimizerConfig& config,
                                             const ParamLayout& layout, Communicator& comm,
                                             ThreadPool& pool) {
  if (!is_demo(config))
    return std::make_unique<AdamWRule>(
        AdamWHyper{.lr = static_cast<float>(config.lr),
                   .beta1 = config.beta1,
                   .beta2 = config.beta2,
                   .eps = config.eps,
                   .weight_decay = static_cast<float>(config.weight_decay)},
        pool);
  return std::make_unique<DemoRule>(demo_tensors(layout), demo_hyper(config), comm, &pool);
}

size_t optimizer_device_workspace_bytes(const OptimizerConfig& config, const ParamLayout& layout,
                                        const OffloadPlan& plan, int world_size, DeviceKind kind) {
  if (!is_demo(config)) return 0;
  return DemoRule::device_workspace_bytes(demo_tensors(layout), demo_hyper(config), world_size,
                                          plan, kind);
}

std::vector<std::string> optimizer_state_names(const OptimizerConfig& config) {
  if (is_demo(config)) return {"delta"};
  return {"exp_avg", "exp_avg_sq"};
}

bool optimizer_state_per_rank(const OptimizerConfig& config) { return is_demo(config); }

bool optimizer_reduces_gradients(const OptimizerConfig& config) { return !is_demo(config); }

size_t optimizer_state_bytes_per_param(const OptimizerConfig& config) {
  return (1 + optimizer_state_names(config).size()) * sizeof(float);
}

std::vector<size_t> subgroup_cut_points(const OptimizerConfig& config, const ParamLayout& layout) {
  std::vector<size_t> cuts;
  if (!is_demo(config)) return cuts;
  for (const ParamView& view : layout.views()) cuts.push_back(view.offset + view.numel);
  return cuts;
}

}  // namespace tandem
