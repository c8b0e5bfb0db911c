#include "tandem/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "tandem/core/error.h"

namespace tandem {

namespace {

// A block's tensors, in the order of Gpt::LayerParams and Gpt::LayerGrads.
constexpr const char* kLayerTensors[12] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

// The 12 pointers base + offset[i], as LayerParams or LayerGrads.
template <typename Layer, typename Pointer>
Layer layer_at(Pointer base, const std::array<size_t, 12>& o) {
  return {base + o[0], base + o[1], base + o[2], base + o[3], base + o[4],  base + o[5],
          base + o[6], base + o[7], base + o[8], base + o[9], base + o[10], base + o[11]};
}

std::string layer_prefix(int l) { return "transformer.h." + std::to_string(l) + "."; }

}  // namespace

ParamLayout gpt2_layout(const ModelConfig& config) {
  const int64_t V = config.vocab_size, maxT = config.context_length, C = config.n_embd;
  ParamLayout layout;
  layout.begin_block();
  layout.add("transformer.wte.weight", {V, C}, true);
  layout.add("transformer.wpe.weight", {maxT, C}, true);
  for (int l = 0; l < config.n_layer; l++) {
    const std::string p = layer_prefix(l);
    layout.begin_block();
    layout.add(p + "ln_1.weight", {C}, false);
    layout.add(p + "ln_1.bias", {C}, false);
    layout.add(p + "attn.c_attn.weight", {3 * C, C}, true, true);
    layout.add(p + "attn.c_attn.bias", {3 * C}, false);
    layout.add(p + "attn.c_proj.weight", {C, C}, true, true);
    layout.add(p + "attn.c_proj.bias", {C}, false);
    layout.add(p + "ln_2.weight", {C}, false);
    layout.add(p + "ln_2.bias", {C}, false);
    layout.add(p + "mlp.c_fc.weight", {4 * C, C}, true, true);
    layout.add(p + "mlp.c_fc.bias", {4 * C}, false);
    layout.add(p + "mlp.c_proj.weight", {C, 4 * C}, true, true);
    layout.add(p + "mlp.c_proj.bias", {C}, false);
  }
  layout.begin_block();
  layout.add("transformer.ln_f.weight", {C}, false);
  layout.add("transformer.ln_f.bias", {C}, false);
  return layout;
}

Gpt::Gpt(const ModelConfig& config, ComputeBackend& backend, int max_batch, int max_seq_len,
         StorageDType dtype, ModelOwnBuffers own)
    : Model(config, backend, max_batch, max_seq_len, dtype, gpt2_layout(config), own),
      segments_{.layers = config.n_layer,
                .interval = own.recompute_interval,
                .kept_on_host = own.recompute_kept_on_host} {
  TANDEM_CHECK(config.type == ModelType::kGpt2, "Gpt needs a GPT-2 config, got model.type ",
               model_type_name(config.type));
  TANDEM_CHECK(segments_.interval >= 0, "recompute interval ", segments_.interval,
               ": must be 0 (off) or a number of layers");
  TANDEM_CHECK(!segments_.kept_on_host || segments_.recomputes(),
               "kept outputs on the host need a recompute interval");
  wte_ = offset_in_block("transformer.wte.weight", embedding_block());
  wpe_ = offset_in_block("transformer.wpe.weight", embedding_block());
  lnfw_ = offset_in_block("transformer.ln_f.weight", lnf_block());
  lnfb_ = offset_in_block("transformer.ln_f.bias", lnf_block());
  for (int l = 0; l < config.n_layer; l++) {
    for (size_t i = 0; i < layer_offsets_.size(); i++) {
      const size_t offset = offset_in_block(layer_prefix(l) + kLayerTensors[i], layer_block(l));
      TANDEM_CHECK(l == 0 || offset == layer_offsets_[i],
                   "GPT-2 layers must share one layout within the block");
      layer_offsets_[i] = offset;
    }
  }
  const size_t L = segments_.slots();
  const size_t C = config.n_embd, NH = config.n_head;
  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  auto elems = [&](size_t n) { return allocate_elems(n); };
  auto floats = [&](size_t n) { return allocate_floats(n); };
  encoded_ = elems(BT * C);
  ln1_ = elems(L * BT * C);
  ln1_mean_ = floats(L * BT);
  ln1_rstd_ = floats(L * BT);
  qkv_ = elems(L * BT * 3 * C);
  atty_ = elems(L * BT * C);
  lse_ = floats(L * NH * BT);
  attproj_ = elems(L * BT * C);
  residual2_ = elems(L * BT * C);
  ln2_ = elems(L * BT * C);
  ln2_mean_ = floats(L * BT);
  ln2_rstd_ = floats(L * BT);
  fch_ = elems(L * BT * 4 * C);
  fch_gelu_ = elems(L * BT * 4 * C);
  fcproj_ = elems(L * BT * C);
  // None at all where recompute leaves no slot (k = 1) or keeps nothing (off).
  auto elems_or_none = [&](size_t n) { return n > 0 ? elems(n) : Buffer(); };
  residual3_ = elems_or_none(segments_.output_slots() * BT * C);
  kept_ = elems_or_none(segments_.kept_rows() * BT * C);
  if (segments_.kept_on_host)
    host_kept_ = std::make_unique<HostKeptOutputs>(backend, segments_.kept_outputs(),
                                                   BT * C * storage_dtype_bytes(dtype));
  lnf_ = elems(BT * C);
  lnf_mean_ = floats(BT);
  lnf_rstd_ = floats(BT);

  dresidual_ = elems(BT * C);
  dbt_c_ = elems(BT * C);
  dqkv_ = elems(BT * 3 * C);
  dfch_ = elems(BT * 4 * C);
  dfch_gelu_ = elems(BT * 4 * C);
}

size_t Gpt::activation_bytes(const ModelConfig& config, int max_batch, int max_seq_len,
                             StorageDType dtype, int recompute_interval, bool kept_on_host) {
  const RecomputeSegments segments{
      .layers = config.n_layer, .interval = recompute_interval, .kept_on_host = kept_on_host};
  const size_t L = segments.slots();
  const size_t C = config.n_embd, NH = config.n_head;
  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  // Elements stored as dtype ...
  const size_t per_layer_elems =
      BT * (C /*ln1*/ + 3 * C /*qkv*/ + C /*atty*/ + C /*attproj*/ + C /*residual2*/ + C /*ln2*/ +
            4 * C /*fch*/ + 4 * C /*fch_gelu*/ + C /*fcproj*/);
  const size_t residual3_elems = BT * C * (segments.output_slots() + segments.kept_rows());
  const size_t once_elems = BT * (C /*encoded*/ + C /*lnf*/) + residual3_elems;
  const size_t backward_elems =
      BT * (C /*dresidual*/ + C /*dbt_c*/ + 3 * C /*dqkv*/ + 8 * C /*dfch, dfch_gelu*/);
  // ... and as fp32.
  const size_t per_layer_floats = BT * (4 /*ln1, ln2 mean and rstd*/ + NH /*lse*/);
  const size_t once_floats = BT * 2 /*lnf mean, rstd*/;
  return (L * per_layer_elems + once_elems + backward_elems) * storage_dtype_bytes(dtype) +
         (L * per_layer_floats + once_floats) * sizeof(float) + head_bytes(config, BT, dtype);
}

template <typename Elem>
Gpt::LayerActs<Elem> Gpt::layer_acts(int l) const {
  const size_t C = config().n_embd, NH = config().n_head;
  const size_t BT = static_cast<size_t>(max_batch()) * max_seq_len();
  const size_t row = segments_.slot(l) * BT;  // first row of the slot in [A, BT, ...]
  Elem* residual3 = segments_.output_of(l, residual3_.as<Elem>(), kept_.as<Elem>(), BT * C);
  return {ln1_.as<Elem>() + row * C,
          ln1_mean_.as<float>() + row,
          ln1_rstd_.as<float>() + row,
          qkv_.as<Elem>() + row * 3 * C,
          atty_.as<Elem>() + row * C,
          lse_.as<float>() + row * NH,
          attproj_.as<Elem>() + row * C,
          residual2_.as<Elem>() + row * C,
          ln2_.as<Elem>() + row * C,
          ln2_mean_.as<float>() + row,
          ln2_rstd_.as<float>() + row,
          fch_.as<Elem>() + row * 4 * C,
          fch_gelu_.as<Elem>() + row * 4 * C,
          fcproj_.as<Elem>() + row * C,
          residual3};
}

template <typename Elem>
const Elem* Gpt::layer_input(int l) const {
  return l == 0 ? encoded_.as<Elem>() : layer_acts<Elem>(l - 1).residual3;
}

Model::TensorInit Gpt::tensor_init(const ParamView& view) const {
  const bool is_layernorm_weight =
      view.name.find(".ln_") != std::string::npos && view.name.ends_with(".weight");
  if (is_layernorm_weight) return {.kind = TensorInit::Kind::kOnes};
  if (view.shape.size() != 2) return {.kind = TensorInit::Kind::kZeros};  // biases
  const bool residual_projection = view.name.ends_with("c_proj.weight");
  const float residual_std = 0.02f / std::sqrt(2.0f * config().n_layer);
  return {.kind = TensorInit::Kind::kNormal, .std = residual_projection ? residual_std : 0.02f};
}

float Gpt::forward_pass(int B, int T, bool with_targets) {
  return dtype() == StorageDType::kBF16 ? forward_as<Bf16>(B, T, with_targets)
                                        : forward_as<float>(B, T, with_targets);
}

void Gpt::backward_pass(int B, int T, float loss_scale, const GradientsReady& ready) {
  if (dtype() == StorageDType::kBF16)
    backward_as<Bf16>(B, T, loss_scale, ready);
  else
    backward_as<float>(B, T, loss_scale, ready);
}

template <typename Elem>
float Gpt::forward_as(int B, int T, bool with_targets) {
  const int C = config().n_embd, V = config().vocab_size;
  const int N = B * T;
  StorageKernels<Elem>& k = backend().kernels<Elem>();
  Elem* encoded = encoded_.as<Elem>();
  {
    const Elem* embeddings = acquire_params_as<Elem>(embedding_block());
    k.encoder_forward(encoded, tokens(), embeddings + wte_, embeddings + wpe_, B, T, C);
    memory().release_params(embedding_block());
  }
  forward_layer_stack<Elem>(*this, B, T);
  const Elem* residual = layer_input<Elem>(config().n_layer);  // [N, C]
  Elem* lnf = lnf_.as<Elem>();
  Elem* logits = this->logits<Elem>();
  const Elem* lnf_params = acquire_params_as<Elem>(lnf_block());
  k.layernorm_forward(lnf, lnf_mean_.as<float>(), lnf_rstd_.as<float>(), residual,
                      lnf_params + lnfw_, lnf_params + lnfb_, N, C);
  memory().release_params(lnf_block());
  // Tied LM head: logits[N, V] = lnf[N, C] @ wte[V, C]^T
  const Elem* embeddings = acquire_params_as<Elem>(embedding_block());
  k.matmul_forward(logits, lnf, embeddings + wte_, nullptr, N, C, V);
  memory().release_params(embedding_block());
  if (!with_targets) return std::numeric_limits<float>::quiet_NaN();

  return mean_loss<Elem>(N);
}

// Layer l's forward from its input (the previous layer's output), into its activations.
template <typename Elem>
void Gpt::forward_layer(int l, int B, int T) {
  const int C = config().n_embd, NH = config().n_head;
  const int N = B * T;
  StorageKernels<Elem>& k = backend().kernels<Elem>();
  const Elem* residual = layer_input<Elem>(l);  // [N, C]
  const auto w =
      layer_at<LayerParams<Elem>>(acquire_params_as<Elem>(layer_block(l)), layer_offsets_);
  const LayerActs<Elem> a = layer_acts<Elem>(l);
  k.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, w.ln1w, w.ln1b, N, C);
  k.matmul_forward(a.qkv, a.ln1, w.qkvw, w.qkvb, N, C, 3 * C);           // [N, 3C]
  k.attention_forward(a.atty, a.lse, a.qkv, B, T, NH, NH, C / NH);       // [N, C]
  k.matmul_forward(a.attproj, a.atty, w.attprojw, w.attprojb, N, C, C);  // [N, C]
  k.residual_forward(a.residual2, residual, a.attproj, static_cast<size_t>(N) * C);
  k.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, w.ln2w, w.ln2b, N, C);
  k.matmul_forward(a.fch, a.ln2, w.fcw, w.fcb, N, C, 4 * C);  // [N, 4C]
  k.gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * 4 * C);
  k.matmul_forward(a.fcproj, a.fch_gelu, w.fcprojw, w.fcprojb, N, 4 * C, C);  // [N, C]
  k.residual_forward(a.residual3, a.residual2, a.fcproj, static_cast<size_t>(N) * C);
  memory().release_params(layer_block(l));
}

template <typename Elem>
void Gpt::backward_as(int B, int T, float loss_scale, const GradientsReady& ready) {
  const int C = config().n_embd, V = config().vocab_size;
  const int N = B * T;
  StorageKernels<Elem>& k = backend().kernels<Elem>();
  Elem* dres = dresidual_.as<Elem>();
  Elem* dlogits = this->dlogits<Elem>();
  Elem* dbt_c = dbt_c_.as<Elem>();

  // loss = loss_scale * mean over the counted of the N positions
  k.cross_entropy_backward(dlogits, this->logits<Elem>(), targets(),
                           loss_gradient_scale(loss_scale), N, V);
  // The embeddings' gradients collect the LM head's now and the lookup's last.
  Elem* embedding_grads = acquire_grads_as<Elem>(embedding_block());
  {
    const Elem* embeddings = acquire_params_as<Elem>(embedding_block());
    k.matmul_backward(dbt_c, embedding_grads + wte_, nullptr, dlogits, lnf_.as<Elem>(),
                      embeddings + wte_, N, C, V);  // dbt_c = dlnf
    memory().release_params(embedding_block());
  }
  backend().fill_zero(dres, static_cast<size_t>(N) * C * sizeof(Elem));
  const Elem* last_residual = layer_input<Elem>(config().n_layer);
  {
    const Elem* lnf_params = acquire_params_as<Elem>(lnf_block());
    Elem* lnf_grads = acquire_grads_as<Elem>(lnf_block());
    k.layernorm_backward(dres, lnf_grads + lnfw_, lnf_grads + lnfb_, dbt_c, last_residual,
                         lnf_params + lnfw_, lnf_mean_.as<float>(), lnf_rstd_.as<float>(), N, C);
    memory().release_params(lnf_block());
    finish_grads(lnf_block(), ready);
  }

  // Segment by segment, last first, recomputing each segment's layers first where configured.
  backward_layer_stack<Elem>(*this, B, T, ready);
  k.encoder_backward(embedding_grads + wte_, embedding_grads + wpe_, dres, tokens(), B, T, C);
  finish_grads(embedding_block(), ready);
}

// Layer l's backward: its parameters' gradients, and dresidual carried to its input.
template <typename Elem>
void Gpt::backward_layer(int l, int B, int T, const GradientsReady& ready) {
  const int C = config().n_embd, NH = config().n_head;
  const int N = B * T;
  StorageKernels<Elem>& k = backend().kernels<Elem>();
  Elem* dres = dresidual_.as<Elem>();
  Elem* dbt_c = dbt_c_.as<Elem>();
  Elem* dqkv = dqkv_.as<Elem>();
  Elem* dfch = dfch_.as<Elem>();
  Elem* dfch_gelu = dfch_gelu_.as<Elem>();
  const auto w =
      layer_at<LayerParams<Elem>>(acquire_params_as<Elem>(layer_block(l)), layer_offsets_);
  const auto g = layer_at<LayerGrads<Elem>>(acquire_grads_as<Elem>(layer_block(l)), layer_offsets_);
  const LayerActs<Elem> a = layer_acts<Elem>(l);
  const Elem* residual = layer_input<Elem>(l);
  // residual3 = residual2 + fcproj: dres is the gradient of both.
  k.matmul_backward(dfch_gelu, g.fcprojw, g.fcprojb, dres, a.fch_gelu, w.fcprojw, N, 4 * C, C);
  k.gelu_backward(dfch, a.fch, dfch_gelu, static_cast<size_t>(N) * 4 * C);
  k.matmul_backward(dbt_c, g.fcw, g.fcb, dfch, a.ln2, w.fcw, N, C, 4 * C);  // dln2
  k.layernorm_backward(dres, g.ln2w, g.ln2b, dbt_c, a.residual2, w.ln2w, a.ln2_mean, a.ln2_rstd, N,
                       C);
  // residual2 = residual + attproj: dres is the gradient of both.
  k.matmul_backward(dbt_c, g.attprojw, g.attprojb, dres, a.atty, w.attprojw, N, C, C);  // datty
  k.attention_backward(dqkv, dbt_c, a.qkv, a.atty, a.lse, B, T, NH, NH, C / NH);
  k.matmul_backward(dbt_c, g.qkvw, g.qkvb, dqkv, a.ln1, w.qkvw, N, C, 3 * C);  // dln1
  k.layernorm_backward(dres, g.ln1w, g.ln1b, dbt_c, residual, w.ln1w, a.ln1_mean, a.ln1_rstd, N, C);
  memory().release_params(layer_block(l));
  finish_grads(layer_block(l), ready);
}

}  // namespace tandem
