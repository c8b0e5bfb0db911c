// The compute backend: the memory and kernels the model is written against.
//
// The models (model/) never touch memory or math directly; they allocate
// buffers and call kernels through this interface. The CPU backend (compute/cpu/)
// implements it with OpenBLAS and OpenMP; a CUDA backend implements the same
// interface, so adding a backend changes neither the model nor the trainer.
//
// Conventions for every kernel:
// - All pointers are in the backend's memory (from allocate()), except where a
//   parameter is documented as host memory.
// - Tensors are dense row-major; shapes are given in comments as [dim0, dim1, ...].
// - Parameter gradients (dweight, dbias, dwte, dwpe) are accumulated (+=), so that
//   micro-batches add up. Activation gradients are overwritten (=) unless the kernel
//   says "accumulates".
// - Results are deterministic: the same inputs give the same bits on every run and
//   every thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "tandem/core/enum_names.h"
#include "tandem/core/half.h"
#include "tandem/device/device.h"

namespace tandem {

// Memory a backend allocated from its device, released on destruction.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(DeviceAllocation allocation) : allocation_(std::move(allocation)) {}

  template <typename T>
  T* as() const {
    return allocation_.as<T>();
  }
  size_t bytes() const { return allocation_.bytes(); }

 private:
  DeviceAllocation allocation_;
};

// How a model stores its parameters, gradients and activations. Every kernel computes
// in fp32 whatever the storage; with kBF16 each result is rounded once, when stored.
// LayerNorm statistics, attention log-sum-exps and losses are always fp32.
enum class StorageDType { kF32, kBF16 };

inline constexpr EnumName<StorageDType> kStorageDTypeNames[] = {{StorageDType::kF32, "fp32"},
                                                                {StorageDType::kBF16, "bf16"}};
constexpr std::string_view storage_dtype_name(StorageDType dtype) {
  return enum_name(kStorageDTypeNames, dtype);
}
size_t storage_dtype_bytes(StorageDType dtype);

// The kernels for tensors stored as Elem (float or Bf16). Every ComputeBackend has both
// sets (ComputeBackend::kernels<Elem>()); the model picks one by its storage type.
template <typename Elem>
class StorageKernels {
 public:
  virtual ~StorageKernels() = default;

  // ---- reductions -------------------------------------------------------------
  // sum of x[i]^2 in double (for the global gradient norm), in an order fixed by the
  // backend: the same bits on every call for the same data.
  virtual double sum_of_squares(const Elem* x, size_t n) = 0;
  // Its first stage alone: partials[k] (host memory, ceil(n / 16384) doubles) = the sum of
  // the squares of x[16384 k, 16384 (k + 1)), summed in the backend's order within a block;
  // sum_of_squares(x, n) is sum_in_order (compute/cpu/sum_of_squares.h) of all of them, on every
  // backend. So a piece of a buffer that starts on a block boundary (a ZeRO partition)
  // gets the buffer's own block sums, and gathered in order they give its norm's bits.
  virtual void sum_of_squares_blocks(const Elem* x, size_t n, double* partials) = 0;

  // ---- forward kernels ------------------------------------------------------
  // out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :]; wpe null: no position embedding (Llama).
  virtual void encoder_forward(Elem* out, const int32_t* tokens, const Elem* wte, const Elem* wpe,
                               int B, int T, int C) = 0;
  // out[N,C] = (inp - mean) * rstd * weight + bias, per row; saves mean[N], rstd[N].
  virtual void layernorm_forward(Elem* out, float* mean, float* rstd, const Elem* inp,
                                 const Elem* weight, const Elem* bias, int N, int C) = 0;
  // out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC]; bias may be null. fp32
  // accumulation.
  virtual void matmul_forward(Elem* out, const Elem* inp, const Elem* weight, const Elem* bias,
                              int N, int C, int OC) = 0;
  // Causal multi-head attention with grouped-query heads. qkv[B,T,(NH+2KVH)*HS] holds NH
  // query heads, then KVH key heads, then KVH value heads, HS columns each; query head h
  // attends with key/value head h / (NH/KVH) (KVH divides NH; KVH = NH is multi-head
  // attention, GPT-2's). out[B,T,NH*HS] = softmax(q k^T / sqrt(HS)) v per head;
  // lse[B,NH,T] saves each softmax row's log-sum-exp so the backward pass can recompute
  // probabilities without a stored T x T matrix.
  virtual void attention_forward(Elem* out, float* lse, const Elem* qkv, int B, int T, int NH,
                                 int KVH, int HS) = 0;
  // out[N,C] = inp * rstd * weight per row, rstd = 1 / sqrt(mean(inp^2) + eps) (Llama's
  // RMSNorm); saves rstd[N].
  virtual void rmsnorm_forward(Elem* out, float* rstd, const Elem* inp, const Elem* weight,
                               float eps, int N, int C) = 0;
  // Rotary position embedding in place on the NH query and KVH key heads of qkv (laid out
  // as for attention_forward; the value heads are untouched), Hugging Face's rotate-half
  // form: for i < HS/2, (x[i], x[i + HS/2]) at position t turns by the angle whose cosine
  // and sine are cos_sin[t, i, 0..1] (host-computed, fp32, [T, HS/2, 2]).
  // RMSNorm of each of H heads of HS columns in each of N rows of row_stride columns (Qwen3's
  // q and k norms, on the query or the key heads of qkv): out[n, h HS + c] = inp[n, h HS +
  // c] * rstd[n, h] * weight[c], rstd = 1 / sqrt(mean over the head's HS columns of inp^2 +
  // eps); saves rstd[N, H]. Columns past H * HS of each row are left alone.
  virtual void head_rmsnorm_forward(Elem* out, float* rstd, const Elem* inp, const Elem* weight,
                                    float eps, int N, int H, int HS, int row_stride) = 0;
  virtual void rope_forward(Elem* qkv, const float* cos_sin, int B, int T, int NH, int KVH,
                            int HS) = 0;
  // out[N,I] = silu(inp[n, :I]) * inp[n, I:] for inp[N,2I] = [gate | up] per row (SwiGLU).
  virtual void swiglu_forward(Elem* out, const Elem* inp, int N, int I) = 0;
  // out[N] = GELU(inp[N]), tanh approximation (GPT-2's gelu_new).
  virtual void gelu_forward(Elem* out, const Elem* inp, size_t N) = 0;
  // out[N] = a[N] + b[N]
  virtual void residual_forward(Elem* out, const Elem* a, const Elem* b, size_t N) = 0;
  // losses[N] = logsumexp(logits[n, :]) - logits[n, targets[n]]; logits[N,V]. A negative
  // target (kIgnoredTarget: a position the loss does not count) has loss 0 here and a zero
  // gradient row in cross_entropy_backward.
  virtual void cross_entropy_forward(float* losses, const Elem* logits, const int32_t* targets,
                                     int N, int V) = 0;

  // ---- backward kernels -----------------------------------------------------
  // dlogits[N,V] = dloss * (softmax(logits[n, :]) - onehot(targets[n]))
  virtual void cross_entropy_backward(Elem* dlogits, const Elem* logits, const int32_t* targets,
                                      float dloss, int N, int V) = 0;
  // dinp[N,C] = dout[N,OC] @ weight[OC,C]; dweight[OC,C] += dout^T @ inp;
  // dbias[OC] += sum over rows of dout (dbias may be null).
  virtual void matmul_backward(Elem* dinp, Elem* dweight, Elem* dbias, const Elem* dout,
                               const Elem* inp, const Elem* weight, int N, int C, int OC) = 0;
  // Accumulates: dinp[N,C] += d(layernorm)/d(inp); dweight[C] +=; dbias[C] +=.
  virtual void layernorm_backward(Elem* dinp, Elem* dweight, Elem* dbias, const Elem* dout,
                                  const Elem* inp, const Elem* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;
  // dqkv[B,T,(NH+2KVH)*HS] from dout[B,T,NH*HS], recomputing probabilities from qkv and
  // lse; a key/value head's gradient sums its NH/KVH query heads'.
  virtual void attention_backward(Elem* dqkv, const Elem* dout, const Elem* qkv, const Elem* out,
                                  const float* lse, int B, int T, int NH, int KVH, int HS) = 0;
  // Accumulates: dinp[N,C] += d(rmsnorm)/d(inp); dweight[C] +=.
  virtual void rmsnorm_backward(Elem* dinp, Elem* dweight, const Elem* dout, const Elem* inp,
                                const Elem* weight, const float* rstd, int N, int C) = 0;
  // dinp = d(head_rmsnorm)/d(inp) * dout over the heads (overwritten, not accumulated;
  // dinp may be dout: in place); dweight[HS] += over every row and head.
  virtual void head_rmsnorm_backward(Elem* dinp, Elem* dweight, const Elem* dout, const Elem* inp,
                                     const Elem* weight, const float* rstd, int N, int H, int HS,
                                     int row_stride) = 0;
  // The inverse rotation of rope_forward, in place on the query and key heads' gradients.
  virtual void rope_backward(Elem* dqkv, const float* cos_sin, int B, int T, int NH, int KVH,
                             int HS) = 0;
  // dinp[N,2I] = d(swiglu)/d(gate, up) * dout[N,I].
  virtual void swiglu_backward(Elem* dinp, const Elem* inp, const Elem* dout, int N, int I) = 0;
  // dinp[N] = GELU'(inp) * dout
  virtual void gelu_backward(Elem* dinp, const Elem* inp, const Elem* dout, size_t N) = 0;
  // dwte[V,C] += scatter of dout[B,T,C] by token; dwpe[maxT,C] += sum over the batch (dwpe
  // null: no position embedding).
  virtual void encoder_backward(Elem* dwte, Elem* dwpe, const Elem* dout, const int32_t* tokens,
                                int B, int T, int C) = 0;
};

// A backend: its device memory, its stream, and a set of kernels per storage type.
class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  virtual std::string_view name() const = 0;

  // The device whose memory the backend's tensors live in (so that they count against
  // its capacity, beside the optimizer state), and the stream of that device its
  // kernels run on, in order. Work queued on other streams of the device orders itself
  // after the kernels with an event recorded on stream().
  virtual Device& device() = 0;
  virtual Stream& stream() = 0;
  // Whether the kernels are queued on stream() (a GPU's), or run as they are called (the
  // CPU's): work of another stream that they must wait for is waited for by the host then.
  virtual bool queues_kernels() const = 0;

  // ---- memory ---------------------------------------------------------------
  // Zero-initialised device memory, 64-byte aligned. Throws DeviceOutOfMemory beyond the
  // device's capacity.
  virtual Buffer allocate(size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // dst = src, both in backend memory, in order with the kernels.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Waits for all queued work (a no-op for synchronous backends).
  virtual void synchronize() = 0;

  // ---- kernels --------------------------------------------------------------
  // The kernels for tensors stored as Elem (float or Bf16), on stream():
  // `backend.kernels<Bf16>().gelu_forward(...)`. A backend writes each kernel once, in a
  // class template over Elem (CpuKernels, CudaKernels), and holds one of each.
  template <typename Elem>
  StorageKernels<Elem>& kernels();

 protected:
  virtual StorageKernels<float>& fp32_kernels() = 0;
  virtual StorageKernels<Bf16>& bf16_kernels() = 0;
};

template <>
inline StorageKernels<float>& ComputeBackend::kernels<float>() {
  return fp32_kernels();
}
template <>
inline StorageKernels<Bf16>& ComputeBackend::kernels<Bf16>() {
  return bf16_kernels();
}

// The host backend: OpenBLAS matmuls, OpenMP loops, on a `cpu` device (device.h), whose
// arena holds its tensors. Kernels run on the calling thread: when a call returns its
// results are written. Its Bf16 kernels widen their inputs to fp32, run the fp32
// kernels and round what they store: slow, but the same storage rounding as a GPU's,
// so the bf16 model can be tested without one.
std::unique_ptr<ComputeBackend> make_cpu_backend(Device& device);
// The same on a device of its own without a capacity limit (tests, tools).
std::unique_ptr<ComputeBackend> make_cpu_backend();

// The CUDA backend (fp32 and bf16 kernels, cuBLASLt matmuls) on a `cuda` device
// (device/cuda/cuda_device.h), asynchronous on a stream of that device. Throws
// tandem::Error, saying why, when tandem was built without CUDA or there is no GPU.
std::unique_ptr<ComputeBackend> make_cuda_backend(Device& device);
// The same on a device of its own with all of GPU `device_index`'s free memory.
std::unique_ptr<ComputeBackend> make_cuda_backend(int device_index = 0);

}  // namespace tandem
