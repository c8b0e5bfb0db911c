// SGD with momentum: the recipe of docs/architecture.md ("Where do I add ... an optimizer")
// done in full, and kept as its proof (tests/optim/test_sgd_recipe.cc). Its room is this
// file (settings, rule, CPU kernel, row) and sgd_cuda.cu (its GPU kernel); outside it, its
// type and place in the list in optim/optimizer_family.h. Nothing else names it.
//
// Per element, g the gradient times the step's gradient scale (PyTorch's torch.optim.SGD
// with dampening 0, its momentum buffer starting at 0):
//   g   = fma(weight_decay, p, g)     tensors with weight decay only (2-D weights)
//   buf = fma(momentum, buf, g)
//   p   = fma(-lr, buf, p)            and the 16-bit working copy, when there is one
// Every operation is correctly rounded on the CPU and the GPU (sgd_cuda.cu spells out the
// same fmas, compiled with -fmad=false), so every offload schedule gives the same bits.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/core/half.h"
#include "tandem/core/thread_pool.h"
#include "tandem/offload/update_rule.h"
#include "tandem/optim/optimizer_family.h"

namespace tandem {

#ifdef TANDEM_HAVE_CUDA
// sgd_cuda.cu: the update of `segments` (indices into the arrays, all in device memory) on
// `stream`, a cudaStream_t, element by element as sgd_element below.
void launch_sgd_cuda(float* params, float* momentum, const void* grads, GradDType grad_dtype,
                     void* params16, WorkingDType params16_dtype, const UpdateSegment* segments,
                     size_t num_segments, float lr, float mu, float weight_decay, float grad_scale,
                     void* stream);
#endif

namespace {

// SGD's own settings (OptimizerConfig::own): its optimizer.params beyond lr and
// weight_decay.
struct SgdSettings {
  float momentum = 0.9f;
};

struct SgdScalars {
  float lr = 0, momentum = 0, weight_decay = 0, grad_scale = 1;
};

struct SgdArrays {
  float* params;
  float* momentum;
  const void* grads;
  GradDType grad_dtype;
  void* params16;  // or null
  WorkingDType params16_dtype;
};

void sgd_element(const SgdArrays& a, size_t i, bool decay, const SgdScalars& s) {
  const float grad = a.grad_dtype == GradDType::kBF16
                         ? bf16_to_float(static_cast<const uint16_t*>(a.grads)[i])
                         : static_cast<const float*>(a.grads)[i];
  float g = grad * s.grad_scale;
  if (decay) g = std::fma(s.weight_decay, a.params[i], g);
  const float buf = std::fma(s.momentum, a.momentum[i], g);
  const float p = std::fma(-s.lr, buf, a.params[i]);
  a.momentum[i] = buf;
  a.params[i] = p;
  if (a.params16 != nullptr)
    static_cast<uint16_t*>(a.params16)[i] =
        a.params16_dtype == WorkingDType::kF16 ? float_to_fp16(p) : float_to_bf16(p);
}

void sgd_segments(const SgdArrays& a, std::span<const UpdateSegment> segments,
                  const SgdScalars& s) {
  for (const UpdateSegment& segment : segments)
    for (size_t i = segment.begin; i < segment.end; i++) sgd_element(a, i, segment.weight_decay, s);
}

class SgdRule final : public UpdateRule {
 public:
  SgdRule(const OptimizerConfig& config, ThreadPool& pool)
      : momentum_(own_settings<SgdSettings>(config).momentum),
        weight_decay_(static_cast<float>(config.weight_decay)),
        pool_(pool) {}

  static constexpr std::string_view kStateArrays[] = {"param", "momentum_buffer"};

  std::string_view name() const override { return "sgd"; }
  const std::vector<std::string>& state_arrays() const override { return arrays_; }
  void begin_step(int64_t, double lr, float grad_scale) override {
    scalars_ = {.lr = static_cast<float>(lr),
                .momentum = momentum_,
                .weight_decay = weight_decay_,
                .grad_scale = grad_scale};
  }
  void update_on_host(const RuleArrays& arrays, std::span<const UpdateSegment> segments) override {
    const SgdArrays a = sgd_arrays(arrays);
    const size_t total = segments.empty() ? 0 : segments.back().end;
    pool_.parallel_for(total, size_t{1} << 16, [&](size_t chunk_begin, size_t chunk_end) {
      for (const UpdateSegment& segment : segments) {
        const UpdateSegment part{std::max(segment.begin, chunk_begin),
                                 std::min(segment.end, chunk_end), segment.weight_decay};
        if (part.begin < part.end) sgd_segments(a, {&part, 1}, scalars_);
      }
    });
  }
  DeviceKernel device_update(const RuleArrays& arrays,
                             std::span<const UpdateSegment> segments) const override {
    std::vector<UpdateSegment> ranges(segments.begin(), segments.end());
    DeviceKernel kernel;
    kernel.name = "sgd";
    for (const UpdateSegment& s : ranges) kernel.work_items += s.end - s.begin;
    const SgdArrays a = sgd_arrays(arrays);
    const SgdScalars s = scalars_;
    kernel.on_host = [a, ranges, s] { sgd_segments(a, ranges, s); };
#ifdef TANDEM_HAVE_CUDA
    kernel.on_cuda = [a, ranges = std::move(ranges), s](void* stream) {
      launch_sgd_cuda(a.params, a.momentum, a.grads, a.grad_dtype, a.params16, a.params16_dtype,
                      ranges.data(), ranges.size(), s.lr, s.momentum, s.weight_decay, s.grad_scale,
                      stream);
    };
#endif
    return kernel;
  }

 private:
  static SgdArrays sgd_arrays(const RuleArrays& arrays) {
    return {
        arrays.array(0), arrays.array(1),
        arrays.grads,    arrays.grad_dtype,
        arrays.params16, arrays.params16 != nullptr ? arrays.params16_dtype : WorkingDType::kNone};
  }

  float momentum_, weight_decay_;
  ThreadPool& pool_;
  std::vector<std::string> arrays_{std::begin(kStateArrays), std::end(kStateArrays)};
  SgdScalars scalars_;
};

std::unique_ptr<UpdateRule> make_sgd(const OptimizerConfig& config, const ParamLayout&,
                                     Communicator&, ThreadPool& pool) {
  return std::make_unique<SgdRule>(config, pool);
}

}  // namespace

OptimizerFamily sgd_family() {
  using ParamKeys = JsonKeys<OptimizerConfig>;
  return {
      .type = OptimizerType::kSgd,
      .name = "SGD",
      .defaults = {.type = OptimizerType::kSgd, .weight_decay = 0.0, .own = SgdSettings{}},
      .params = {lr_param(),
                 ParamKeys::real("momentum", TANDEM_OWN_FIELD(SgdSettings, momentum),
                                 "a number in [0, 1)", [](double v) { return v >= 0 && v < 1; }),
                 weight_decay_param()},
      .state_arrays = SgdRule::kStateArrays,
      .state_label = "fp32 params, momentum",
      .make_rule = make_sgd,
      // fp32 params and momentum read and written (16), the bf16 gradient read and the
      // bf16 working copy written (4).
      .gpu_bytes_per_param = 20,
  };
}

}  // namespace tandem
