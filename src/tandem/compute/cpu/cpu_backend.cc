// CpuBackend: host memory and the CPU kernels (fp32: cpu_kernels.h; Bf16 storage:
// bf16_kernels.h, which widens to fp32 and rounds on store).
#include <cstring>
#include <limits>

#include "tandem/compute/compute_backend.h"
#include "tandem/compute/cpu/bf16_kernels.h"
#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/core/error.h"
#include "tandem/optim/grad_clip.h"

namespace tandem {
namespace {

class CpuBackend final : public ComputeBackend {
 public:
  // On `device` (a cpu device: its "device" memory is host memory the kernels can use).
  explicit CpuBackend(Device& device) : device_(device), stream_(device.create_stream("compute")) {
    TANDEM_CHECK(device.name() == "cpu", "the cpu compute backend needs the cpu device, not '",
                 device.name(), "'");
  }
  // On a device of its own.
  explicit CpuBackend(std::unique_ptr<Device> own_device)
      : owned_device_(std::move(own_device)),
        device_(*owned_device_),
        stream_(device_.create_stream("compute")) {}

  std::string_view name() const override { return "cpu"; }
  Device& device() override { return device_; }
  // Kernels run on the caller's thread, so nothing is ever queued here: an event
  // recorded on it is reached at once, and every kernel called before is done.
  Stream& stream() override { return *stream_; }

  Buffer allocate(size_t bytes) override {
    Buffer buffer(device_.allocate(MemorySpace::kDevice, bytes));
    std::memset(buffer.as<void>(), 0, bytes);
    return buffer;
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void fill_zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void synchronize() override {}
  double sum_of_squares(const float* x, size_t n) override { return tandem::sum_of_squares(x, n); }
  void sum_of_squares_blocks(const float* x, size_t n, double* partials) override {
    tandem::sum_of_squares_blocks(x, n, partials);
  }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) override {
    cpu::encoder_forward(out, tokens, wte, wpe, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) override {
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC) override {
    cpu::matmul_forward(out, inp, weight, bias, N, C, OC);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int KVH,
                         int HS) override {
    cpu::attention_forward(out, lse, qkv, B, T, NH, KVH, HS);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, float eps,
                       int N, int C) override {
    cpu::rmsnorm_forward(out, rstd, inp, weight, eps, N, C);
  }
  void rope_forward(float* qkv, const float* cos_sin, int B, int T, int NH, int KVH,
                    int HS) override {
    cpu::rope_forward(qkv, cos_sin, B, T, NH, KVH, HS);
  }
  void swiglu_forward(float* out, const float* inp, int N, int I) override {
    cpu::swiglu_forward(out, inp, N, I);
  }
  void gelu_forward(float* out, const float* inp, size_t N) override {
    cpu::gelu_forward(out, inp, N);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t N) override {
    cpu::residual_forward(out, a, b, N);
  }
  void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                             int V) override {
    cpu::cross_entropy_forward(losses, logits, targets, N, V);
  }
  void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                              float dloss, int N, int V) override {
    cpu::cross_entropy_backward(dlogits, logits, targets, dloss, N, V);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC) override {
    cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, int B, int T, int NH, int KVH, int HS) override {
    cpu::attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, KVH, HS);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, const float* rstd, int N, int C) override {
    cpu::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void rope_backward(float* dqkv, const float* cos_sin, int B, int T, int NH, int KVH,
                     int HS) override {
    cpu::rope_backward(dqkv, cos_sin, B, T, NH, KVH, HS);
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int I) override {
    cpu::swiglu_backward(dinp, inp, dout, N, I);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) override {
    cpu::gelu_backward(dinp, inp, dout, N);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) override {
    cpu::encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
  }

  // ---- Bf16 storage ---------------------------------------------------------
  double sum_of_squares(const Bf16* x, size_t n) override {
    return cpu::bf16::sum_of_squares(x, n);
  }
  void sum_of_squares_blocks(const Bf16* x, size_t n, double* partials) override {
    cpu::bf16::sum_of_squares_blocks(x, n, partials);
  }
  void encoder_forward(Bf16* out, const int32_t* tokens, const Bf16* wte, const Bf16* wpe, int B,
                       int T, int C) override {
    cpu::bf16::encoder_forward(out, tokens, wte, wpe, B, T, C);
  }
  void layernorm_forward(Bf16* out, float* mean, float* rstd, const Bf16* inp, const Bf16* weight,
                         const Bf16* bias, int N, int C) override {
    cpu::bf16::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void matmul_forward(Bf16* out, const Bf16* inp, const Bf16* weight, const Bf16* bias, int N,
                      int C, int OC) override {
    cpu::bf16::matmul_forward(out, inp, weight, bias, N, C, OC);
  }
  void attention_forward(Bf16* out, float* lse, const Bf16* qkv, int B, int T, int NH, int KVH,
                         int HS) override {
    cpu::bf16::attention_forward(out, lse, qkv, B, T, NH, KVH, HS);
  }
  void rmsnorm_forward(Bf16* out, float* rstd, const Bf16* inp, const Bf16* weight, float eps,
                       int N, int C) override {
    cpu::bf16::rmsnorm_forward(out, rstd, inp, weight, eps, N, C);
  }
  void rope_forward(Bf16* qkv, const float* cos_sin, int B, int T, int NH, int KVH,
                    int HS) override {
    cpu::bf16::rope_forward(qkv, cos_sin, B, T, NH, KVH, HS);
  }
  void swiglu_forward(Bf16* out, const Bf16* inp, int N, int I) override {
    cpu::bf16::swiglu_forward(out, inp, N, I);
  }
  void gelu_forward(Bf16* out, const Bf16* inp, size_t N) override {
    cpu::bf16::gelu_forward(out, inp, N);
  }
  void residual_forward(Bf16* out, const Bf16* a, const Bf16* b, size_t N) override {
    cpu::bf16::residual_forward(out, a, b, N);
  }
  void cross_entropy_forward(float* losses, const Bf16* logits, const int32_t* targets, int N,
                             int V) override {
    cpu::bf16::cross_entropy_forward(losses, logits, targets, N, V);
  }
  void cross_entropy_backward(Bf16* dlogits, const Bf16* logits, const int32_t* targets,
                              float dloss, int N, int V) override {
    cpu::bf16::cross_entropy_backward(dlogits, logits, targets, dloss, N, V);
  }
  void matmul_backward(Bf16* dinp, Bf16* dweight, Bf16* dbias, const Bf16* dout, const Bf16* inp,
                       const Bf16* weight, int N, int C, int OC) override {
    cpu::bf16::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void layernorm_backward(Bf16* dinp, Bf16* dweight, Bf16* dbias, const Bf16* dout, const Bf16* inp,
                          const Bf16* weight, const float* mean, const float* rstd, int N,
                          int C) override {
    cpu::bf16::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void attention_backward(Bf16* dqkv, const Bf16* dout, const Bf16* qkv, const Bf16* out,
                          const float* lse, int B, int T, int NH, int KVH, int HS) override {
    cpu::bf16::attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, KVH, HS);
  }
  void rmsnorm_backward(Bf16* dinp, Bf16* dweight, const Bf16* dout, const Bf16* inp,
                        const Bf16* weight, const float* rstd, int N, int C) override {
    cpu::bf16::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void rope_backward(Bf16* dqkv, const float* cos_sin, int B, int T, int NH, int KVH,
                     int HS) override {
    cpu::bf16::rope_backward(dqkv, cos_sin, B, T, NH, KVH, HS);
  }
  void swiglu_backward(Bf16* dinp, const Bf16* inp, const Bf16* dout, int N, int I) override {
    cpu::bf16::swiglu_backward(dinp, inp, dout, N, I);
  }
  void gelu_backward(Bf16* dinp, const Bf16* inp, const Bf16* dout, size_t N) override {
    cpu::bf16::gelu_backward(dinp, inp, dout, N);
  }
  void encoder_backward(Bf16* dwte, Bf16* dwpe, const Bf16* dout, const int32_t* tokens, int B,
                        int T, int C) override {
    cpu::bf16::encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
  }

 private:
  std::unique_ptr<Device> owned_device_;  // only for a backend with a device of its own
  Device& device_;
  std::unique_ptr<Stream> stream_;
};

}  // namespace

std::unique_ptr<ComputeBackend> make_cpu_backend(Device& device) {
  return std::make_unique<CpuBackend>(device);
}

std::unique_ptr<ComputeBackend> make_cpu_backend() {
  // Without a capacity limit: tests and tools size nothing against it.
  return std::make_unique<CpuBackend>(
      make_cpu_device({.memory_bytes = std::numeric_limits<size_t>::max() / 2}));
}

}  // namespace tandem
