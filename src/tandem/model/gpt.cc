#include "tandem/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "tandem/core/error.h"
#include "tandem/core/rng.h"

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

// The flat range of the tensors whose names start with `prefix` (contiguous in the layout).
ParamRange range_of(const ParamLayout& layout, const std::string& prefix) {
  ParamRange range{layout.num_elements(), 0};
  for (const ParamView& view : layout.views()) {
    if (!view.name.starts_with(prefix)) continue;
    range.begin = std::min(range.begin, view.offset);
    range.end = std::max(range.end, view.offset + view.numel);
  }
  return range;
}

std::string layer_prefix(int l) { return "transformer.h." + std::to_string(l) + "."; }

}  // namespace

std::vector<ParamRange> Gpt::blocks(const GptConfig& config) {
  const ParamLayout layout = ParamLayout::gpt2(config);
  std::vector<ParamRange> blocks{range_of(layout, "transformer.w")};  // wte and wpe
  for (int l = 0; l < config.n_layer; l++) blocks.push_back(range_of(layout, layer_prefix(l)));
  blocks.push_back(range_of(layout, "transformer.ln_f."));
  for (size_t i = 0; i < blocks.size(); i++)
    TANDEM_CHECK(blocks[i].begin == (i == 0 ? 0 : blocks[i - 1].end),
                 "GPT-2 blocks must be contiguous and in layout order (block ", i, ")");
  TANDEM_CHECK(blocks.back().end == layout.num_elements(), "GPT-2 blocks must cover the layout");
  return blocks;
}

Gpt::Gpt(const GptConfig& config, ComputeBackend& backend, int max_batch, int max_seq_len,
         StorageDType dtype, GptOwnBuffers own)
    : config_(config),
      backend_(backend),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len),
      dtype_(dtype),
      layout_(ParamLayout::gpt2(config)) {
  config_.validate();
  blocks_ = blocks(config_);
  const size_t embeddings = blocks_[embedding_block()].begin;
  wte_ = layout_.at("transformer.wte.weight").offset - embeddings;
  wpe_ = layout_.at("transformer.wpe.weight").offset - embeddings;
  lnfw_ = layout_.at("transformer.ln_f.weight").offset - blocks_[lnf_block()].begin;
  lnfb_ = layout_.at("transformer.ln_f.bias").offset - blocks_[lnf_block()].begin;
  for (int l = 0; l < config_.n_layer; l++) {
    for (size_t i = 0; i < layer_offsets_.size(); i++) {
      const size_t offset =
          layout_.at(layer_prefix(l) + kLayerTensors[i]).offset - blocks_[layer_block(l)].begin;
      TANDEM_CHECK(l == 0 || offset == layer_offsets_[i],
                   "GPT-2 layers must share one layout within the block");
      layer_offsets_[i] = offset;
    }
  }
  TANDEM_CHECK(max_batch >= 1, "batch size must be at least 1, got ", max_batch);
  TANDEM_CHECK(max_seq_len >= 1 && max_seq_len <= config.context_length, "sequence length ",
               max_seq_len, " must be in 1..", config.context_length, " (model.context_length)");
  const size_t L = config.n_layer, C = config.n_embd, V = config.vocab_size, NH = config.n_head;
  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  const size_t P = layout_.num_elements();
  auto allocate = [&](size_t bytes) {
    allocated_bytes_ += bytes;
    return backend_.allocate(bytes);
  };
  const size_t elem_bytes = storage_dtype_bytes(dtype_);
  auto elems = [&](size_t n) { return allocate(n * elem_bytes); };
  auto floats = [&](size_t n) { return allocate(n * sizeof(float)); };

  if (own.params) params_ = elems(std::max(P, own.params_capacity));
  if (own.grads) grads_ = elems(P);
  tokens_ = allocate(BT * sizeof(int32_t));
  targets_ = allocate(BT * sizeof(int32_t));
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
  residual3_ = elems(L * BT * C);
  lnf_ = elems(BT * C);
  lnf_mean_ = floats(BT);
  lnf_rstd_ = floats(BT);
  logits_ = elems(BT * V);
  losses_ = floats(BT);

  dresidual_ = elems(BT * C);
  dlogits_ = elems(BT * V);
  dbt_c_ = elems(BT * C);
  dqkv_ = elems(BT * 3 * C);
  dfch_ = elems(BT * 4 * C);
  dfch_gelu_ = elems(BT * 4 * C);
}

size_t Gpt::activation_bytes(const GptConfig& config, int max_batch, int max_seq_len,
                             StorageDType dtype) {
  const size_t L = config.n_layer, C = config.n_embd, V = config.vocab_size, NH = config.n_head;
  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  // Elements stored as dtype ...
  const size_t per_layer_elems =
      BT * (C /*ln1*/ + 3 * C /*qkv*/ + C /*atty*/ + C /*attproj*/ + C /*residual2*/ + C /*ln2*/ +
            4 * C /*fch*/ + 4 * C /*fch_gelu*/ + C /*fcproj*/ + C /*residual3*/);
  const size_t once_elems = BT * (C /*encoded*/ + C /*lnf*/ + V /*logits*/);
  const size_t backward_elems = BT * (C /*dresidual*/ + V /*dlogits*/ + C /*dbt_c*/ +
                                      3 * C /*dqkv*/ + 8 * C /*dfch, dfch_gelu*/);
  // ... and as fp32.
  const size_t per_layer_floats = BT * (4 /*ln1, ln2 mean and rstd*/ + NH /*lse*/);
  const size_t once_floats = BT * (2 /*lnf mean, rstd*/ + 1 /*losses*/);
  return (L * per_layer_elems + once_elems + backward_elems) * storage_dtype_bytes(dtype) +
         (L * per_layer_floats + once_floats) * sizeof(float) + 2 * BT * sizeof(int32_t);
}

template <typename Elem>
void Gpt::check_elem() const {
  constexpr StorageDType wanted =
      std::is_same_v<Elem, Bf16> ? StorageDType::kBF16 : StorageDType::kF32;
  TANDEM_CHECK(wanted == dtype_, "the model stores ", storage_dtype_name(dtype_), ", not ",
               storage_dtype_name(wanted));
}
template void Gpt::check_elem<float>() const;
template void Gpt::check_elem<Bf16>() const;

void Gpt::check_own(const Buffer& buffer, const char* what) const {
  TANDEM_CHECK(buffer.as<void>() != nullptr, "the model's ", what,
               " live in its BlockMemory (ZeRO stage 2 or 3 partitions them), not in a flat "
               "buffer of its own");
}

void Gpt::set_block_memory(BlockMemory* memory) {
  if (memory == nullptr) {
    check_own(params_, "parameters");
    check_own(grads_, "gradients");
  }
  memory_ = memory != nullptr ? memory : &own_memory_;
}

const void* Gpt::OwnBlockMemory::acquire_params(int block) {
  model_.check_own(model_.params_, "parameters");
  return model_.params_.as<char>() +
         model_.blocks_[block].begin * storage_dtype_bytes(model_.dtype_);
}

void* Gpt::OwnBlockMemory::acquire_grads(int block) {
  model_.check_own(model_.grads_, "gradients");
  return model_.grads_.as<char>() +
         model_.blocks_[block].begin * storage_dtype_bytes(model_.dtype_);
}

template <typename Elem>
Gpt::LayerActs<Elem> Gpt::layer_acts(int l) const {
  const size_t C = config_.n_embd, NH = config_.n_head;
  const size_t BT = static_cast<size_t>(max_batch_) * max_seq_len_;
  const size_t row = l * BT;  // first row of layer l in a [L, BT, ...] tensor
  return {ln1_.as<Elem>() + row * C,          ln1_mean_.as<float>() + row,
          ln1_rstd_.as<float>() + row,        qkv_.as<Elem>() + row * 3 * C,
          atty_.as<Elem>() + row * C,         lse_.as<float>() + row * NH,
          attproj_.as<Elem>() + row * C,      residual2_.as<Elem>() + row * C,
          ln2_.as<Elem>() + row * C,          ln2_mean_.as<float>() + row,
          ln2_rstd_.as<float>() + row,        fch_.as<Elem>() + row * 4 * C,
          fch_gelu_.as<Elem>() + row * 4 * C, fcproj_.as<Elem>() + row * C,
          residual3_.as<Elem>() + row * C};
}

void Gpt::init_weights(uint64_t seed) { set_params(initial_params(seed)); }

std::vector<float> Gpt::initial_params(uint64_t seed) const {
  Rng rng(seed);
  std::vector<float> host(layout_.num_elements(), 0.0f);
  const float residual_std = 0.02f / std::sqrt(2.0f * config_.n_layer);
  for (const ParamView& view : layout_.views()) {
    float* p = host.data() + view.offset;
    const bool is_layernorm_weight =
        view.name.find(".ln_") != std::string::npos && view.name.ends_with(".weight");
    if (is_layernorm_weight) {
      for (size_t i = 0; i < view.numel; i++) p[i] = 1.0f;
    } else if (view.shape.size() == 2) {
      const bool residual_projection = view.name.ends_with("c_proj.weight");
      const float std = residual_projection ? residual_std : 0.02f;
      for (size_t i = 0; i < view.numel; i++) p[i] = std * rng.normal();
    }  // biases stay 0
  }
  return host;
}

void Gpt::upload(void* dst, const float* host, size_t n) {
  if (dtype_ == StorageDType::kF32) {
    backend_.copy_from_host(dst, host, n * sizeof(float));
    return;
  }
  std::vector<Bf16> rounded(n);
  for (size_t i = 0; i < n; i++) rounded[i] = from_float<Bf16>(host[i]);
  backend_.copy_from_host(dst, rounded.data(), n * sizeof(Bf16));
}

std::vector<float> Gpt::download(const void* src, size_t n) const {
  std::vector<float> host(n);
  if (dtype_ == StorageDType::kF32) {
    backend_.copy_to_host(host.data(), src, n * sizeof(float));
    return host;
  }
  std::vector<Bf16> stored(n);
  backend_.copy_to_host(stored.data(), src, n * sizeof(Bf16));
  for (size_t i = 0; i < n; i++) host[i] = to_float(stored[i]);
  return host;
}

void Gpt::set_params(const std::vector<float>& host_params) {
  check_own(params_, "parameters");
  TANDEM_CHECK(host_params.size() == layout_.num_elements(), "parameter count mismatch: got ",
               host_params.size(), ", model has ", layout_.num_elements());
  upload(params(), host_params.data(), host_params.size());
}

std::vector<float> Gpt::params_to_host() const {
  check_own(params_, "parameters");
  return download(params(), layout_.num_elements());
}

std::vector<float> Gpt::grads_to_host() const {
  check_own(grads_, "gradients");
  return download(grads(), layout_.num_elements());
}

std::vector<float> Gpt::logits_to_host() const {
  return download(logits_.as<void>(), static_cast<size_t>(last_B_) * last_T_ * config_.vocab_size);
}

void Gpt::zero_grads() {
  if (grads_.as<void>() == nullptr) return;  // a BlockMemory's gradients start at zero
  backend_.fill_zero(grads(), layout_.num_elements() * storage_dtype_bytes(dtype_));
}

double Gpt::grad_sum_of_squares() {
  check_own(grads_, "gradients");
  const size_t n = layout_.num_elements();
  return dtype_ == StorageDType::kBF16 ? backend_.sum_of_squares(grads_.as<Bf16>(), n)
                                       : backend_.sum_of_squares(grads_.as<float>(), n);
}

float Gpt::forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  TANDEM_CHECK(B >= 1 && B <= max_batch_ && T >= 1 && T <= max_seq_len_, "forward: batch ", B,
               " x ", T, " exceeds the allocated ", max_batch_, " x ", max_seq_len_);
  const int V = config_.vocab_size;
  const int N = B * T;
  for (int i = 0; i < N; i++) {
    TANDEM_CHECK(tokens[i] >= 0 && tokens[i] < V, "token id ", tokens[i], " at position ", i,
                 " is outside the vocabulary [0, ", V, ")");
    TANDEM_CHECK(targets == nullptr || (targets[i] >= 0 && targets[i] < V), "target id ",
                 targets[i], " at position ", i, " is outside the vocabulary [0, ", V, ")");
  }
  backend_.copy_from_host(tokens_.as<int32_t>(), tokens, N * sizeof(int32_t));
  if (targets != nullptr)
    backend_.copy_from_host(targets_.as<int32_t>(), targets, N * sizeof(int32_t));
  last_B_ = B;
  last_T_ = T;
  have_targets_ = targets != nullptr;
  return dtype_ == StorageDType::kBF16 ? forward_as<Bf16>(B, T, have_targets_)
                                       : forward_as<float>(B, T, have_targets_);
}

template <typename Elem>
float Gpt::forward_as(int B, int T, bool with_targets) {
  const int C = config_.n_embd, V = config_.vocab_size, NH = config_.n_head;
  const int N = B * T;
  StorageKernels<Elem>& k = backend_.kernels<Elem>();
  Elem* encoded = encoded_.as<Elem>();
  {
    const Elem* embeddings = acquire_params_as<Elem>(embedding_block());
    k.encoder_forward(encoded, tokens_.as<int32_t>(), embeddings + wte_, embeddings + wpe_, B, T,
                      C);
    memory_->release_params(embedding_block());
  }
  const Elem* residual = encoded;  // [N, C]
  for (int l = 0; l < config_.n_layer; l++) {
    const auto w =
        layer_at<LayerParams<Elem>>(acquire_params_as<Elem>(layer_block(l)), layer_offsets_);
    const LayerActs<Elem> a = layer_acts<Elem>(l);
    k.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, w.ln1w, w.ln1b, N, C);
    k.matmul_forward(a.qkv, a.ln1, w.qkvw, w.qkvb, N, C, 3 * C);           // [N, 3C]
    k.attention_forward(a.atty, a.lse, a.qkv, B, T, C, NH);                // [N, C]
    k.matmul_forward(a.attproj, a.atty, w.attprojw, w.attprojb, N, C, C);  // [N, C]
    k.residual_forward(a.residual2, residual, a.attproj, static_cast<size_t>(N) * C);
    k.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, w.ln2w, w.ln2b, N, C);
    k.matmul_forward(a.fch, a.ln2, w.fcw, w.fcb, N, C, 4 * C);  // [N, 4C]
    k.gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * 4 * C);
    k.matmul_forward(a.fcproj, a.fch_gelu, w.fcprojw, w.fcprojb, N, 4 * C, C);  // [N, C]
    k.residual_forward(a.residual3, a.residual2, a.fcproj, static_cast<size_t>(N) * C);
    memory_->release_params(layer_block(l));
    residual = a.residual3;
  }
  Elem* lnf = lnf_.as<Elem>();
  Elem* logits = logits_.as<Elem>();
  const Elem* lnf_params = acquire_params_as<Elem>(lnf_block());
  k.layernorm_forward(lnf, lnf_mean_.as<float>(), lnf_rstd_.as<float>(), residual,
                      lnf_params + lnfw_, lnf_params + lnfb_, N, C);
  memory_->release_params(lnf_block());
  // Tied LM head: logits[N, V] = lnf[N, C] @ wte[V, C]^T
  const Elem* embeddings = acquire_params_as<Elem>(embedding_block());
  k.matmul_forward(logits, lnf, embeddings + wte_, nullptr, N, C, V);
  memory_->release_params(embedding_block());
  if (!with_targets) return std::numeric_limits<float>::quiet_NaN();

  k.cross_entropy_forward(losses_.as<float>(), logits, targets_.as<int32_t>(), N, V);
  std::vector<float> losses(N);
  backend_.copy_to_host(losses.data(), losses_.as<float>(), N * sizeof(float));
  double sum = 0.0;
  for (float loss : losses) sum += loss;
  return static_cast<float>(sum / N);
}

void Gpt::backward(float loss_scale, const GradientsReady& ready) {
  TANDEM_CHECK(have_targets_, "backward needs a forward pass with targets just before it");
  if (dtype_ == StorageDType::kBF16)
    backward_as<Bf16>(loss_scale, ready);
  else
    backward_as<float>(loss_scale, ready);
}

template <typename Elem>
void Gpt::backward_as(float loss_scale, const GradientsReady& ready) {
  // A block's gradients are complete: its memory may reduce them, and `ready` is told.
  auto finish_block = [&](int block) {
    memory_->release_grads(block);
    if (ready) ready(blocks_[block].begin, blocks_[block].end);
  };
  const int B = last_B_, T = last_T_;
  const int C = config_.n_embd, V = config_.vocab_size, NH = config_.n_head;
  const int N = B * T;
  StorageKernels<Elem>& k = backend_.kernels<Elem>();
  const Elem* encoded = encoded_.as<Elem>();
  Elem* dres = dresidual_.as<Elem>();
  Elem* dlogits = dlogits_.as<Elem>();
  Elem* dbt_c = dbt_c_.as<Elem>();
  Elem* dqkv = dqkv_.as<Elem>();
  Elem* dfch = dfch_.as<Elem>();
  Elem* dfch_gelu = dfch_gelu_.as<Elem>();

  // loss = loss_scale * mean over N positions
  k.cross_entropy_backward(dlogits, logits_.as<Elem>(), targets_.as<int32_t>(), loss_scale / N, N,
                           V);
  // The embeddings' gradients collect the LM head's now and the lookup's last.
  Elem* embedding_grads = acquire_grads_as<Elem>(embedding_block());
  {
    const Elem* embeddings = acquire_params_as<Elem>(embedding_block());
    k.matmul_backward(dbt_c, embedding_grads + wte_, nullptr, dlogits, lnf_.as<Elem>(),
                      embeddings + wte_, N, C, V);  // dbt_c = dlnf
    memory_->release_params(embedding_block());
  }
  backend_.fill_zero(dres, static_cast<size_t>(N) * C * sizeof(Elem));
  const Elem* last_residual =
      config_.n_layer > 0 ? layer_acts<Elem>(config_.n_layer - 1).residual3 : encoded;
  {
    const Elem* lnf_params = acquire_params_as<Elem>(lnf_block());
    Elem* lnf_grads = acquire_grads_as<Elem>(lnf_block());
    k.layernorm_backward(dres, lnf_grads + lnfw_, lnf_grads + lnfb_, dbt_c, last_residual,
                         lnf_params + lnfw_, lnf_mean_.as<float>(), lnf_rstd_.as<float>(), N, C);
    memory_->release_params(lnf_block());
    finish_block(lnf_block());
  }

  for (int l = config_.n_layer - 1; l >= 0; l--) {
    const auto w =
        layer_at<LayerParams<Elem>>(acquire_params_as<Elem>(layer_block(l)), layer_offsets_);
    const auto g =
        layer_at<LayerGrads<Elem>>(acquire_grads_as<Elem>(layer_block(l)), layer_offsets_);
    const LayerActs<Elem> a = layer_acts<Elem>(l);
    const Elem* residual = l == 0 ? encoded : layer_acts<Elem>(l - 1).residual3;
    // residual3 = residual2 + fcproj: dres is the gradient of both.
    k.matmul_backward(dfch_gelu, g.fcprojw, g.fcprojb, dres, a.fch_gelu, w.fcprojw, N, 4 * C, C);
    k.gelu_backward(dfch, a.fch, dfch_gelu, static_cast<size_t>(N) * 4 * C);
    k.matmul_backward(dbt_c, g.fcw, g.fcb, dfch, a.ln2, w.fcw, N, C, 4 * C);  // dln2
    k.layernorm_backward(dres, g.ln2w, g.ln2b, dbt_c, a.residual2, w.ln2w, a.ln2_mean, a.ln2_rstd,
                         N, C);
    // residual2 = residual + attproj: dres is the gradient of both.
    k.matmul_backward(dbt_c, g.attprojw, g.attprojb, dres, a.atty, w.attprojw, N, C, C);  // datty
    k.attention_backward(dqkv, dbt_c, a.qkv, a.atty, a.lse, B, T, C, NH);
    k.matmul_backward(dbt_c, g.qkvw, g.qkvb, dqkv, a.ln1, w.qkvw, N, C, 3 * C);  // dln1
    k.layernorm_backward(dres, g.ln1w, g.ln1b, dbt_c, residual, w.ln1w, a.ln1_mean, a.ln1_rstd, N,
                         C);
    memory_->release_params(layer_block(l));
    finish_block(layer_block(l));
  }
  k.encoder_backward(embedding_grads + wte_, embedding_grads + wpe_, dres, tokens_.as<int32_t>(), B,
                     T, C);
  finish_block(embedding_block());
}

}  // namespace tandem
