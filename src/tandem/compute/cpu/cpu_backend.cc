// CpuBackend: host memory and the CPU kernels (fp32: cpu_kernels.h; Bf16 storage:
// bf16_kernels.h, which widens to fp32 and rounds on store), both storage types through
// one template, so each kernel is written once here.
#include <cstring>
#include <limits>

#include "tandem/compute/compute_backend.h"
#include "tandem/compute/cpu/bf16_kernels.h"
#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"

namespace tandem {
namespace {

// The kernels for tensors stored as Elem, each written once for both storage types: the
// cpu:: function of that element type (cpu_kernels.h for float, bf16_kernels.h for Bf16,
// which overloads it). Each shares its loops among the calling thread and the backend's
// pool.
template <typename Elem>
class CpuKernels final : public StorageKernels<Elem> {
 public:
  explicit CpuKernels(ThreadPool& pool) : pool_(pool) {}

  double sum_of_squares(const Elem* x, size_t n) override {
    return cpu::sum_of_squares(pool_, x, n);
  }
  void sum_of_squares_blocks(const Elem* x, size_t n, double* partials) override {
    cpu::sum_of_squares_blocks(pool_, x, n, partials);
  }
  void encoder_forward(Elem* out, const int32_t* tokens, const Elem* wte, const Elem* wpe, int B,
                       int T, int C) override {
    cpu::encoder_forward(pool_, out, tokens, wte, wpe, B, T, C);
  }
  void layernorm_forward(Elem* out, float* mean, float* rstd, const Elem* inp, const Elem* weight,
                         const Elem* bias, int N, int C) override {
    cpu::layernorm_forward(pool_, out, mean, rstd, inp, weight, bias, N, C);
  }
  void matmul_forward(Elem* out, const Elem* inp, const Elem* weight, const Elem* bias, int N,
                      int C, int OC) override {
    cpu::matmul_forward(pool_, out, inp, weight, bias, N, C, OC);
  }
  void attention_forward(Elem* out, float* lse, const Elem* qkv, int B, int T, int NH, int KVH,
                         int HS) override {
    cpu::attention_forward(pool_, out, lse, qkv, B, T, NH, KVH, HS);
  }
  void rmsnorm_forward(Elem* out, float* rstd, const Elem* inp, const Elem* weight, float eps,
                       int N, int C) override {
    cpu::rmsnorm_forward(pool_, out, rstd, inp, weight, eps, N, C);
  }
  void head_rmsnorm_forward(Elem* out, float* rstd, const Elem* inp, const Elem* weight, float eps,
                            int N, int H, int HS, int row_stride) override {
    cpu::head_rmsnorm_forward(pool_, out, rstd, inp, weight, eps, N, H, HS, row_stride);
  }
  void rope_forward(Elem* qkv, const float* cos_sin, int B, int T, int NH, int KVH,
                    int HS) override {
    cpu::rope_forward(pool_, qkv, cos_sin, B, T, NH, KVH, HS);
  }
  void swiglu_forward(Elem* out, const Elem* inp, int N, int I) override {
    cpu::swiglu_forward(pool_, out, inp, N, I);
  }
  void gelu_forward(Elem* out, const Elem* inp, size_t N) override {
    cpu::gelu_forward(pool_, out, inp, N);
  }
  void residual_forward(Elem* out, const Elem* a, const Elem* b, size_t N) override {
    cpu::residual_forward(pool_, out, a, b, N);
  }
  void cross_entropy_forward(float* losses, const Elem* logits, const int32_t* targets, int N,
                             int V) override {
    cpu::cross_entropy_forward(pool_, losses, logits, targets, N, V);
  }
  void cross_entropy_backward(Elem* dlogits, const Elem* logits, const int32_t* targets,
                              float dloss, int N, int V) override {
    cpu::cross_entropy_backward(pool_, dlogits, logits, targets, dloss, N, V);
  }
  void matmul_backward(Elem* dinp, Elem* dweight, Elem* dbias, const Elem* dout, const Elem* inp,
                       const Elem* weight, int N, int C, int OC) override {
    cpu::matmul_backward(pool_, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void layernorm_backward(Elem* dinp, Elem* dweight, Elem* dbias, const Elem* dout, const Elem* inp,
                          const Elem* weight, const float* mean, const float* rstd, int N,
                          int C) override {
    cpu::layernorm_backward(pool_, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void attention_backward(Elem* dqkv, const Elem* dout, const Elem* qkv, const Elem* out,
                          const float* lse, int B, int T, int NH, int KVH, int HS) override {
    cpu::attention_backward(pool_, dqkv, dout, qkv, out, lse, B, T, NH, KVH, HS);
  }
  void rmsnorm_backward(Elem* dinp, Elem* dweight, const Elem* dout, const Elem* inp,
                        const Elem* weight, const float* rstd, int N, int C) override {
    cpu::rmsnorm_backward(pool_, dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void head_rmsnorm_backward(Elem* dinp, Elem* dweight, const Elem* dout, const Elem* inp,
                             const Elem* weight, const float* rstd, int N, int H, int HS,
                             int row_stride) override {
    cpu::head_rmsnorm_backward(pool_, dinp, dweight, dout, inp, weight, rstd, N, H, HS, row_stride);
  }
  void rope_backward(Elem* dqkv, const float* cos_sin, int B, int T, int NH, int KVH,
                     int HS) override {
    cpu::rope_backward(pool_, dqkv, cos_sin, B, T, NH, KVH, HS);
  }
  void swiglu_backward(Elem* dinp, const Elem* inp, const Elem* dout, int N, int I) override {
    cpu::swiglu_backward(pool_, dinp, inp, dout, N, I);
  }
  void gelu_backward(Elem* dinp, const Elem* inp, const Elem* dout, size_t N) override {
    cpu::gelu_backward(pool_, dinp, inp, dout, N);
  }
  void encoder_backward(Elem* dwte, Elem* dwpe, const Elem* dout, const int32_t* tokens, int B,
                        int T, int C) override {
    cpu::encoder_backward(pool_, dwte, dwpe, dout, tokens, B, T, C);
  }

 private:
  ThreadPool& pool_;
};

class CpuBackend final : public ComputeBackend {
 public:
  // On `device` (a cpu device: its "device" memory is host memory the kernels can use).
  explicit CpuBackend(Device& device)
      : device_(device), stream_(device.create_stream("compute")), fp32_(pool_), bf16_(pool_) {
    TANDEM_CHECK(device.kind() == DeviceKind::kHostOnly,
                 "the cpu compute backend needs the cpu device, not '", device.name(), "'");
  }
  // On a device of its own.
  explicit CpuBackend(std::unique_ptr<Device> own_device)
      : owned_device_(std::move(own_device)),
        device_(*owned_device_),
        stream_(device_.create_stream("compute")),
        fp32_(pool_),
        bf16_(pool_) {}

  std::string_view name() const override { return "cpu"; }
  Device& device() override { return device_; }
  // Kernels run on the caller's thread (and the pool's), so nothing is ever queued here: an event
  // recorded on it is reached at once, and every kernel called before is done.
  Stream& stream() override { return *stream_; }
  bool queues_kernels() const override { return false; }

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

 protected:
  StorageKernels<float>& fp32_kernels() override { return fp32_; }
  StorageKernels<Bf16>& bf16_kernels() override { return bf16_; }

 private:
  std::unique_ptr<Device> owned_device_;  // only for a backend with a device of its own
  Device& device_;
  std::unique_ptr<Stream> stream_;
  // The kernels' threads: OMP_NUM_THREADS or one per allowed CPU, not pinned (a thread
  // pinned to a core another program took could not move off it).
  ThreadPool pool_{0, false};
  CpuKernels<float> fp32_;
  CpuKernels<Bf16> bf16_;
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
