// CudaBackend: device memory, cuBLASLt matmuls (cublaslt_matmul.cuh), flash attention
// (flash_attention.cuh) and the kernels of kernels.cuh, all on one CUDA stream.
//
// Both storage types: every kernel exists for tensors stored as float and as Bf16, and
// CudaKernels<Elem> writes each override once for both, so the two sets cannot drift apart.
// Arithmetic is fp32 either way (true fp32 matmuls, no TF32, so the fp32 model can be
// checked against the CPU one); with Bf16 each result is rounded once, when stored.
#include <cuda_runtime.h>

#include <memory>

#include "tandem/compute/compute_backend.h"
#include "tandem/compute/cuda/cublaslt_matmul.cuh"
#include "tandem/compute/cuda/flash_attention.cuh"
#include "tandem/compute/cuda/kernels.cuh"
#include "tandem/core/error.h"
#include "tandem/device/cuda/cuda_check.h"
#include "tandem/device/cuda/cuda_device.h"

namespace tandem {
namespace {

void check(cudaError_t err, const char* what) { cuda_check(err, what); }

// sum_of_squares's result double sits at the start of the scratch buffer, its partial sums
// after this many bytes (a multiple of 256 keeps them aligned).
constexpr size_t kSquaresResultBytes = 256;

// Device memory outside any Device's accounting, for the backend's own scratch (like
// cuBLASLt's workspace), grown on demand: tens of MiB, but for the flash-attention
// backward's dS tiles (up to cuda::kFlashBackwardScratchBudget, 256 MiB, plus [B, NH, T]
// floats).
class ScratchMemory {
 public:
  ScratchMemory() = default;
  ScratchMemory(const ScratchMemory&) = delete;
  ScratchMemory& operator=(const ScratchMemory&) = delete;
  ~ScratchMemory() { cudaFree(data_); }

  // At least `bytes`; growing first waits for `stream`, whose queued kernels may still
  // read the old buffer.
  char* get(size_t bytes, cudaStream_t stream) {
    if (bytes <= bytes_) return data_;
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(cudaFree(data_), "cudaFree");
    data_ = nullptr;
    bytes_ = 0;
    void* data = nullptr;
    const cudaError_t err = cudaMalloc(&data, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail("GPU out of memory allocating ", bytes, " bytes of kernel scratch (",
           cudaGetErrorString(err), "); lower device.memory_gb to leave room for it");
    }
    data_ = static_cast<char*>(data);
    bytes_ = bytes;
    return data_;
  }

 private:
  char* data_ = nullptr;
  size_t bytes_ = 0;
};

// What the kernels launch with: the backend's stream, cuBLASLt on it, and one scratch
// buffer, shared by both storage types' kernels.
class KernelLaunch {
 public:
  KernelLaunch(int device_index, cudaStream_t stream) : stream_(stream) {
    check(cudaSetDevice(device_index), "cudaSetDevice");
    matmul_ = std::make_unique<cuda::CublasLtMatmul>(stream);
  }

  cudaStream_t stream() const { return stream_; }
  cuda::CublasLtMatmul& matmul() { return *matmul_; }
  // Device scratch of at least `bytes` (256-byte aligned: cudaMalloc's), grown on
  // demand. Kernels use it in stream order, so one buffer serves them all.
  char* scratch(size_t bytes) { return scratch_.get(bytes, stream_); }
  // Copies `bytes` of device memory to the host once the queued kernels have run.
  void to_host(void* host_dst, const void* src, size_t bytes) {
    check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy_to_host");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  cudaStream_t stream_;
  std::unique_ptr<cuda::CublasLtMatmul> matmul_;
  ScratchMemory scratch_;
};

// The kernels for tensors stored as Elem, each written once for both storage types: the
// kernels.cuh / flash_attention.cuh template for Elem, or cuBLASLt, on the backend's stream.
template <typename Elem>
class CudaKernels final : public StorageKernels<Elem> {
 public:
  explicit CudaKernels(KernelLaunch& launch) : launch_(launch) {}

  double sum_of_squares(const Elem* x, size_t n) override {
    char* base = launch_.scratch(kSquaresResultBytes + cuda::sum_of_squares_scratch_bytes(n));
    auto* result = reinterpret_cast<double*>(base);
    cuda::sum_of_squares(result, x, n, base + kSquaresResultBytes, launch_.stream());
    double total = 0.0;
    launch_.to_host(&total, result, sizeof(total));
    return total;
  }
  void sum_of_squares_blocks(const Elem* x, size_t n, double* host_partials) override {
    const size_t bytes = cuda::sum_of_squares_scratch_bytes(n);
    if (bytes == 0) return;
    auto* partials = reinterpret_cast<double*>(launch_.scratch(bytes));
    cuda::sum_of_squares_blocks(partials, x, n, launch_.stream());
    launch_.to_host(host_partials, partials, bytes);
  }

  void encoder_forward(Elem* out, const int32_t* tokens, const Elem* wte, const Elem* wpe, int B,
                       int T, int C) override {
    cuda::encoder_forward(out, tokens, wte, wpe, B, T, C, launch_.stream());
  }
  void layernorm_forward(Elem* out, float* mean, float* rstd, const Elem* inp, const Elem* weight,
                         const Elem* bias, int N, int C) override {
    cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, launch_.stream());
  }
  void matmul_forward(Elem* out, const Elem* inp, const Elem* weight, const Elem* bias, int N,
                      int C, int OC) override {
    launch_.matmul().forward(out, inp, weight, bias, N, C, OC);
  }
  void attention_forward(Elem* out, float* lse, const Elem* qkv, int B, int T, int NH, int KVH,
                         int HS) override {
    cuda::flash_attention_forward<Elem>(out, lse, qkv, B, T, NH * HS, NH, KVH, launch_.stream());
  }
  void rmsnorm_forward(Elem* out, float* rstd, const Elem* inp, const Elem* weight, float eps,
                       int N, int C) override {
    cuda::rmsnorm_forward(out, rstd, inp, weight, eps, N, C, launch_.stream());
  }
  void head_rmsnorm_forward(Elem* out, float* rstd, const Elem* inp, const Elem* weight, float eps,
                            int N, int H, int HS, int row_stride) override {
    cuda::head_rmsnorm_forward(out, rstd, inp, weight, eps, N, H, HS, row_stride, launch_.stream());
  }

  void rope_forward(Elem* qkv, const float* cos_sin, int B, int T, int NH, int KVH,
                    int HS) override {
    cuda::rope_forward(qkv, cos_sin, B, T, NH, KVH, HS, launch_.stream());
  }
  void swiglu_forward(Elem* out, const Elem* inp, int N, int I) override {
    cuda::swiglu_forward(out, inp, N, I, launch_.stream());
  }
  void gelu_forward(Elem* out, const Elem* inp, size_t N) override {
    cuda::gelu_forward(out, inp, N, launch_.stream());
  }
  void residual_forward(Elem* out, const Elem* a, const Elem* b, size_t N) override {
    cuda::residual_forward(out, a, b, N, launch_.stream());
  }
  void cross_entropy_forward(float* losses, const Elem* logits, const int32_t* targets, int N,
                             int V) override {
    cuda::cross_entropy_forward(losses, logits, targets, N, V, launch_.stream());
  }

  void cross_entropy_backward(Elem* dlogits, const Elem* logits, const int32_t* targets,
                              float dloss, int N, int V) override {
    cuda::cross_entropy_backward(dlogits, logits, targets, dloss, N, V, launch_.stream());
  }
  void matmul_backward(Elem* dinp, Elem* dweight, Elem* dbias, const Elem* dout, const Elem* inp,
                       const Elem* weight, int N, int C, int OC) override {
    launch_.matmul().backward_input(dinp, dout, weight, N, C, OC);
    launch_.matmul().backward_weight(dweight, dout, inp, N, C, OC);
    if (dbias != nullptr)
      cuda::column_sums_accumulate(dbias, dout, N, OC,
                                   launch_.scratch(cuda::column_sums_scratch_bytes(N, OC)),
                                   launch_.stream());
  }
  void layernorm_backward(Elem* dinp, Elem* dweight, Elem* dbias, const Elem* dout, const Elem* inp,
                          const Elem* weight, const float* mean, const float* rstd, int N,
                          int C) override {
    cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                             launch_.scratch(cuda::layernorm_backward_scratch_bytes(N, C)),
                             launch_.stream());
  }
  void attention_backward(Elem* dqkv, const Elem* dout, const Elem* qkv, const Elem* out,
                          const float* lse, int B, int T, int NH, int KVH, int HS) override {
    const int C = NH * HS;
    const size_t bytes = cuda::flash_attention_backward_scratch_bytes<Elem>(B, T, C, NH, KVH);
    cuda::flash_attention_backward<Elem>(dqkv, launch_.scratch(bytes), bytes, dout, qkv, out, lse,
                                         B, T, C, NH, KVH, launch_.stream());
  }
  void rmsnorm_backward(Elem* dinp, Elem* dweight, const Elem* dout, const Elem* inp,
                        const Elem* weight, const float* rstd, int N, int C) override {
    cuda::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C,
                           launch_.scratch(cuda::rmsnorm_backward_scratch_bytes(N, C)),
                           launch_.stream());
  }
  void head_rmsnorm_backward(Elem* dinp, Elem* dweight, const Elem* dout, const Elem* inp,
                             const Elem* weight, const float* rstd, int N, int H, int HS,
                             int row_stride) override {
    cuda::head_rmsnorm_backward(
        dinp, dweight, dout, inp, weight, rstd, N, H, HS, row_stride,
        launch_.scratch(cuda::head_rmsnorm_backward_scratch_bytes(N, H, HS)), launch_.stream());
  }

  void rope_backward(Elem* dqkv, const float* cos_sin, int B, int T, int NH, int KVH,
                     int HS) override {
    cuda::rope_backward(dqkv, cos_sin, B, T, NH, KVH, HS, launch_.stream());
  }
  void swiglu_backward(Elem* dinp, const Elem* inp, const Elem* dout, int N, int I) override {
    cuda::swiglu_backward(dinp, inp, dout, N, I, launch_.stream());
  }
  void gelu_backward(Elem* dinp, const Elem* inp, const Elem* dout, size_t N) override {
    cuda::gelu_backward(dinp, inp, dout, N, launch_.stream());
  }
  void encoder_backward(Elem* dwte, Elem* dwpe, const Elem* dout, const int32_t* tokens, int B,
                        int T, int C) override {
    cuda::encoder_backward(dwte, dwpe, dout, tokens, B, T, C,
                           launch_.scratch(cuda::encoder_backward_scratch_bytes(B, T, C)),
                           launch_.stream());
  }

 private:
  KernelLaunch& launch_;
};

class CudaBackend final : public ComputeBackend {
 public:
  // On `device` (a cuda device), or on a device of its own (`own_device`).
  explicit CudaBackend(Device& device, std::unique_ptr<Device> own_device = nullptr)
      : owned_device_(std::move(own_device)),
        device_(device),
        stream_(device.create_stream("compute")),
        launch_(cuda_device_index(device),
                static_cast<cudaStream_t>(cuda_stream_handle(*stream_))) {}
  ~CudaBackend() override { cudaStreamSynchronize(launch_.stream()); }

  std::string_view name() const override { return "cuda"; }
  Device& device() override { return device_; }
  Stream& stream() override { return *stream_; }
  bool queues_kernels() const override { return true; }

  Buffer allocate(size_t bytes) override {
    Buffer buffer(device_.allocate(MemorySpace::kDevice, bytes));
    check(cudaMemsetAsync(buffer.as<void>(), 0, bytes, launch_.stream()), "cudaMemsetAsync");
    return buffer;
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, launch_.stream()),
          "copy_from_host");
    synchronize();
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    launch_.to_host(dst, src, bytes);
  }
  void fill_zero(void* dst, size_t bytes) override {
    check(cudaMemsetAsync(dst, 0, bytes, launch_.stream()), "fill_zero");
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, launch_.stream()), "copy");
  }
  void synchronize() override {
    check(cudaStreamSynchronize(launch_.stream()), "cudaStreamSynchronize");
  }

 protected:
  StorageKernels<float>& fp32_kernels() override { return fp32_; }
  StorageKernels<Bf16>& bf16_kernels() override { return bf16_; }

 private:
  std::unique_ptr<Device> owned_device_;  // only for a backend with a device of its own
  Device& device_;
  // Declared after the device: destroyed (and drained) before it.
  std::unique_ptr<Stream> stream_;
  KernelLaunch launch_;
  CudaKernels<float> fp32_{launch_};
  CudaKernels<Bf16> bf16_{launch_};
};

}  // namespace

std::unique_ptr<ComputeBackend> make_cuda_backend(Device& device) {
  return std::make_unique<CudaBackend>(device);
}

std::unique_ptr<ComputeBackend> make_cuda_backend(int device_index) {
  std::string why;
  TANDEM_CHECK(cuda_device_count(&why) > device_index, "cannot use a CUDA GPU: ", why,
               " (without a GPU, tandem runs on the cpu device: device.type = \"cpu\")");
  std::unique_ptr<Device> device = make_cuda_device({.device_index = device_index});
  Device& on = *device;
  return std::make_unique<CudaBackend>(on, std::move(device));
}

}  // namespace tandem
