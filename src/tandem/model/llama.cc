#include "tandem/model/llama.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "tandem/core/error.h"

namespace tandem {

namespace {

std::string layer_prefix(int l) { return "model.layers." + std::to_string(l) + "."; }

}  // namespace

ParamLayout llama_layout(const ModelConfig& config) {
  const int64_t V = config.vocab_size, C = config.n_embd, I = config.mlp_width();
  const int64_t HS = config.head_size(), Q = static_cast<int64_t>(config.n_head) * HS;
  const int64_t KV = static_cast<int64_t>(config.kv_heads()) * HS;
  ParamLayout layout;
  layout.begin_block();
  layout.add("model.embed_tokens.weight", {V, C}, true);
  for (int l = 0; l < config.n_layer; l++) {
    const std::string p = layer_prefix(l);
    layout.begin_block();
    layout.add(p + "input_layernorm.weight", {C}, false);
    // q, k, v adjacent: one fused projection (llama.h).
    layout.add(p + "self_attn.q_proj.weight", {Q, C}, true);
    layout.add(p + "self_attn.k_proj.weight", {KV, C}, true);
    layout.add(p + "self_attn.v_proj.weight", {KV, C}, true);
    if (config.qkv_bias) {  // adjacent likewise: one fused bias
      layout.add(p + "self_attn.q_proj.bias", {Q}, false);
      layout.add(p + "self_attn.k_proj.bias", {KV}, false);
      layout.add(p + "self_attn.v_proj.bias", {KV}, false);
    }
    if (config.qk_norm) {
      layout.add(p + "self_attn.q_norm.weight", {HS}, false);
      layout.add(p + "self_attn.k_norm.weight", {HS}, false);
    }
    layout.add(p + "self_attn.o_proj.weight", {C, Q}, true);
    if (config.o_bias) layout.add(p + "self_attn.o_proj.bias", {C}, false);
    layout.add(p + "post_attention_layernorm.weight", {C}, false);
    layout.add(p + "mlp.gate_proj.weight", {I, C}, true);  // gate, up adjacent: fused
    layout.add(p + "mlp.up_proj.weight", {I, C}, true);
    layout.add(p + "mlp.down_proj.weight", {C, I}, true);
  }
  layout.begin_block();
  layout.add("model.norm.weight", {C}, false);
  if (!config.tie_word_embeddings) layout.add("lm_head.weight", {V, C}, true);
  return layout;
}

std::vector<float> rope_inverse_frequencies(const ModelConfig& config) {
  const int HS = config.head_size(), half = HS / 2;
  const RopeScaling& scaling = config.rope_scaling;
  const float factor = static_cast<float>(scaling.factor);
  std::vector<float> inverse(half);
  for (int i = 0; i < half; i++) {
    // As LlamaRotaryEmbedding: 1 / theta ** (arange(0, HS, 2).float() / HS), all in fp32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(HS);
    const float power = static_cast<float>(std::pow(config.rope_theta, double{exponent}));
    inverse[i] = 1.0f / power;
  }
  if (scaling.type == RopeType::kLinear)
    for (float& f : inverse) f /= factor;
  if (scaling.type == RopeType::kLlama3) {
    // transformers' _compute_llama3_parameters, one fp32 operation at a time as torch runs
    // them (x / tensor is reciprocal(tensor) * x; Python scalars rounded to fp32).
    const float old_context = static_cast<float>(scaling.original_max_position_embeddings);
    const float low = static_cast<float>(scaling.low_freq_factor);
    const float low_freq_wavelen = static_cast<float>(
        static_cast<double>(scaling.original_max_position_embeddings) / scaling.low_freq_factor);
    const float high_freq_wavelen = static_cast<float>(
        static_cast<double>(scaling.original_max_position_embeddings) / scaling.high_freq_factor);
    const float band = static_cast<float>(scaling.high_freq_factor - scaling.low_freq_factor);
    const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
    for (float& f : inverse) {
      const float wavelen = (1.0f / f) * two_pi;
      const float kept = wavelen > low_freq_wavelen ? f / factor : f;
      const float smooth = ((1.0f / wavelen) * old_context - low) / band;
      const float smoothed = (1.0f - smooth) * kept / factor + smooth * kept;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      f = medium ? smoothed : kept;
    }
  }
  return inverse;
}

std::vector<float> rope_cos_sin(const ModelConfig& config, int T) {
  const int half = config.head_size() / 2;
  const std::vector<float> inverse = rope_inverse_frequencies(config);
  std::vector<float> table(static_cast<size_t>(T) * half * 2);
  for (int i = 0; i < half; i++) {
    for (int t = 0; t < T; t++) {
      const float angle = static_cast<float>(t) * inverse[i];
      float* cs = table.data() + (static_cast<size_t>(t) * half + i) * 2;
      cs[0] = static_cast<float>(std::cos(double{angle}));
      cs[1] = static_cast<float>(std::sin(double{angle}));
    }
  }
  return table;
}

Llama::Llama(const ModelConfig& config, ComputeBackend& backend, int max_batch, int max_seq_len,
             StorageDType dtype, ModelOwnBuffers own)
    : Model(config, backend, max_batch, max_seq_len, dtype, llama_layout(config), own),
      segments_{.layers = config.n_layer,
                .interval = own.recompute_interval,
                .kept_on_host = own.recompute_kept_on_host} {
  TANDEM_CHECK(is_llama_family(config.type),
               "Llama needs a config of the Llama family, got "
               "model.type ",
               model_type_name(config.type));
  TANDEM_CHECK(config.sliding_window == 0 || max_seq_len <= config.sliding_window,
               "model.sliding_window = ", config.sliding_window, " is shorter than the sequence (",
               max_seq_len,
               " positions): tandem's attention sees every earlier position, so it would not "
               "compute this model; train on sequences of at most ",
               config.sliding_window, " (train.seq_len)");
  TANDEM_CHECK(segments_.interval >= 0, "recompute interval ", segments_.interval,
               ": must be 0 (off) or a number of layers");
  TANDEM_CHECK(!segments_.kept_on_host || segments_.recomputes(),
               "kept outputs on the host need a recompute interval");
  embed_ = offset_in_block("model.embed_tokens.weight", embedding_block());
  normw_ = offset_in_block("model.norm.weight", head_block());
  if (!config.tie_word_embeddings) lm_head_ = offset_in_block("lm_head.weight", head_block());
  struct LayerTensor {
    const char* name;
    size_t* offset;
    bool present;
  };
  const LayerTensor tensors[] = {{"input_layernorm.weight", &ln1w_, true},
                                 {"self_attn.q_proj.weight", &qkvw_, true},
                                 {"self_attn.q_proj.bias", &qkvb_, config.qkv_bias},
                                 {"self_attn.q_norm.weight", &qnormw_, config.qk_norm},
                                 {"self_attn.k_norm.weight", &knormw_, config.qk_norm},
                                 {"self_attn.o_proj.weight", &attprojw_, true},
                                 {"self_attn.o_proj.bias", &attprojb_, config.o_bias},
                                 {"post_attention_layernorm.weight", &ln2w_, true},
                                 {"mlp.gate_proj.weight", &gateupw_, true},
                                 {"mlp.down_proj.weight", &downw_, true}};
  for (int l = 0; l < config.n_layer; l++) {
    for (const LayerTensor& tensor : tensors) {
      if (!tensor.present) continue;
      const size_t offset = offset_in_block(layer_prefix(l) + tensor.name, layer_block(l));
      TANDEM_CHECK(l == 0 || offset == *tensor.offset,
                   "Llama layers must share one layout within the block");
      *tensor.offset = offset;
    }
  }
  const size_t L = segments_.slots(), C = config.n_embd, NH = config.n_head;
  const size_t W = config.qkv_width(), Q = config.attention_width(), I = config.mlp_width();
  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  auto elems = [&](size_t n) { return allocate_elems(n); };
  // None at all where recompute leaves no slot (k = 1) or keeps nothing (off).
  auto elems_or_none = [&](size_t n) { return n > 0 ? elems(n) : Buffer(); };
  auto floats = [&](size_t n) { return allocate_floats(n); };
  const std::vector<float> table = rope_cos_sin(config, max_seq_len);
  cos_sin_ = floats(table.size());
  backend.copy_from_host(cos_sin_.as<float>(), table.data(), table.size() * sizeof(float));
  encoded_ = elems(BT * C);
  ln1_ = elems(L * BT * C);
  ln1_rstd_ = floats(L * BT);
  if (config.qk_norm) {
    qkv_projected_ = elems(L * BT * W);
    qk_rstd_ = floats(L * BT * (NH + config.kv_heads()));
  }
  qkv_ = elems(L * BT * W);
  atty_ = elems(L * BT * Q);
  lse_ = floats(L * NH * BT);
  attproj_ = elems(L * BT * C);
  residual2_ = elems(L * BT * C);
  ln2_ = elems(L * BT * C);
  ln2_rstd_ = floats(L * BT);
  gateup_ = elems(L * BT * 2 * I);
  swiglu_ = elems(L * BT * I);
  down_ = elems(L * BT * C);
  residual3_ = elems_or_none(segments_.output_slots() * BT * C);
  kept_ = elems_or_none(segments_.kept_rows() * BT * C);
  if (segments_.kept_on_host)
    host_kept_ = std::make_unique<HostKeptOutputs>(backend, segments_.kept_outputs(),
                                                   BT * C * storage_dtype_bytes(dtype));
  lnf_ = elems(BT * C);
  lnf_rstd_ = floats(BT);
  dresidual_ = elems(BT * C);
  dbt_c_ = elems(BT * std::max(C, Q));
  dqkv_ = elems(BT * W);
  dgateup_ = elems(BT * 2 * I);
  dswiglu_ = elems(BT * I);
}

size_t Llama::activation_bytes(const ModelConfig& config, int max_batch, int max_seq_len,
                               StorageDType dtype, int recompute_interval, bool kept_on_host) {
  const RecomputeSegments segments{
      .layers = config.n_layer, .interval = recompute_interval, .kept_on_host = kept_on_host};
  const size_t L = segments.slots(), C = config.n_embd, NH = config.n_head;
  const size_t W = config.qkv_width(), Q = config.attention_width(), I = config.mlp_width();
  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  const size_t qk_norm_elems = config.qk_norm ? W /*qkv_projected*/ : 0;
  const size_t qk_norm_floats = config.qk_norm ? NH + config.kv_heads() /*qk_rstd*/ : 0;
  const size_t per_layer_elems =
      BT * (C /*ln1*/ + qk_norm_elems + W /*qkv*/ + Q /*atty*/ + C /*attproj*/ + C /*residual2*/ +
            C /*ln2*/ + 2 * I /*gateup*/ + I /*swiglu*/ + C /*down*/);
  const size_t once_elems =
      BT * (C /*encoded*/ + C /*lnf*/) + BT * C * (segments.output_slots() + segments.kept_rows());
  const size_t backward_elems =
      BT * (C /*dresidual*/ + std::max(C, Q) /*dbt_c*/ + W /*dqkv*/ + 3 * I /*dgateup, dswiglu*/);
  const size_t per_layer_floats = BT * (2 /*ln1, ln2 rstd*/ + qk_norm_floats + NH /*lse*/);
  const size_t once_floats =
      BT /*lnf rstd*/ + static_cast<size_t>(max_seq_len) * config.head_size() /*cos_sin*/;
  return (L * per_layer_elems + once_elems + backward_elems) * storage_dtype_bytes(dtype) +
         (L * per_layer_floats + once_floats) * sizeof(float) + head_bytes(config, BT, dtype);
}

Model::TensorInit Llama::tensor_init(const ParamView& view) const {
  if (view.name.ends_with(".bias")) return {.kind = TensorInit::Kind::kZeros};
  if (view.shape.size() == 1) return {.kind = TensorInit::Kind::kOnes};  // an RMSNorm weight
  return {.kind = TensorInit::Kind::kNormal, .std = 0.02f};
}

template <typename Elem>
Llama::LayerParams<Elem> Llama::layer_at(Elem* base) const {
  auto optional = [&](size_t offset) { return offset == kAbsent ? nullptr : base + offset; };
  return {base + ln1w_,      base + qkvw_,     base + attprojw_, base + ln2w_,
          base + gateupw_,   base + downw_,    optional(qkvb_),  optional(attprojb_),
          optional(qnormw_), optional(knormw_)};
}

template <typename Elem>
Llama::LayerActs<Elem> Llama::layer_acts(int l) const {
  const size_t C = config().n_embd, NH = config().n_head, KVH = config().kv_heads();
  const size_t W = config().qkv_width(), Q = config().attention_width(), I = config().mlp_width();
  const size_t BT = static_cast<size_t>(max_batch()) * max_seq_len();
  const size_t row = segments_.slot(l) * BT;  // first row of the slot in [A, BT, ...]
  Elem* residual3 = segments_.output_of(l, residual3_.as<Elem>(), kept_.as<Elem>(), BT * C);
  const bool qk_norm = config().qk_norm;
  return {ln1_.as<Elem>() + row * C,
          ln1_rstd_.as<float>() + row,
          qk_norm ? qkv_projected_.as<Elem>() + row * W : nullptr,
          qk_norm ? qk_rstd_.as<float>() + row * (NH + KVH) : nullptr,
          qkv_.as<Elem>() + row * W,
          atty_.as<Elem>() + row * Q,
          lse_.as<float>() + row * NH,
          attproj_.as<Elem>() + row * C,
          residual2_.as<Elem>() + row * C,
          ln2_.as<Elem>() + row * C,
          ln2_rstd_.as<float>() + row,
          gateup_.as<Elem>() + row * 2 * I,
          swiglu_.as<Elem>() + row * I,
          down_.as<Elem>() + row * C,
          residual3};
}

template <typename Elem>
const Elem* Llama::layer_input(int l) const {
  return l == 0 ? encoded_.as<Elem>() : layer_acts<Elem>(l - 1).residual3;
}

float Llama::forward_pass(int B, int T, bool with_targets) {
  return dtype() == StorageDType::kBF16 ? forward_as<Bf16>(B, T, with_targets)
                                        : forward_as<float>(B, T, with_targets);
}

void Llama::backward_pass(int B, int T, float loss_scale, const GradientsReady& ready) {
  if (dtype() == StorageDType::kBF16)
    backward_as<Bf16>(B, T, loss_scale, ready);
  else
    backward_as<float>(B, T, loss_scale, ready);
}

template <typename Elem>
float Llama::forward_as(int B, int T, bool with_targets) {
  const ModelConfig& m = config();
  const int C = m.n_embd, V = m.vocab_size;
  const float eps = static_cast<float>(m.rms_norm_eps);
  const int N = B * T;
  StorageKernels<Elem>& k = backend().kernels<Elem>();
  Elem* encoded = encoded_.as<Elem>();
  {
    const Elem* embeddings = acquire_params_as<Elem>(embedding_block());
    k.encoder_forward(encoded, tokens(), embeddings + embed_, nullptr, B, T, C);
    memory().release_params(embedding_block());
  }
  forward_layer_stack<Elem>(*this, B, T);
  const Elem* residual = layer_input<Elem>(m.n_layer);  // [N, C]
  Elem* lnf = lnf_.as<Elem>();
  const Elem* head = acquire_params_as<Elem>(head_block());
  k.rmsnorm_forward(lnf, lnf_rstd_.as<float>(), residual, head + normw_, eps, N, C);
  if (m.tie_word_embeddings) {
    memory().release_params(head_block());
    const Elem* embeddings = acquire_params_as<Elem>(embedding_block());
    k.matmul_forward(this->logits<Elem>(), lnf, embeddings + embed_, nullptr, N, C, V);
    memory().release_params(embedding_block());
  } else {
    k.matmul_forward(this->logits<Elem>(), lnf, head + lm_head_, nullptr, N, C, V);
    memory().release_params(head_block());
  }
  if (!with_targets) return std::numeric_limits<float>::quiet_NaN();
  return mean_loss<Elem>(N);
}

// Layer l's forward from its input (the previous layer's output), into its activations.
template <typename Elem>
void Llama::forward_layer(int l, int B, int T) {
  const ModelConfig& m = config();
  const int C = m.n_embd, NH = m.n_head, KVH = m.kv_heads(), HS = m.head_size();
  const int W = m.qkv_width(), Q = m.attention_width(), I = m.mlp_width();
  const float eps = static_cast<float>(m.rms_norm_eps);
  const int N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  StorageKernels<Elem>& k = backend().kernels<Elem>();
  const float* cos_sin = cos_sin_.as<float>();
  const Elem* residual = layer_input<Elem>(l);  // [N, C]
  const auto w = layer_at(acquire_params_as<Elem>(layer_block(l)));
  const LayerActs<Elem> a = layer_acts<Elem>(l);
  k.rmsnorm_forward(a.ln1, a.ln1_rstd, residual, w.ln1w, eps, N, C);
  if (m.qk_norm) {
    // The projection kept for the norms' backward; qkv gets its v heads and the normed q, k.
    k.matmul_forward(a.qkv_projected, a.ln1, w.qkvw, w.qkvb, N, C, W);  // [N, W]
    backend().copy(a.qkv, a.qkv_projected, static_cast<size_t>(N) * W * sizeof(Elem));
    k.head_rmsnorm_forward(a.qkv, a.qk_rstd, a.qkv_projected, w.qnormw, eps, N, NH, HS, W);
    k.head_rmsnorm_forward(a.qkv + Q, a.qk_rstd + static_cast<size_t>(N) * NH, a.qkv_projected + Q,
                           w.knormw, eps, N, KVH, HS, W);
  } else {
    k.matmul_forward(a.qkv, a.ln1, w.qkvw, w.qkvb, N, C, W);  // [N, W]
  }
  k.rope_forward(a.qkv, cos_sin, B, T, NH, KVH, HS);
  k.attention_forward(a.atty, a.lse, a.qkv, B, T, NH, KVH, HS);          // [N, Q]
  k.matmul_forward(a.attproj, a.atty, w.attprojw, w.attprojb, N, Q, C);  // [N, C]
  k.residual_forward(a.residual2, residual, a.attproj, NC);
  k.rmsnorm_forward(a.ln2, a.ln2_rstd, a.residual2, w.ln2w, eps, N, C);
  k.matmul_forward(a.gateup, a.ln2, w.gateupw, nullptr, N, C, 2 * I);  // [N, 2I]
  k.swiglu_forward(a.swiglu, a.gateup, N, I);                          // [N, I]
  k.matmul_forward(a.down, a.swiglu, w.downw, nullptr, N, I, C);       // [N, C]
  k.residual_forward(a.residual3, a.residual2, a.down, NC);
  memory().release_params(layer_block(l));
}

template <typename Elem>
void Llama::backward_as(int B, int T, float loss_scale, const GradientsReady& ready) {
  const ModelConfig& m = config();
  const int C = m.n_embd, V = m.vocab_size;
  const int N = B * T;
  StorageKernels<Elem>& k = backend().kernels<Elem>();
  const Elem* lnf = lnf_.as<Elem>();
  Elem* dres = dresidual_.as<Elem>();
  Elem* dlogits = this->dlogits<Elem>();
  Elem* dbt_c = dbt_c_.as<Elem>();

  // loss = loss_scale * mean over the counted of the N positions
  k.cross_entropy_backward(dlogits, this->logits<Elem>(), targets(),
                           loss_gradient_scale(loss_scale), N, V);
  // A tied head's gradient goes to the embedding, whose block completes last.
  Elem* embedding_grads = nullptr;
  Elem* head_grads = nullptr;
  if (m.tie_word_embeddings) {
    embedding_grads = acquire_grads_as<Elem>(embedding_block());
    const Elem* embeddings = acquire_params_as<Elem>(embedding_block());
    k.matmul_backward(dbt_c, embedding_grads + embed_, nullptr, dlogits, lnf, embeddings + embed_,
                      N, C, V);  // dbt_c = dlnf
    memory().release_params(embedding_block());
  }
  {
    const Elem* head = acquire_params_as<Elem>(head_block());
    head_grads = acquire_grads_as<Elem>(head_block());
    if (!m.tie_word_embeddings)
      k.matmul_backward(dbt_c, head_grads + lm_head_, nullptr, dlogits, lnf, head + lm_head_, N, C,
                        V);
    backend().fill_zero(dres, static_cast<size_t>(N) * C * sizeof(Elem));
    const Elem* last_residual = layer_input<Elem>(m.n_layer);
    k.rmsnorm_backward(dres, head_grads + normw_, dbt_c, last_residual, head + normw_,
                       lnf_rstd_.as<float>(), N, C);
    memory().release_params(head_block());
    finish_grads(head_block(), ready);
  }

  // Segment by segment, last first, recomputing each segment's layers first where configured.
  backward_layer_stack<Elem>(*this, B, T, ready);
  if (embedding_grads == nullptr) embedding_grads = acquire_grads_as<Elem>(embedding_block());
  k.encoder_backward(embedding_grads + embed_, nullptr, dres, tokens(), B, T, C);
  finish_grads(embedding_block(), ready);
}

// Layer l's backward: its parameters' gradients, and dresidual carried to its input.
template <typename Elem>
void Llama::backward_layer(int l, int B, int T, const GradientsReady& ready) {
  const ModelConfig& m = config();
  const int C = m.n_embd, NH = m.n_head, KVH = m.kv_heads(), HS = m.head_size();
  const int W = m.qkv_width(), Q = m.attention_width(), I = m.mlp_width();
  const int N = B * T;
  StorageKernels<Elem>& k = backend().kernels<Elem>();
  const float* cos_sin = cos_sin_.as<float>();
  Elem* dres = dresidual_.as<Elem>();
  Elem* dbt_c = dbt_c_.as<Elem>();
  Elem* dqkv = dqkv_.as<Elem>();
  Elem* dgateup = dgateup_.as<Elem>();
  Elem* dswiglu = dswiglu_.as<Elem>();
  const auto w = layer_at(acquire_params_as<Elem>(layer_block(l)));
  const auto g = layer_at(acquire_grads_as<Elem>(layer_block(l)));
  const LayerActs<Elem> a = layer_acts<Elem>(l);
  const Elem* residual = layer_input<Elem>(l);
  // residual3 = residual2 + down: dres is the gradient of both.
  k.matmul_backward(dswiglu, g.downw, nullptr, dres, a.swiglu, w.downw, N, I, C);
  k.swiglu_backward(dgateup, a.gateup, dswiglu, N, I);
  k.matmul_backward(dbt_c, g.gateupw, nullptr, dgateup, a.ln2, w.gateupw, N, C, 2 * I);  // dln2
  k.rmsnorm_backward(dres, g.ln2w, dbt_c, a.residual2, w.ln2w, a.ln2_rstd, N, C);
  // residual2 = residual + attproj: dres is the gradient of both.
  k.matmul_backward(dbt_c, g.attprojw, g.attprojb, dres, a.atty, w.attprojw, N, Q,
                    C);  // datty [N, Q]
  k.attention_backward(dqkv, dbt_c, a.qkv, a.atty, a.lse, B, T, NH, KVH, HS);
  k.rope_backward(dqkv, cos_sin, B, T, NH, KVH, HS);
  if (m.qk_norm) {  // in place: the normed heads' gradients become the projection's
    k.head_rmsnorm_backward(dqkv, g.qnormw, dqkv, a.qkv_projected, w.qnormw, a.qk_rstd, N, NH, HS,
                            W);
    k.head_rmsnorm_backward(dqkv + Q, g.knormw, dqkv + Q, a.qkv_projected + Q, w.knormw,
                            a.qk_rstd + static_cast<size_t>(N) * NH, N, KVH, HS, W);
  }
  k.matmul_backward(dbt_c, g.qkvw, g.qkvb, dqkv, a.ln1, w.qkvw, N, C, W);  // dln1
  k.rmsnorm_backward(dres, g.ln1w, dbt_c, residual, w.ln1w, a.ln1_rstd, N, C);
  memory().release_params(layer_block(l));
  finish_grads(layer_block(l), ready);
}

}  // namespace tandem
