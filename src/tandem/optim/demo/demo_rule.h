// DeMo as the update engine's rule (offload/update_rule.h): each rank keeps its own
// momentum `delta` beside the fp32 parameters ([param | delta] per subgroup, at the
// subgroup's site like AdamW's state), so the gradients are never all-reduced. A step:
//   prepare, at every subgroup's site: weight decay, momentum, DCT, top-k and error
//     feedback of each of its tensors (DemoTensor::compress), the message kept here;
//   exchange: one all-gather of every tensor's packed message (demo_wire.h) over the
//     ranks' communicator;
//   update, at every subgroup's site: decode and sign step (DemoTensor::apply), and the
//     16-bit working copy when there is one.
// The arithmetic is demo.h's, so the engine gives the library's bits under every offload
// schedule. Subgroups must hold whole tensors (make_offload_plan with tensor_ends() as cut
// points); every parameter is updated with weight_decay, as the reference does; gradients
// are fp32 or bf16 (widened exactly). The device variants run on the host-only device; DeMo has no
// CUDA kernels yet.
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/cpu_features.h"
#include "tandem/device/device.h"
#include "tandem/offload/update_rule.h"
#include "tandem/optim/demo/demo.h"

namespace tandem {

class ThreadPool;

// DeMo's own settings in a config (optim/optimizer_family.h, OptimizerConfig::own): its
// optimizer.params beyond lr and weight_decay (DemoHyper's, optim/demo/demo.h), and its
// own section, "demo".
struct DemoSettings {
  float compression_decay = 0.999f;
  int64_t compression_topk = 32;
  int64_t compression_chunk = 64;
  DemoValueFormat compression_values = DemoValueFormat::kFp32;  // "fp32", "bf16", "sign"
  // "demo": {"replica_check_interval"}: every this many steps the ranks compare a hash of
  // their parameters and stop with an error on a mismatch (DeMo's replicas are meant to
  // stay identical, bit for bit; optim/demo/demo_replica_check.h); 0: never.
  int64_t replica_check_interval = 100;
};

// A tensor of the flat parameter space: its name, shape and first flat index.
struct DemoRuleTensor {
  std::string name;
  std::vector<int64_t> shape;
  size_t begin = 0;
};

class DemoRule final : public UpdateRule {
 public:
  // `tensors` cover the flat space in order. Host work runs on `pool` when given.
  DemoRule(std::vector<DemoRuleTensor> tensors, const DemoHyper& hyper, Communicator& comm,
           ThreadPool* pool = nullptr, SimdTarget target = best_simd_target());
  ~DemoRule() override;

  // The flat index where each tensor ends: the cut points of a plan DeMo can run.
  std::vector<size_t> tensor_ends() const;

  // Device bytes the GPU kernels need beside the state (DCT matrices, scratch for the
  // largest tensor on a device site, every rank's messages) for `plan` on a device of
  // `kind`: 0 on the host-only device or with no device subgroup.
  static size_t device_workspace_bytes(const std::vector<DemoRuleTensor>& tensors,
                                       const DemoHyper& hyper, int world_size,
                                       const OffloadPlan& plan, DeviceKind kind);

  // One line naming the tensors whose DCT block is smaller than compression_topk (each
  // sends its whole block: demo_topk, the reference's clamp), the first kNamedInNote with
  // their block's size and a count of the rest; empty when there are none. DeMo's row's
  // settings_note: `tandem plan` and the start of a run print it.
  static std::string topk_note(const std::vector<DemoRuleTensor>& tensors, const DemoHyper& hyper);
  static constexpr size_t kNamedInNote = 4;

  // The state arrays, the fp32 params first (a checkpoint's names; optim/optimizer_family.h).
  static constexpr std::string_view kStateArrays[] = {"param", "delta"};

  std::string_view name() const override { return "demo"; }
  void attach_device(Device& device, const OffloadPlan& plan) override;
  const std::vector<std::string>& state_arrays() const override { return arrays_; }
  void begin_step(int64_t step, double lr, float grad_scale) override;
  bool has_exchange() const override { return true; }
  void prepare_on_host(const RuleArrays& arrays) override { prepare(arrays, pool_); }
  DeviceKernel device_prepare(const RuleArrays& arrays) const override;
  void exchange() override;
  void update_on_host(const RuleArrays& arrays, std::span<const UpdateSegment> segments) override;
  DeviceKernel device_update(const RuleArrays& arrays,
                             std::span<const UpdateSegment> segments) const override;

  // This rank's message for tensor t at the last step (as computed, before packing).
  const DemoMessage& sent(size_t t) const { return sent_.at(t); }

 private:
  // The tensors [first, last) the subgroup holds, whole (throws naming a split tensor).
  std::pair<size_t, size_t> tensors_of(const RuleArrays& arrays) const;
  void prepare(const RuleArrays& arrays, ThreadPool* pool) const;
  void apply(const RuleArrays& arrays, ThreadPool* pool) const;

  std::vector<DemoRuleTensor> layout_;
  int64_t compression_topk_;  // as configured; each tensor's own is DemoTensor::topk()
  std::vector<DemoTensor> tensors_;
  Communicator& comm_;
  ThreadPool* pool_;
  std::vector<std::string> arrays_{std::begin(kStateArrays), std::end(kStateArrays)};
  double lr_ = 0.0;
  float grad_scale_ = 1.0f;
  // Written by prepare (each tensor's by one subgroup, possibly on a stream's thread).
  mutable std::vector<DemoMessage> sent_;
  mutable std::vector<char> prepared_;
  std::vector<std::vector<DemoMessage>> received_;  // [rank][tensor]

  // On a GPU (attach_device): what the CUDA kernels use.
  struct CudaWorkspace;
  std::unique_ptr<CudaWorkspace> cuda_;
  mutable std::vector<char> prepared_on_device_;  // tensor t's message is in pinned memory
};

}  // namespace tandem
