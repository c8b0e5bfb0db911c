#include "tandem/optim/demo/demo_rule.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/half.h"
#include "tandem/core/thread_pool.h"
#include "tandem/model/param_layout.h"
#include "tandem/optim/demo/demo_device_kernel.h"
#include "tandem/optim/demo/demo_replica_check.h"
#include "tandem/optim/optimizer_family.h"

namespace tandem {

namespace {

// Coefficients a rank sends for the tensor: its topk per block.
size_t message_entries(const DemoTensor& tensor) {
  return static_cast<size_t>(tensor.blocks().count() * tensor.topk());
}

// The tensors wholly or partly in subgroups at a device site.
std::vector<char> tensors_on_device(const std::vector<DemoRuleTensor>& tensors,
                                    const OffloadPlan& plan) {
  std::vector<char> on_device(tensors.size(), 0);
  for (const Subgroup& sg : plan.subgroups) {
    if (sg.site == UpdateSite::kHost) continue;
    for (size_t t = 0; t < tensors.size(); t++)
      if (tensors[t].begin >= sg.begin && tensors[t].begin < sg.end) on_device[t] = 1;
  }
  return on_device;
}

// How the GPU workspace is laid out: every distinct DCT matrix once, scratch for the
// largest tensor on the device, and each tensor's entries (count x its topk, demo_topk) in
// a rank's messages.
struct WorkspaceLayout {
  std::vector<std::pair<int64_t, size_t>> dct;  // (size n, float offset) of each matrix
  size_t dct_floats = 0;
  size_t scratch_floats = 0;
  std::vector<size_t> offset;  // per tensor: its first entry in a rank's messages
  size_t entries = 0;          // per rank, every tensor
  bool any_on_device = false;

  size_t dct_offset(int64_t n) const {
    for (const auto& [size, at] : dct)
      if (size == n) return at;
    return SIZE_MAX;
  }
  size_t device_bytes(int world) const {
    if (!any_on_device) return 0;
    return (dct_floats + scratch_floats) * sizeof(float) +
           (1 + static_cast<size_t>(world)) * entries * (sizeof(int32_t) + sizeof(float));
  }
};

WorkspaceLayout workspace_layout(const std::vector<DemoRuleTensor>& tensors,
                                 const std::vector<DemoBlocks>& blocks, int64_t compression_topk,
                                 const OffloadPlan& plan) {
  WorkspaceLayout w;
  const std::vector<char> on_device = tensors_on_device(tensors, plan);
  for (size_t t = 0; t < tensors.size(); t++) {
    const DemoBlocks& b = blocks[t];
    w.offset.push_back(w.entries);
    w.entries += static_cast<size_t>(b.count() * demo_topk(compression_topk, b));
    if (!on_device[t]) continue;
    w.any_on_device = true;
    for (int64_t n : {b.block_rows(), b.block_cols()}) {
      if (w.dct_offset(n) != SIZE_MAX) continue;
      w.dct.emplace_back(n, w.dct_floats);
      w.dct_floats += static_cast<size_t>(n * n);
    }
    const DemoCudaBlocks geometry{.rows = b.rows(), .cols = b.cols()};
    w.scratch_floats = std::max(w.scratch_floats, demo_cuda_scratch_floats(geometry));
  }
  return w;
}

}  // namespace

// See demo_rule.h: the GPU kernels' memory, made by attach_device on a CUDA device.
struct DemoRule::CudaWorkspace {
  WorkspaceLayout layout;
  DeviceAllocation dct, scratch;
  // This rank's messages ([entries] indices, then [entries] values) on the device and in
  // pinned host memory; every rank's (per tensor, [world][its entries]) likewise.
  DeviceAllocation sent_device, sent_host, received_device, received_host;
  std::vector<DemoCudaBlocks> blocks;  // per tensor (valid for the tensors on the device)
  size_t world = 1;

  int32_t* sent_indices(const DeviceAllocation& a) const { return a.as<int32_t>(); }
  float* sent_values(const DeviceAllocation& a) const {
    return reinterpret_cast<float*>(a.as<int32_t>() + layout.entries);
  }
  int32_t* received_indices(const DeviceAllocation& a) const { return a.as<int32_t>(); }
  float* received_values(const DeviceAllocation& a) const {
    return reinterpret_cast<float*>(a.as<int32_t>() + world * layout.entries);
  }
};

DemoRule::DemoRule(std::vector<DemoRuleTensor> tensors, const DemoHyper& hyper, Communicator& comm,
                   ThreadPool* pool, SimdTarget target)
    : layout_(std::move(tensors)),
      compression_topk_(hyper.compression_topk),
      comm_(comm),
      pool_(pool) {
  size_t next = 0;
  for (const DemoRuleTensor& t : layout_) {
    TANDEM_CHECK(t.begin == next, "DeMo: tensor ", t.name, " starts at ", t.begin,
                 "; the tensors must cover the parameters in order (expected ", next, ")");
    tensors_.emplace_back(t.name, t.shape, hyper, target);
    next = t.begin + static_cast<size_t>(tensors_.back().blocks().num_elements());
  }
  sent_.resize(layout_.size());
  prepared_.assign(layout_.size(), 0);
  prepared_on_device_.assign(layout_.size(), 0);
  received_.assign(comm_.world_size(), std::vector<DemoMessage>(layout_.size()));
}

DemoRule::~DemoRule() = default;

std::string DemoRule::topk_note(const std::vector<DemoRuleTensor>& tensors,
                                const DemoHyper& hyper) {
  std::string names;
  size_t count = 0;
  for (const DemoRuleTensor& t : tensors) {
    const DemoBlocks blocks(t.shape, hyper.compression_chunk, t.name.c_str(), SimdTarget::kScalar);
    if (demo_topk(hyper.compression_topk, blocks) == hyper.compression_topk) continue;
    if (count++ < kNamedInNote)
      names += cat(names.empty() ? "" : ", ", t.name, " (", blocks.block_size(), ")");
  }
  if (count == 0) return "";
  return cat("DeMo: optimizer.params.compression_topk ", hyper.compression_topk,
             " is clamped to the DCT block of ", count, count == 1 ? " tensor" : " tensors",
             " (sent whole, as the reference does): ", names,
             count > kNamedInNote ? cat(" and ", count - kNamedInNote, " more") : std::string());
}

size_t DemoRule::device_workspace_bytes(const std::vector<DemoRuleTensor>& tensors,
                                        const DemoHyper& hyper, int world_size,
                                        const OffloadPlan& plan, DeviceKind kind) {
  if (kind != DeviceKind::kCuda) return 0;
  std::vector<DemoBlocks> blocks;
  for (const DemoRuleTensor& t : tensors)
    blocks.emplace_back(t.shape, hyper.compression_chunk, t.name.c_str(), SimdTarget::kScalar);
  return workspace_layout(tensors, blocks, hyper.compression_topk, plan).device_bytes(world_size);
}

void DemoRule::attach_device(Device& device, const OffloadPlan& plan) {
  if (device.kind() != DeviceKind::kCuda) return;  // the device variants run the CPU code
  std::vector<DemoBlocks> blocks;
  for (const DemoTensor& t : tensors_) blocks.push_back(t.blocks());
  auto w = std::make_unique<CudaWorkspace>();
  w->layout = workspace_layout(layout_, blocks, compression_topk_, plan);
  if (!w->layout.any_on_device) return;
  w->world = static_cast<size_t>(comm_.world_size());
  const size_t message_bytes = w->layout.entries * (sizeof(int32_t) + sizeof(float));
  w->dct = device.allocate(MemorySpace::kDevice, w->layout.dct_floats * sizeof(float));
  w->scratch = device.allocate(MemorySpace::kDevice, w->layout.scratch_floats * sizeof(float));
  w->sent_device = device.allocate(MemorySpace::kDevice, message_bytes);
  w->sent_host = device.allocate(MemorySpace::kPinnedHost, message_bytes);
  w->received_device = device.allocate(MemorySpace::kDevice, w->world * message_bytes);
  w->received_host = device.allocate(MemorySpace::kPinnedHost, w->world * message_bytes);
  // The DCT matrices, computed on the host as the CPU code uses them.
  std::vector<float> dct(w->layout.dct_floats);
  for (const auto& [n, at] : w->layout.dct) {
    const std::vector<float> c = dct_matrix(n);
    std::copy(c.begin(), c.end(), dct.begin() + static_cast<std::ptrdiff_t>(at));
  }
  const std::unique_ptr<Stream> stream = device.create_stream("demo setup");
  device.copy_async(w->dct.data(), dct.data(), dct.size() * sizeof(float), *stream);
  stream->synchronize();
  const float* matrices = w->dct.as<float>();
  for (const DemoBlocks& b : blocks) {
    const size_t m = w->layout.dct_offset(b.block_rows()), n = w->layout.dct_offset(b.block_cols());
    w->blocks.push_back({.rows = b.rows(),
                         .cols = b.cols(),
                         .block_rows = b.block_rows(),
                         .block_cols = b.block_cols(),
                         .c_m = m == SIZE_MAX ? nullptr : matrices + m,
                         .c_n = n == SIZE_MAX ? nullptr : matrices + n});
  }
  cuda_ = std::move(w);
}

std::vector<size_t> DemoRule::tensor_ends() const {
  std::vector<size_t> ends;
  for (size_t t = 0; t < layout_.size(); t++)
    ends.push_back(layout_[t].begin + static_cast<size_t>(tensors_[t].blocks().num_elements()));
  return ends;
}

void DemoRule::begin_step(int64_t, double lr, float grad_scale) {
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
  if (!cuda_) return kernel;
  // On the GPU: each tensor's compress kernels, its message copied to pinned memory.
  const auto [first, last] = tensors_of(arrays);
  const CudaWorkspace& w = *cuda_;
  const size_t grad_bytes = arrays.grad_dtype == GradDType::kBF16 ? 2 : 4;
  std::vector<DeviceKernel> launches;
  for (size_t t = first; t < last; t++) {
    const size_t offset = layout_[t].begin - arrays.begin, at = w.layout.offset[t];
    const DemoTensor& tensor = tensors_[t];
    launches.push_back(demo_compress_kernel(
        w.blocks[t], {.params = arrays.array(0) + offset,
                      .delta = arrays.array(1) + offset,
                      .grads = static_cast<const char*>(arrays.grads) + offset * grad_bytes,
                      .grad_dtype = arrays.grad_dtype,
                      .decay = tensor.decay_factor(lr_),
                      .beta = tensor.compression_decay(),
                      .lr = static_cast<float>(lr_),
                      .grad_scale = grad_scale_,
                      .topk = tensor.topk(),
                      .scratch = w.scratch.as<float>(),
                      .indices = w.sent_indices(w.sent_device) + at,
                      .values = w.sent_values(w.sent_device) + at,
                      .host_indices = w.sent_indices(w.sent_host) + at,
                      .host_values = w.sent_values(w.sent_host) + at}));
    prepared_[t] = 1;
    prepared_on_device_[t] = 1;
  }
  kernel.on_cuda = [launches = std::move(launches)](void* stream) {
    for (const DeviceKernel& k : launches) k.on_cuda(stream);
  };
  return kernel;
}

void DemoRule::exchange() {
  for (size_t t = 0; t < layout_.size(); t++)
    TANDEM_CHECK(prepared_[t], "DeMo: tensor ", layout_[t].name,
                 " was in no subgroup this step; every rank must compress every tensor");
  if (cuda_) {
    // The messages the GPU made (in pinned memory by now: the engine synchronized).
    const CudaWorkspace& w = *cuda_;
    for (size_t t = 0; t < layout_.size(); t++) {
      if (!prepared_on_device_[t]) continue;
      const size_t at = w.layout.offset[t], n = message_entries(tensors_[t]);
      const int32_t* indices = w.sent_indices(w.sent_host) + at;
      const float* values = w.sent_values(w.sent_host) + at;
      sent_[t].indices.assign(indices, indices + n);
      sent_[t].values.assign(values, values + n);
    }
  }
  std::vector<const DemoTensor*> tensors;
  for (const DemoTensor& t : tensors_) tensors.push_back(&t);
  received_ = demo_exchange(tensors, sent_, comm_);
  if (!cuda_) return;
  // Every rank's messages of the tensors updated on the GPU, tensor by tensor ([world]
  // [entries]), for the update kernels to upload; indices checked here, as apply does.
  const CudaWorkspace& w = *cuda_;
  for (size_t t = 0; t < layout_.size(); t++) {
    if (!prepared_on_device_[t]) continue;
    prepared_on_device_[t] = 0;
    const int64_t bs = tensors_[t].blocks().block_size();
    const size_t n = message_entries(tensors_[t]);
    int32_t* indices = w.received_indices(w.received_host) + w.world * w.layout.offset[t];
    float* values = w.received_values(w.received_host) + w.world * w.layout.offset[t];
    for (size_t r = 0; r < w.world; r++) {
      const DemoMessage& m = received_[r][t];
      for (size_t j = 0; j < n; j++)
        TANDEM_CHECK(m.indices[j] >= 0 && m.indices[j] < bs, "DeMo: ", layout_[t].name, ": rank ",
                     r, " sent coefficient ", m.indices[j], " of a block of ", bs);
      std::copy(m.indices.begin(), m.indices.end(), indices + r * n);
      std::copy(m.values.begin(), m.values.end(), values + r * n);
    }
  }
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
  if (!cuda_) return kernel;
  // On the GPU: every rank's messages uploaded, then each tensor's decode and sign step.
  const auto [first, last] = tensors_of(arrays);
  const CudaWorkspace& w = *cuda_;
  std::vector<DeviceKernel> launches;
  for (size_t t = first; t < last; t++) {
    const size_t offset = layout_[t].begin - arrays.begin, at = w.world * w.layout.offset[t];
    launches.push_back(demo_apply_kernel(
        w.blocks[t],
        {.indices = w.received_indices(w.received_device) + at,
         .values = w.received_values(w.received_device) + at,
         .host_indices = w.received_indices(w.received_host) + at,
         .host_values = w.received_values(w.received_host) + at,
         .world = static_cast<int>(w.world),
         .topk = tensors_[t].topk(),
         .lr = static_cast<float>(lr_),
         .params = arrays.array(0) + offset,
         .params16 = arrays.params16 == nullptr
                         ? nullptr
                         : static_cast<void*>(static_cast<uint16_t*>(arrays.params16) + offset),
         .params16_dtype = arrays.params16 == nullptr ? WorkingDType::kNone : arrays.params16_dtype,
         .scratch = w.scratch.as<float>()}));
  }
  kernel.on_cuda = [launches = std::move(launches)](void* stream) {
    for (const DeviceKernel& k : launches) k.on_cuda(stream);
  };
  return kernel;
}

namespace {

using ParamKeys = JsonKeys<OptimizerConfig>;

std::vector<DemoRuleTensor> demo_tensors(const ParamLayout& layout) {
  std::vector<DemoRuleTensor> tensors;
  for (const ParamView& view : layout.views())
    tensors.push_back({.name = view.name, .shape = view.shape, .begin = view.offset});
  return tensors;
}

DemoHyper demo_hyper(const OptimizerConfig& config) {
  const DemoSettings& own = own_settings<DemoSettings>(config);
  return {.compression_decay = own.compression_decay,
          .compression_topk = own.compression_topk,
          .compression_chunk = own.compression_chunk,
          .weight_decay = config.weight_decay,
          .compression_values = own.compression_values};
}

std::unique_ptr<UpdateRule> make_demo(const OptimizerConfig& config, const ParamLayout& layout,
                                      Communicator& comm, ThreadPool& pool) {
  return std::make_unique<DemoRule>(demo_tensors(layout), demo_hyper(config), comm, &pool);
}

std::string demo_settings_note(const OptimizerConfig& config, const ParamLayout& layout) {
  return DemoRule::topk_note(demo_tensors(layout), demo_hyper(config));
}

size_t demo_workspace_bytes(const OptimizerConfig& config, const ParamLayout& layout,
                            const OffloadPlan& plan, int world_size, DeviceKind kind) {
  return DemoRule::device_workspace_bytes(demo_tensors(layout), demo_hyper(config), world_size,
                                          plan, kind);
}

// Every rank's packed messages (demo_wire.h) reach every other: an all-gather, which sends
// (N - 1) times one rank's message as the communicators count it.
double demo_exchange_bytes(const OptimizerConfig& config, const ParamLayout& layout,
                           int world_size) {
  const DemoHyper hyper = demo_hyper(config);
  double message = 0;
  for (const DemoRuleTensor& t : demo_tensors(layout)) {
    const DemoBlocks blocks(t.shape, hyper.compression_chunk, t.name.c_str(), SimdTarget::kScalar);
    message += static_cast<double>(DemoWire(blocks.count(), blocks.block_size(),
                                            demo_topk(hyper.compression_topk, blocks),
                                            hyper.compression_values)
                                       .bytes());
  }
  return (world_size - 1) * message;
}

}  // namespace

OptimizerFamily demo_family() {
  return {
      .type = OptimizerType::kDeMo,
      .name = "DeMo",
      .defaults = {.type = OptimizerType::kDeMo, .weight_decay = 0.0, .own = DemoSettings{}},
      .params = {lr_param(),
                 ParamKeys::real("compression_decay",
                                 TANDEM_OWN_FIELD(DemoSettings, compression_decay),
                                 "a number in [0, 1)", [](double v) { return v >= 0 && v < 1; }),
                 // Clamped to each tensor's block where that is smaller (demo_topk), as the
                 // reference does; `tandem plan` and the run's start say for which.
                 ParamKeys::integer("compression_topk",
                                    TANDEM_OWN_FIELD(DemoSettings, compression_topk), 1),
                 ParamKeys::integer("compression_chunk",
                                    TANDEM_OWN_FIELD(DemoSettings, compression_chunk), 1),
                 ParamKeys::choice("compression_values",
                                   TANDEM_OWN_FIELD(DemoSettings, compression_values),
                                   kDemoValueFormatNames),
                 weight_decay_param()},
      .state_arrays = DemoRule::kStateArrays,
      .state_label = "fp32 params, delta",
      .state_per_rank = true,
      .reduces_gradients = false,
      .cuts_at_tensor_ends = true,
      .make_rule = make_demo,
      .device_workspace_bytes = demo_workspace_bytes,
      .exchange_bytes = demo_exchange_bytes,
      .settings_note = demo_settings_note,
      .sections = {{"demo",
                    {ParamKeys::integer("replica_check_interval",
                                        TANDEM_OWN_FIELD(DemoSettings, replica_check_interval),
                                        0)}}},
      .make_hooks = make_demo_replica_check,
  };
}

}  // namespace tandem
