// GPT-2: token + position embeddings, L pre-LayerNorm blocks (causal self-attention,
// GELU MLP of width 4C), final LayerNorm, LM head tied to the token embedding.
// All compute goes through a ComputeBackend; this file only orchestrates.
//
// Parameters, gradients and activations are stored as fp32 or bf16 (mixed precision:
// fp32 arithmetic everywhere, one rounding per stored result); LayerNorm statistics,
// attention log-sum-exps and losses stay fp32. With bf16 the parameters here are the
// working copy: the fp32 master weights live in the optimizer (offload/update_engine).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "tandem/compute/compute_backend.h"
#include "tandem/model/block_memory.h"
#include "tandem/model/gpt_config.h"
#include "tandem/model/param_layout.h"
#include "tandem/model/param_range.h"

namespace tandem {

// The flat buffers a Gpt allocates for itself. Without them (ZeRO stages 2 and 3) a
// BlockMemory must be given (Gpt::set_block_memory) before forward or backward.
struct GptOwnBuffers {
  bool params = true;
  // Elements of the parameter buffer when more than the parameters (ZeRO gathers the
  // ranks' equal partitions of the padded flat space into it in place); the padding is
  // zero and nothing reads it.
  size_t params_capacity = 0;
  bool grads = true;
};

class Gpt {
 public:
  // Allocates parameters, gradients and activations for batches of up to
  // max_batch x max_seq_len tokens (max_seq_len <= context_length).
  Gpt(const GptConfig& config, ComputeBackend& backend, int max_batch, int max_seq_len,
      StorageDType dtype = StorageDType::kF32, GptOwnBuffers own = {});
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  // The model's blocks in flat order: the embeddings (wte, wpe), each layer, ln_f. Each is
  // contiguous; together they cover the parameters once. Backward completes them from the
  // last to the first (BlockMemory::release_grads, GradientsReady).
  static std::vector<ParamRange> blocks(const GptConfig& config);
  const std::vector<ParamRange>& blocks() const { return blocks_; }
  // Where forward and backward find parameters and put gradients from now on; null: the
  // model's own buffers (which must then have been allocated).
  void set_block_memory(BlockMemory* memory);

  // Bytes of activations (and backward scratch, token ids) the constructor allocates
  // for batches of max_batch x max_seq_len; parameters and gradients add
  // storage_dtype_bytes(dtype) each per parameter on top.
  static size_t activation_bytes(const GptConfig& config, int max_batch, int max_seq_len,
                                 StorageDType dtype = StorageDType::kF32);
  // Everything this model allocated from its backend.
  size_t allocated_bytes() const { return allocated_bytes_; }

  const GptConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  ComputeBackend& backend() const { return backend_; }
  int max_batch() const { return max_batch_; }
  int max_seq_len() const { return max_seq_len_; }
  StorageDType dtype() const { return dtype_; }

  // Flat buffers of layout().num_elements() elements of dtype() in backend memory; null
  // when not allocated (GptOwnBuffers).
  void* params() { return params_.as<void>(); }
  const void* params() const { return params_.as<void>(); }
  void* grads() { return grads_.as<void>(); }
  const void* grads() const { return grads_.as<void>(); }
  // The same, typed; Elem must match dtype() (float for kF32, Bf16 for kBF16).
  template <typename Elem>
  Elem* params_as() {
    check_elem<Elem>();
    return params_.as<Elem>();
  }
  template <typename Elem>
  Elem* grads_as() {
    check_elem<Elem>();
    return grads_.as<Elem>();
  }
  // sum of grads^2 in double, in the backend's fixed order (for the gradient norm).
  double grad_sum_of_squares();

  // Host copies are fp32 whatever dtype() is: set_params rounds, *_to_host widen.
  // GPT-2 initialisation from a seed: weights N(0, 0.02), residual projections
  // (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm weights 1.
  void init_weights(uint64_t seed);
  // The same weights in fp32 on the host, without touching the model's (the fp32
  // master copy when the model stores bf16).
  std::vector<float> initial_params(uint64_t seed) const;
  void set_params(const std::vector<float>& host_params);
  std::vector<float> params_to_host() const;
  std::vector<float> grads_to_host() const;

  // Forward pass over host tokens[B,T] (B <= max_batch, T <= max_seq_len). With
  // targets (host, [B,T]) returns the mean cross-entropy loss and keeps what backward
  // needs; without, computes logits only and returns NaN.
  float forward(const int32_t* tokens, const int32_t* targets, int B, int T);
  // Called during backward with a block's range [begin, end) of the flat gradient buffer
  // as soon as the kernels that finish it are queued on backend().stream() (after
  // BlockMemory::release_grads): ln_f first, then each layer from the last to the first,
  // the embeddings last. The host does not
  // wait for them: a consumer orders its reads after them with an event on that stream,
  // as the update engine does (DeviceBuffers::producer) to offload those gradients
  // while the rest of backward runs.
  using GradientsReady = std::function<void(size_t begin, size_t end)>;

  // Adds d(loss_scale * mean loss)/d(params) to the gradients; needs the forward pass just
  // before it to have had targets. loss_scale = 1/accumulation_steps averages
  // micro-batches. `ready` (optional) is told as ranges of gradients become final.
  void backward(float loss_scale = 1.0f, const GradientsReady& ready = {});
  void zero_grads();

  // Logits of the last forward pass, copied to the host: [B, T, V].
  std::vector<float> logits_to_host() const;

 private:
  template <typename Elem>
  struct LayerParams {
    const Elem *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    const Elem *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
  };
  template <typename Elem>
  struct LayerGrads {
    Elem *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    Elem *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
  };
  // Per-layer activations saved for backward; each points at layer l's slice.
  template <typename Elem>
  struct LayerActs {
    Elem* ln1;
    float *ln1_mean, *ln1_rstd;
    Elem *qkv, *atty;
    float* lse;
    Elem *attproj, *residual2, *ln2;
    float *ln2_mean, *ln2_rstd;
    Elem *fch, *fch_gelu, *fcproj, *residual3;
  };

  // The model's own buffers as a BlockMemory (the default).
  class OwnBlockMemory final : public BlockMemory {
   public:
    explicit OwnBlockMemory(Gpt& model) : model_(model) {}
    const void* acquire_params(int block) override;
    void release_params(int) override {}
    void* acquire_grads(int block) override;
    void release_grads(int) override {}

   private:
    Gpt& model_;
  };

  template <typename Elem>
  void check_elem() const;
  void check_own(const Buffer& buffer, const char* what) const;
  template <typename Elem>
  float forward_as(int B, int T, bool with_targets);
  template <typename Elem>
  void backward_as(float loss_scale, const GradientsReady& ready);
  // Host fp32 <-> backend dtype() copies of n elements.
  void upload(void* dst, const float* host, size_t n);
  std::vector<float> download(const void* src, size_t n) const;

  // Block indices into blocks_.
  int embedding_block() const { return 0; }
  int layer_block(int l) const { return 1 + l; }
  int lnf_block() const { return config_.n_layer + 1; }
  // A block's parameters or gradients through memory_, typed.
  template <typename Elem>
  const Elem* acquire_params_as(int block) {
    return static_cast<const Elem*>(memory_->acquire_params(block));
  }
  template <typename Elem>
  Elem* acquire_grads_as(int block) {
    return static_cast<Elem*>(memory_->acquire_grads(block));
  }
  template <typename Elem>
  LayerActs<Elem> layer_acts(int l) const;

  GptConfig config_;
  ComputeBackend& backend_;
  int max_batch_;
  int max_seq_len_;
  StorageDType dtype_;
  ParamLayout layout_;
  // Offsets within their block, looked up once, by name, at construction: forward and
  // backward only add them to a block's base pointer.
  size_t wte_ = 0, wpe_ = 0, lnfw_ = 0, lnfb_ = 0;
  std::array<size_t, 12> layer_offsets_{};  // in LayerParams order, the same in every layer
  std::vector<ParamRange> blocks_;
  Buffer params_;
  Buffer grads_;
  OwnBlockMemory own_memory_{*this};
  BlockMemory* memory_ = &own_memory_;

  // Activations, sized for max_batch x max_seq_len (BT below), with the L per-layer
  // tensors stacked: e.g. qkv is [L, BT, 3C]. dtype() elements, but the means, rstds,
  // lse and losses, which are fp32.
  Buffer tokens_, targets_;           // [BT] int32
  Buffer encoded_;                    // [BT, C]
  Buffer ln1_, ln1_mean_, ln1_rstd_;  // [L, BT, C], [L, BT], [L, BT]
  Buffer qkv_, atty_, lse_;           // [L, BT, 3C], [L, BT, C], [L, NH, BT]
  Buffer attproj_, residual2_;        // [L, BT, C]
  Buffer ln2_, ln2_mean_, ln2_rstd_;  // [L, BT, C], [L, BT], [L, BT]
  Buffer fch_, fch_gelu_;             // [L, BT, 4C]
  Buffer fcproj_, residual3_;         // [L, BT, C]
  Buffer lnf_, lnf_mean_, lnf_rstd_;  // [BT, C], [BT], [BT]
  Buffer logits_;                     // [BT, V]
  Buffer losses_;                     // [BT]

  // Backward scratch (dtype() elements), reused by every layer.
  Buffer dresidual_;         // [BT, C] gradient flowing down the residual stream
  Buffer dlogits_;           // [BT, V]
  Buffer dbt_c_;             // [BT, C]  dlnf / datty / dln1 / dln2
  Buffer dqkv_;              // [BT, 3C]
  Buffer dfch_, dfch_gelu_;  // [BT, 4C]

  size_t allocated_bytes_ = 0;
  int last_B_ = 0, last_T_ = 0;
  bool have_targets_ = false;
};

}  // namespace tandem
