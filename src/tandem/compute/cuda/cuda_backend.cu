// CudaBackend: device memory, cuBLASLt matmuls (cublaslt_matmul.cuh), flash attention
// (flash_attention.cuh) and the kernels of kernels.cuh, all on one CUDA stream.
//
// Both storage types: every kernel exists for tensors stored as float and as Bf16, and
// each override below forwards to one template, so the two sets cannot drift apart.
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

class CudaBackend final : public ComputeBackend {
 public:
  // On `device` (a cuda device), or on a device of its own (`own_device`).
  explicit CudaBackend(Device& device, std::unique_ptr<Device> own_device = nullptr)
      : owned_device_(std::move(own_device)),
        device_(device),
        stream_(device.create_stream("compute")),
        cuda_stream_(static_cast<cudaStream_t>(cuda_stream_handle(*stream_))) {
    check(cudaSetDevice(cuda_device_index(device)), "cudaSetDevice");
    matmul_ = std::make_unique<cuda::CublasLtMatmul>(cuda_stream_);
  }
  ~CudaBackend() override { cudaStreamSynchronize(cuda_stream_); }

  std::string_view name() const override { return "cuda"; }
  Device& device() override { return device_; }
  Stream& stream() override { return *stream_; }

  Buffer allocate(size_t bytes) override {
    Buffer buffer(device_.allocate(MemorySpace::kDevice, bytes));
    check(cudaMemsetAsync(buffer.as<void>(), 0, bytes, cuda_stream_), "cudaMemsetAsync");
    return buffer;
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_stream_), "copy_from_host");
    synchronize();
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream_), "copy_to_host");
    synchronize();
  }
  void fill_zero(void* dst, size_t bytes) override {
    check(cudaMemsetAsync(dst, 0, bytes, cuda_stream_), "fill_zero");
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream_), "copy");
  }
  void synchronize() override {
    check(cudaStreamSynchronize(cuda_stream_), "cudaStreamSynchronize");
  }

  // ---- StorageKernels<float> and StorageKernels<Bf16> -----------------------------------

  double sum_of_squares(const float* x, size_t n) override { return squares(x, n); }
  double sum_of_squares(const Bf16* x, size_t n) override { return squares(x, n); }
  void sum_of_squares_blocks(const float* x, size_t n, double* partials) override {
    squares_blocks(x, n, partials);
  }
  void sum_of_squares_blocks(const Bf16* x, size_t n, double* partials) override {
    squares_blocks(x, n, partials);
  }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) override {
    cuda::encoder_forward(out, tokens, wte, wpe, B, T, C, cuda_stream_);
  }
  void encoder_forward(Bf16* out, const int32_t* tokens, const Bf16* wte, const Bf16* wpe, int B,
                       int T, int C) override {
    cuda::encoder_forward(out, tokens, wte, wpe, B, T, C, cuda_stream_);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) override {
    cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, cuda_stream_);
  }
  void layernorm_forward(Bf16* out, float* mean, float* rstd, const Bf16* inp, const Bf16* weight,
                         const Bf16* bias, int N, int C) override {
    cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, cuda_stream_);
  }

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC) override {
    matmul_->forward(out, inp, weight, bias, N, C, OC);
  }
  void matmul_forward(Bf16* out, const Bf16* inp, const Bf16* weight, const Bf16* bias, int N,
                      int C, int OC) override {
    matmul_->forward(out, inp, weight, bias, N, C, OC);
  }

  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int KVH,
                         int HS) override {
    cuda::flash_attention_forward<float>(out, lse, qkv, B, T, NH * HS, NH, KVH, cuda_stream_);
  }
  void attention_forward(Bf16* out, float* lse, const Bf16* qkv, int B, int T, int NH, int KVH,
                         int HS) override {
    cuda::flash_attention_forward<Bf16>(out, lse, qkv, B, T, NH * HS, NH, KVH, cuda_stream_);
  }

  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, float eps,
                       int N, int C) override {
    cuda::rmsnorm_forward(out, rstd, inp, weight, eps, N, C, cuda_stream_);
  }
  void rmsnorm_forward(Bf16* out, float* rstd, const Bf16* inp, const Bf16* weight, float eps,
                       int N, int C) override {
    cuda::rmsnorm_forward(out, rstd, inp, weight, eps, N, C, cuda_stream_);
  }

  void rope_forward(float* qkv, const float* cos_sin, int B, int T, int NH, int KVH,
                    int HS) override {
    cuda::rope_forward(qkv, cos_sin, B, T, NH, KVH, HS, cuda_stream_);
  }
  void rope_forward(Bf16* qkv, const float* cos_sin, int B, int T, int NH, int KVH,
                    int HS) override {
    cuda::rope_forward(qkv, cos_sin, B, T, NH, KVH, HS, cuda_stream_);
  }

  void swiglu_forward(float* out, const float* inp, int N, int I) override {
    cuda::swiglu_forward(out, inp, N, I, cuda_stream_);
  }
  void swiglu_forward(Bf16* out, const Bf16* inp, int N, int I) override {
    cuda::swiglu_forward(out, inp, N, I, cuda_stream_);
  }

  void gelu_forward(float* out, const float* inp, size_t N) override {
    cuda::gelu_forward(out, inp, N, cuda_stream_);
  }
  void gelu_forward(Bf16* out, const Bf16* inp, size_t N) override {
    cuda::gelu_forward(out, inp, N, cuda_stream_);
  }

  void residual_forward(float* out, const float* a, const float* b, size_t N) override {
    cuda::residual_forward(out, a, b, N, cuda_stream_);
  }
  void residual_forward(Bf16* out, const Bf16* a, const Bf16* b, size_t N) override {
    cuda::residual_forward(out, a, b, N, cuda_stream_);
  }

  void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                             int V) override {
    cuda::cross_entropy_forward(losses, logits, targets, N, V, cuda_stream_);
  }
  void cross_entropy_forward(float* losses, const Bf16* logits, const int32_t* targets, int N,
                             int V) override {
    cuda::cross_entropy_forward(losses, logits, targets, N, V, cuda_stream_);
  }

  void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                              float dloss, int N, int V) override {
    cuda::cross_entropy_backward(dlogits, logits, targets, dloss, N, V, cuda_stream_);
  }
  void cross_entropy_backward(Bf16* dlogits, const Bf16* logits, const int32_t* targets,
                              float dloss, int N, int V) override {
    cuda::cross_entropy_backward(dlogits, logits, targets, dloss, N, V, cuda_stream_);
  }

  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC) override {
    matmul_backward_impl(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void matmul_backward(Bf16* dinp, Bf16* dweight, Bf16* dbias, const Bf16* dout, const Bf16* inp,
                       const Bf16* weight, int N, int C, int OC) override {
    matmul_backward_impl(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }

  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    layernorm_backward_impl(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void layernorm_backward(Bf16* dinp, Bf16* dweight, Bf16* dbias, const Bf16* dout, const Bf16* inp,
                          const Bf16* weight, const float* mean, const float* rstd, int N,
                          int C) override {
    layernorm_backward_impl(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }

  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, int B, int T, int NH, int KVH, int HS) override {
    attention_backward_impl(dqkv, dout, qkv, out, lse, B, T, NH * HS, NH, KVH);
  }
  void attention_backward(Bf16* dqkv, const Bf16* dout, const Bf16* qkv, const Bf16* out,
                          const float* lse, int B, int T, int NH, int KVH, int HS) override {
    attention_backward_impl(dqkv, dout, qkv, out, lse, B, T, NH * HS, NH, KVH);
  }

  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, const float* rstd, int N, int C) override {
    rmsnorm_backward_impl(dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void rmsnorm_backward(Bf16* dinp, Bf16* dweight, const Bf16* dout, const Bf16* inp,
                        const Bf16* weight, const float* rstd, int N, int C) override {
    rmsnorm_backward_impl(dinp, dweight, dout, inp, weight, rstd, N, C);
  }

  void rope_backward(float* dqkv, const float* cos_sin, int B, int T, int NH, int KVH,
                     int HS) override {
    cuda::rope_backward(dqkv, cos_sin, B, T, NH, KVH, HS, cuda_stream_);
  }
  void rope_backward(Bf16* dqkv, const float* cos_sin, int B, int T, int NH, int KVH,
                     int HS) override {
    cuda::rope_backward(dqkv, cos_sin, B, T, NH, KVH, HS, cuda_stream_);
  }

  void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int I) override {
    cuda::swiglu_backward(dinp, inp, dout, N, I, cuda_stream_);
  }
  void swiglu_backward(Bf16* dinp, const Bf16* inp, const Bf16* dout, int N, int I) override {
    cuda::swiglu_backward(dinp, inp, dout, N, I, cuda_stream_);
  }

  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) override {
    cuda::gelu_backward(dinp, inp, dout, N, cuda_stream_);
  }
  void gelu_backward(Bf16* dinp, const Bf16* inp, const Bf16* dout, size_t N) override {
    cuda::gelu_backward(dinp, inp, dout, N, cuda_stream_);
  }

  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) override {
    encoder_backward_impl(dwte, dwpe, dout, tokens, B, T, C);
  }
  void encoder_backward(Bf16* dwte, Bf16* dwpe, const Bf16* dout, const int32_t* tokens, int B,
                        int T, int C) override {
    encoder_backward_impl(dwte, dwpe, dout, tokens, B, T, C);
  }

 private:
  // The kernels that need scratch memory or more than one call, once for both types.

  template <typename Elem>
  void squares_blocks(const Elem* x, size_t n, double* host_partials) {
    const size_t bytes = cuda::sum_of_squares_scratch_bytes(n);
    if (bytes == 0) return;
    auto* partials = reinterpret_cast<double*>(scratch(bytes));
    cuda::sum_of_squares_blocks(partials, x, n, cuda_stream_);
    copy_to_host(host_partials, partials, bytes);
  }

  template <typename Elem>
  double squares(const Elem* x, size_t n) {
    char* base = scratch(kSquaresResultBytes + cuda::sum_of_squares_scratch_bytes(n));
    auto* result = reinterpret_cast<double*>(base);
    cuda::sum_of_squares(result, x, n, base + kSquaresResultBytes, cuda_stream_);
    double total = 0.0;
    copy_to_host(&total, result, sizeof(total));
    return total;
  }

  template <typename Elem>
  void matmul_backward_impl(Elem* dinp, Elem* dweight, Elem* dbias, const Elem* dout,
                            const Elem* inp, const Elem* weight, int N, int C, int OC) {
    matmul_->backward_input(dinp, dout, weight, N, C, OC);
    matmul_->backward_weight(dweight, dout, inp, N, C, OC);
    if (dbias != nullptr)
      cuda::column_sums_accumulate(dbias, dout, N, OC,
                                   scratch(cuda::column_sums_scratch_bytes(N, OC)), cuda_stream_);
  }

  template <typename Elem>
  void layernorm_backward_impl(Elem* dinp, Elem* dweight, Elem* dbias, const Elem* dout,
                               const Elem* inp, const Elem* weight, const float* mean,
                               const float* rstd, int N, int C) {
    cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                             scratch(cuda::layernorm_backward_scratch_bytes(N, C)), cuda_stream_);
  }

  template <typename Elem>
  void rmsnorm_backward_impl(Elem* dinp, Elem* dweight, const Elem* dout, const Elem* inp,
                             const Elem* weight, const float* rstd, int N, int C) {
    cuda::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C,
                           scratch(cuda::rmsnorm_backward_scratch_bytes(N, C)), cuda_stream_);
  }

  template <typename Elem>
  void attention_backward_impl(Elem* dqkv, const Elem* dout, const Elem* qkv, const Elem* out,
                               const float* lse, int B, int T, int C, int NH, int KVH) {
    const size_t bytes = cuda::flash_attention_backward_scratch_bytes<Elem>(B, T, C, NH, KVH);
    cuda::flash_attention_backward<Elem>(dqkv, scratch(bytes), bytes, dout, qkv, out, lse, B, T, C,
                                         NH, KVH, cuda_stream_);
  }

  template <typename Elem>
  void encoder_backward_impl(Elem* dwte, Elem* dwpe, const Elem* dout, const int32_t* tokens, int B,
                             int T, int C) {
    cuda::encoder_backward(dwte, dwpe, dout, tokens, B, T, C,
                           scratch(cuda::encoder_backward_scratch_bytes(B, T, C)), cuda_stream_);
  }

  // Device scratch of at least `bytes` (256-byte aligned: cudaMalloc's), grown on
  // demand. Kernels use it in stream order, so one buffer serves them all.
  char* scratch(size_t bytes) { return scratch_.get(bytes, cuda_stream_); }

  std::unique_ptr<Device> owned_device_;  // only for a backend with a device of its own
  Device& device_;
  // Declared after the device: destroyed (and drained) before it.
  std::unique_ptr<Stream> stream_;
  cudaStream_t cuda_stream_;
  std::unique_ptr<cuda::CublasLtMatmul> matmul_;
  ScratchMemory scratch_;
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
