// GPT-2: token + position embeddings, L pre-LayerNorm blocks (causal self-attention,
// GELU MLP of width 4C), final LayerNorm, LM head tied to the token embedding. Only its
// passes and initialisation are here; the rest is Model's (model/model.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "tandem/model/host_kept_outputs.h"
#include "tandem/model/model.h"
#include "tandem/model/recompute_segments.h"

namespace tandem {

// Hugging Face GPT2LMHeadModel's tensors in its names, one layer's contiguous so that a
// layer's gradients complete together during backward; blocks: {wte, wpe}, each layer
// h.{l}.*, ln_f.*.
ParamLayout gpt2_layout(const ModelConfig &config);

class Gpt final : public Model {
 public:
  // Allocates parameters, gradients and activations for batches of up to
  // max_batch x max_seq_len tokens (max_seq_len <= context_length).
  Gpt(const ModelConfig &config, ComputeBackend &backend, int max_batch, int max_seq_len,
      StorageDType dtype = StorageDType::kF32, ModelOwnBuffers own = {});

  // Bytes of activations (and backward scratch, token ids) the constructor allocates
  // for batches of max_batch x max_seq_len; parameters and gradients add
  // storage_dtype_bytes(dtype) each per parameter on top.
  // `recompute_interval`: ModelOwnBuffers's.
  static size_t activation_bytes(const ModelConfig &config, int max_batch, int max_seq_len,
                                 StorageDType dtype = StorageDType::kF32,
                                 int recompute_interval = 0, bool kept_on_host = false);

  // GPT-2 initialisation from a seed: weights N(0, 0.02), residual projections
  // (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm weights 1.
  TensorInit tensor_init(const ParamView &view) const override;

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
    Elem *ln1;
    float *ln1_mean, *ln1_rstd;
    Elem *qkv, *atty;
    float *lse;
    Elem *attproj, *residual2, *ln2;
    float *ln2_mean, *ln2_rstd;
    Elem *fch, *fch_gelu, *fcproj, *residual3;
  };

  float forward_pass(int B, int T, bool with_targets) override;
  void backward_pass(int B, int T, float loss_scale, const GradientsReady &ready) override;
  template <typename Elem>
  float forward_as(int B, int T, bool with_targets);
  template <typename Elem>
  void backward_as(int B, int T, float loss_scale, const GradientsReady &ready);

  // Block indices into blocks().
  int embedding_block() const { return 0; }
  int layer_block(int l) const { return 1 + l; }
  int lnf_block() const { return config().n_layer + 1; }
  // Layer l's activations: its slot of the stacked tensors (one per layer, or one per
  // layer of a recompute segment), its output in the kept inputs when it ends a segment.
  template <typename Elem>
  LayerActs<Elem> layer_acts(int l) const;
  template <typename Elem>
  const Elem *layer_input(int l) const;
  template <typename Elem>
  void forward_layer(int l, int B, int T);
  template <typename Elem>
  void backward_layer(int l, int B, int T, const GradientsReady &ready);
  // The walks over the layer stack (host_kept_outputs.h) call the three above.
  template <typename Elem, typename Family>
  friend void forward_layer_stack(Family &family, int B, int T);
  template <typename Elem, typename Family, typename Ready>
  friend void backward_layer_stack(Family &family, int B, int T, const Ready &ready);

  // Offsets within their block, looked up once, by name, at construction: forward and
  // backward only add them to a block's base pointer.
  size_t wte_ = 0, wpe_ = 0, lnfw_ = 0, lnfb_ = 0;
  std::array<size_t, 12> layer_offsets_{};  // in LayerParams order, the same in every layer
  RecomputeSegments segments_;  // activation checkpointing's slots (recompute_segments.h)

  // Activations, sized for max_batch x max_seq_len (BT below), with the per-layer tensors
  // stacked over A slots: e.g. qkv is [A, BT, 3C], A = L, or min(k, L) with recompute.
  // dtype() elements, but the means, rstds and lse, which are fp32.
  Buffer encoded_;                    // [BT, C]
  Buffer ln1_, ln1_mean_, ln1_rstd_;  // [A, BT, C], [A, BT], [A, BT]
  Buffer qkv_, atty_, lse_;           // [A, BT, 3C], [A, BT, C], [A, NH, BT]
  Buffer attproj_, residual2_;        // [A, BT, C]
  Buffer ln2_, ln2_mean_, ln2_rstd_;  // [A, BT, C], [A, BT], [A, BT]
  Buffer fch_, fch_gelu_;             // [A, BT, 4C]
  Buffer fcproj_, residual3_;         // [A, BT, C]; with recompute residual3 [A - 1, BT, C]
  Buffer kept_;  // with recompute: [ceil(L / k) (2 with kept_on_host), BT, C], segments' outputs
  std::unique_ptr<HostKeptOutputs> host_kept_;  // with kept_on_host: their home
  Buffer lnf_, lnf_mean_, lnf_rstd_;            // [BT, C], [BT], [BT]

  // Backward scratch (dtype() elements), reused by every layer.
  Buffer dresidual_;         // [BT, C] gradient flowing down the residual stream
  Buffer dbt_c_;             // [BT, C]  dlnf / datty / dln1 / dln2
  Buffer dqkv_;              // [BT, 3C]
  Buffer dfch_, dfch_gelu_;  // [BT, 4C]
};

}  // namespace tandem
