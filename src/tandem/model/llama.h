// Llama (Hugging Face LlamaForCausalLM): token embedding, L pre-RMSNorm blocks (causal
// self-attention with rotary position embeddings and grouped-query heads, SwiGLU MLP of
// width I), final RMSNorm, LM head (its own, or the embedding with tie_word_embeddings).
// Only its passes and initialisation are here; the rest is Model's.
//
// The Llama family's options (model_config.h) are computed here too, so Mistral, Qwen2 and
// Qwen3 are this class: a head size other than C / NH (head_dim: the attention is NH HS
// wide, o_proj maps it back to C), biases on q, k, v (and o), per-head RMSNorm of q and k
// before the rotation (the projection's output is kept for its backward), scaled rotary
// frequencies (rope_cos_sin).
//
// q_proj, k_proj and v_proj are adjacent in the layout, so together they are one fused
// [(NH + 2 KVH) HS, C] projection and one matmul (their biases likewise one [(NH + 2 KVH)
// HS] bias); gate_proj and up_proj likewise are one [2I, C] projection whose output SwiGLU
// reads as [gate | up].
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/model/host_kept_outputs.h"
#include "tandem/model/model.h"
#include "tandem/model/recompute_segments.h"

namespace tandem {

// Hugging Face LlamaForCausalLM's tensors in its names; blocks: {embed_tokens}, each layer
// model.layers.{l}.*, {model.norm, lm_head (untied only)}.
ParamLayout llama_layout(const ModelConfig& config);

// The rotary inverse frequencies [HS/2], in fp32 as Hugging Face computes them: theta^(-2i/HS),
// then the config's rope_scaling (linear: / factor; llama3: by wavelength band).
std::vector<float> rope_inverse_frequencies(const ModelConfig& config);

// The rotary table for positions 0..T-1: [T, HS/2, 2] (cosine, sine) in fp32, computed as
// Hugging Face's LlamaRotaryEmbedding does (angle t * inverse frequency in fp32).
std::vector<float> rope_cos_sin(const ModelConfig& config, int T);

class Llama final : public Model {
 public:
  Llama(const ModelConfig& config, ComputeBackend& backend, int max_batch, int max_seq_len,
        StorageDType dtype = StorageDType::kF32, ModelOwnBuffers own = {});

  // Bytes of activations, backward scratch and the rotary table the constructor allocates
  // for batches of max_batch x max_seq_len (parameters and gradients not included).
  // `recompute_interval`: ModelOwnBuffers's.
  static size_t activation_bytes(const ModelConfig& config, int max_batch, int max_seq_len,
                                 StorageDType dtype = StorageDType::kF32,
                                 int recompute_interval = 0, bool kept_on_host = false);

  // Hugging Face's initialisation: every weight matrix N(0, 0.02), RMSNorm weights 1.
  TensorInit tensor_init(const ParamView& view) const override;

 private:
  // A layer's tensors: the two norms' weights, the fused qkv, o, the fused gate/up, down;
  // and the options' (null where the config has none): the fused qkv bias, o's bias, the
  // q and k norms' weights.
  template <typename Elem>
  struct LayerParams {
    Elem *ln1w, *qkvw, *attprojw, *ln2w, *gateupw, *downw;
    Elem *qkvb, *attprojb, *qnormw, *knormw;
  };
  // Per-layer activations saved for backward; each points at layer l's slice.
  template <typename Elem>
  struct LayerActs {
    Elem* ln1;
    float* ln1_rstd;
    Elem* qkv_projected;  // with q/k norms: the projection's output (qkv is after the norms)
    float* qk_rstd;       // with q/k norms: [BT, NH + KVH]
    Elem *qkv, *atty;
    float* lse;
    Elem *attproj, *residual2, *ln2;
    float* ln2_rstd;
    Elem *gateup, *swiglu, *down, *residual3;
  };

  float forward_pass(int B, int T, bool with_targets) override;
  void backward_pass(int B, int T, float loss_scale, const GradientsReady& ready) override;
  template <typename Elem>
  float forward_as(int B, int T, bool with_targets);
  template <typename Elem>
  void backward_as(int B, int T, float loss_scale, const GradientsReady& ready);

  int embedding_block() const { return 0; }
  int layer_block(int l) const { return 1 + l; }
  int head_block() const { return config().n_layer + 1; }
  template <typename Elem>
  LayerParams<Elem> layer_at(Elem* base) const;
  // Layer l's activations: its slot of the stacked tensors, its output in the kept outputs
  // when it ends a recompute segment (recompute_segments.h).
  template <typename Elem>
  LayerActs<Elem> layer_acts(int l) const;
  template <typename Elem>
  const Elem* layer_input(int l) const;
  template <typename Elem>
  void forward_layer(int l, int B, int T);
  template <typename Elem>
  void backward_layer(int l, int B, int T, const GradientsReady& ready);
  // The walks over the layer stack (host_kept_outputs.h) call the three above.
  template <typename Elem, typename Family>
  friend void forward_layer_stack(Family& family, int B, int T);
  template <typename Elem, typename Family, typename Ready>
  friend void backward_layer_stack(Family& family, int B, int T, const Ready& ready);

  // Offsets within their block (looked up by name at construction); kAbsent for a tensor
  // the config does not have.
  static constexpr size_t kAbsent = ~size_t{0};
  size_t embed_ = 0, normw_ = 0, lm_head_ = 0;
  size_t ln1w_ = 0, qkvw_ = 0, attprojw_ = 0, ln2w_ = 0, gateupw_ = 0, downw_ = 0;
  size_t qkvb_ = kAbsent, attprojb_ = kAbsent, qnormw_ = kAbsent, knormw_ = kAbsent;
  RecomputeSegments segments_;  // activation checkpointing's slots

  Buffer cos_sin_;  // [max_seq_len, HS/2, 2] fp32
  // Activations for BT = max_batch x max_seq_len, stacked over A slots ([A, BT, ...]: A = L,
  // or min(k, L) with recompute); W = (NH + 2 KVH) HS, Q = NH HS, I = intermediate_size.
  Buffer encoded_;                  // [BT, C]
  Buffer ln1_, ln1_rstd_;           // [A, BT, C], [A, BT]
  Buffer qkv_projected_, qk_rstd_;  // with q/k norms: [A, BT, W], [A, BT, NH + KVH]
  Buffer qkv_, atty_, lse_;         // [A, BT, W], [A, BT, Q], [A, NH, BT]
  Buffer attproj_, residual2_;      // [A, BT, C]
  Buffer ln2_, ln2_rstd_;           // [A, BT, C], [A, BT]
  Buffer gateup_, swiglu_;          // [A, BT, 2I], [A, BT, I]
  Buffer down_, residual3_;         // [A, BT, C]; with recompute residual3 [A - 1, BT, C]
  Buffer kept_;  // with recompute: [ceil(L / k) (2 with kept_on_host), BT, C], segments' outputs
  std::unique_ptr<HostKeptOutputs> host_kept_;  // with kept_on_host: their home
  Buffer lnf_, lnf_rstd_;                       // [BT, C], [BT]
  // Backward scratch, reused by every layer.
  Buffer dresidual_, dbt_c_;  // [BT, C], [BT, max(C, Q)]
  Buffer dqkv_;               // [BT, W]
  Buffer dgateup_, dswiglu_;  // [BT, 2I], [BT, I]
};

}  // namespace tandem
