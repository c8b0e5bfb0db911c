// CudaBackend: device memory, cuBLAS matmuls and the kernels of kernels.cuh, all on one
// CUDA stream. fp32 throughout (full-precision cuBLAS SGEMM, no TF32), so that the
// GPU model can be checked against the CPU one; bf16 comes on top of it.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <vector>

#include "tandem/compute/compute_backend.h"
#include "tandem/compute/cuda/kernels.cuh"
#include "tandem/core/error.h"
#include "tandem/device/cuda/cuda_check.h"
#include "tandem/device/cuda/cuda_device.h"

namespace tandem {
namespace {

void check(cudaError_t err, const char* what) { cuda_check(err, what); }

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuBLAS error ", static_cast<int>(status), " in ", what);
}

constexpr size_t kSquaresBlock = 1 << 14;

class CudaBackend final : public ComputeBackend {
 public:
  explicit CudaBackend(int device_index) : device_index_(device_index) {
    check(cudaSetDevice(device_index_), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cublasCreate(&cublas_), "cublasCreate");
    check(cublasSetStream(cublas_, stream_), "cublasSetStream");
    // Full fp32: TF32 would change results relative to the CPU reference.
    check(cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    scratch_ = Buffer();
    cublasDestroy(cublas_);
    cudaStreamDestroy(stream_);
  }

  std::string_view name() const override { return "cuda"; }

  Buffer allocate(size_t bytes) override {
    void* data = nullptr;
    const cudaError_t err = cudaMalloc(&data, bytes == 0 ? 1 : bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail("GPU out of memory allocating ", bytes, " bytes for the model (",
           cudaGetErrorString(err), "); lower train_micro_batch_size_per_gpu or train.seq_len");
    }
    check(cudaMemsetAsync(data, 0, bytes, stream_), "cudaMemsetAsync");
    return Buffer(data, bytes, this);
  }
  void release(void* data) noexcept override {
    cudaStreamSynchronize(stream_);
    cudaFree(data);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "copy_from_host");
    synchronize();
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy_to_host");
    synchronize();
  }
  void fill_zero(void* dst, size_t bytes) override {
    check(cudaMemsetAsync(dst, 0, bytes, stream_), "fill_zero");
  }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  double sum_of_squares(const float* x, size_t n) override {
    const size_t blocks = (n + kSquaresBlock - 1) / kSquaresBlock;
    float* partial = scratch(blocks * 2);  // doubles
    cuda::sum_of_squares_blocks(reinterpret_cast<double*>(partial), x, n, kSquaresBlock, stream_);
    std::vector<double> host(blocks);
    copy_to_host(host.data(), partial, blocks * sizeof(double));
    double total = 0.0;
    for (double p : host) total += p;
    return total;
  }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) override {
    cuda::encoder_forward(out, tokens, wte, wpe, B, T, C, stream_);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) override {
    cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, stream_);
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC) override {
    // cuBLAS is column-major: a row-major [R, K] array is a column-major [K, R] one. So
    // row-major out[N,OC] = inp[N,C] @ weight[OC,C]^T is column-major
    // out'[OC,N] = weight'[C,OC]^T @ inp'[C,N].
    const float one = 1.0f, zero = 0.0f;
    check(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, weight, C, inp, C, &zero,
                      out, OC),
          "matmul_forward");
    if (bias != nullptr) cuda::add_bias(out, bias, N, OC, stream_);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C,
                         int NH) override {
    cuda::attention_forward(out, lse, qkv, B, T, C, NH, stream_);
  }
  void gelu_forward(float* out, const float* inp, size_t N) override {
    cuda::gelu_forward(out, inp, N, stream_);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t N) override {
    cuda::residual_forward(out, a, b, N, stream_);
  }
  void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                             int V) override {
    cuda::cross_entropy_forward(losses, logits, targets, N, V, stream_);
  }
  void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                              float dloss, int N, int V) override {
    cuda::cross_entropy_backward(dlogits, logits, targets, dloss, N, V, stream_);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC) override {
    const float one = 1.0f, zero = 0.0f;
    // dinp[N,C] = dout[N,OC] @ weight[OC,C]
    check(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C, dout, OC, &zero,
                      dinp, C),
          "matmul_backward (dinp)");
    // dweight[OC,C] += dout^T @ inp
    check(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC, &one,
                      dweight, C),
          "matmul_backward (dweight)");
    if (dbias != nullptr) cuda::column_sums_accumulate(dbias, dout, N, OC, stream_);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, stream_);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, int B, int T, int C, int NH) override {
    float* delta = scratch(static_cast<size_t>(B) * NH * T);
    cuda::attention_backward(dqkv, delta, dout, qkv, out, lse, B, T, C, NH, stream_);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) override {
    cuda::gelu_backward(dinp, inp, dout, N, stream_);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) override {
    cuda::encoder_backward(dwte, dwpe, dout, tokens, B, T, C, stream_);
  }

 private:
  // A scratch buffer of at least `floats` floats, grown on demand (stream-ordered use).
  float* scratch(size_t floats) {
    if (scratch_.bytes() < floats * sizeof(float)) scratch_ = allocate(floats * sizeof(float));
    return scratch_.as<float>();
  }

  int device_index_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  Buffer scratch_;
};

}  // namespace

std::unique_ptr<ComputeBackend> make_cuda_backend(int device_index) {
  std::string why;
  TANDEM_CHECK(cuda_device_count(&why) > device_index, "cannot use a CUDA GPU: ", why,
               " (without a GPU, tandem runs on the cpu device: device.type = \"cpu\")");
  return std::make_unique<CudaBackend>(device_index);
}

}  // namespace tandem
