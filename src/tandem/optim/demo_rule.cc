#include "tandem/optim/demo_rule.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/half.h"
#include "tandem/core/thread_pool.h"

namespace tandem {

DemoRule::DemoRule(std::vector<DemoRuleTensor> tensors, const DemoHyper& hyper, Communicator& comm,
                   ThreadPool* pool, SimdTarget target)
    : layout_(std::move(tensors)), comm_(comm), pool_(pool) {
  size_t next = 0;
  for (const DemoRuleTensor& t : layout_) {
    TANDEM_CHECK(t.begin == next, "DeMo: tensor ", t.name, " starts at ", t.begin,
                 "; the tensors must cover the parameters in order (expected ", next, ")");
    tensors_.emplace_back(t.name, t.shape, hyper, target);
    next = t.begin + static_cast<size_t>(tensors_.back().blocks().num_elements());
  }
  sent_.resize(layout_.size());
  prepared_.assign(layout_.size(), 0);
  received_.assign(comm_.world_size(), std::vector<DemoMessage>(layout_.size()));
}

std::vector<size_t> DemoRule::tensor_ends() const {
  std::vector<size_t> ends;
  for (size_t t = 0; t < layout_.size(); t++)
    ends.push_back(layout_[t].begin + static_cast<size_t>(tensors_[t].blocks().num_elements()));
  return ends;
}

void DemoRule::begin_step(int64_t, float lr, float grad_scale) {
  lr_ = lr;
  grad_scale_ = grad_scale;
  std::fill(prepared_.begin(), prepared_.end(), 0);
}

std::pair<size_t, size_t> DemoRule::tensors_of(const RuleArrays& arrays) const {
  const size_t begin = arrays.begin, end = arrays.begin + arrays.size;
  auto starts_after = [](size_t index, const DemoRuleTensor& t) { return index < t.begin; };
  // The tensor holding `begin`, and the first starting at or after `end`.
  const auto first = std::upper_bound(layout_.begin(), layout_.end(), begin, starts_after) - 1;
  const auto last =
      std::lower_bound(layout_.begin(), layout_.end(), end,
                       [](const DemoRuleTensor& t, size_t index) { return t.begin < index; });
  const auto f = static_cast<size_t>(first - layout_.begin());
  const auto l = static_cast<size_t>(last - layout_.begin());
  const size_t last_end =
      l == 0 ? 0
             : layout_[l - 1].begin + static_cast<size_t>(tensors_[l - 1].blocks().num_elements());
  TANDEM_CHECK(layout_[f].begin == begin && last_end == end, "DeMo: the optimizer subgroup [",
               begin, ", ", end, ") splits tensor ",
               layout_[layout_[f].begin != begin ? f : l - 1].name,
               "; DeMo compresses whole tensors at one site, so subgroups must be cut at tensor "
               "boundaries");
  return {f, l};
}

void DemoRule::prepare(const RuleArrays& arrays, ThreadPool* pool) const {
  const auto [first, last] = tensors_of(arrays);
  std::vector<float> widened;  // a tensor's bf16 gradients in fp32 (exactly)
  for (size_t t = first; t < last; t++) {
    const size_t offset = layout_[t].begin - arrays.begin;
    const float* grad = static_cast<const float*>(arrays.grads) + offset;
    if (arrays.grad_dtype == GradDType::kBF16) {
      const auto n = static_cast<size_t>(tensors_[t].blocks().num_elements());
      const uint16_t* bits = static_cast<const uint16_t*>(arrays.grads) + offset;
      widened.resize(n);
      for (size_t i = 0; i < n; i++) widened[i] = bf16_to_float(bits[i]);
      grad = widened.data();
    }
    tensors_[t].compress(DemoArrays{arrays.array(0) + offset, arrays.array(1) + offset, grad}, lr_,
                         sent_[t], pool, grad_scale_);
    prepared_[t] = 1;
  }
}

DeviceKernel DemoRule::device_prepare(const RuleArrays& arrays) const {
  DeviceKernel kernel;
  kernel.name = "demo prepare";
  kernel.work_items = arrays.size;
  kernel.on_host = [this, arrays] { prepare(arrays, nullptr); };
  return kernel;
}

void DemoRule::exchange() {
  for (size_t t = 0; t < layout_.size(); t++)
    TANDEM_CHECK(prepared_[t], "DeMo: tensor ", layout_[t].name,
                 " was in no subgroup this step; every rank must compress every tensor");
  std::vector<const DemoTensor*> tensors;
  for (const DemoTensor& t : tensors_) tensors.push_back(&t);
  received_ = demo_exchange(tensors, sent_, comm_);
}

void DemoRule::apply(const RuleArrays& arrays, ThreadPool* pool) const {
  const auto [first, last] = tensors_of(arrays);
  for (size_t t = first; t < last; t++) {
    const size_t offset = layout_[t].begin - arrays.begin;
    std::vector<const DemoMessage*> by_rank;
    for (const auto& rank : received_) by_rank.push_back(&rank[t]);
    float* params = arrays.array(0) + offset;
    tensors_[t].apply(by_rank, lr_, params, nullptr, pool);
    if (arrays.params16 == nullptr) continue;
    // The 16-bit working copy, rounded once from the new fp32 parameters.
    const auto n = static_cast<size_t>(tensors_[t].blocks().num_elements());
    auto* out = static_cast<uint16_t*>(arrays.params16) + offset;
    for (size_t i = 0; i < n; i++)
      out[i] = arrays.params16_dtype == WorkingDType::kF16 ? float_to_fp16(params[i])
                                                           : float_to_bf16(params[i]);
  }
}

void DemoRule::update_on_host(const RuleArrays& arrays, std::span<const UpdateSegment>) {
  apply(arrays, pool_);
}

DeviceKernel DemoRule::device_update(const RuleArrays& arrays,
                                     std::span<const UpdateSegment>) const {
  DeviceKernel kernel;
  kernel.name = "demo update";
  kernel.work_items = arrays.size;
  kernel.on_host = [this, arrays] { apply(arrays, nullptr); };
  return kernel;
}

}  // namespace tandem
