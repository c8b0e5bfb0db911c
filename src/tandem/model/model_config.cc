#include "tandem/model/model_config.h"

#include <cmath>
#include <string>

#include "tandem/core/error.h"

namespace tandem {

namespace {

// Token ids must survive a round trip through float32 activations and llm.c's token shards
// (uint16 today, 32-bit in the future); 2^24 is the largest range a float holds exactly.
constexpr int kMaxVocabSize = 1 << 24;
// Position embeddings and attention scratch grow with maxT (attention with T^2); beyond 2^20
// positions a config is a typo, not a plan.
constexpr int kMaxContextLength = 1 << 20;
// Keeps num_parameters() and every per-tensor element count far from int64 overflow.
constexpr int kMaxEmbd = 1 << 16;
constexpr int kMaxLayer = 1 << 12;

void check_range(const char* key, int value, int max) {
  TANDEM_CHECK(value >= 1 && value <= max, "model.", key, " = ", value,
               " is out of range; must be an integer in [1, ", max, "]");
}

// "1, 2, 3, 4, 6, 8, 12, ..." : the heads that would work, so the fix is one edit away.
std::string divisors_of(int n) {
  constexpr int kMaxListed = 16;
  std::string list;
  int listed = 0;
  for (int d = 1; d <= n; ++d) {
    if (n % d != 0) continue;
    if (listed == kMaxListed) return list + ", ...";
    if (listed > 0) list += ", ";
    list += std::to_string(d);
    ++listed;
  }
  return list;
}

}  // namespace

ModelType parse_model_type(std::string_view name) {
  if (const std::optional<ModelType> type = enum_from_name(kModelTypeNames, name)) return *type;
  fail("model.type = \"", name, "\" is not a model tandem knows; use ",
       enum_names_list(kModelTypeNames, " or "));
}

void ModelConfig::validate() const {
  check_range("vocab_size", vocab_size, kMaxVocabSize);
  check_range("context_length", context_length, kMaxContextLength);
  check_range("n_layer", n_layer, kMaxLayer);
  check_range("n_embd", n_embd, kMaxEmbd);
  check_range("n_head", n_head, n_embd);
  if (type == ModelType::kGpt2 || head_dim == 0)
    TANDEM_CHECK(n_embd % n_head == 0, "model.n_head = ", n_head,
                 " does not divide model.n_embd = ", n_embd, "; choose n_head among ",
                 divisors_of(n_embd));
  if (type == ModelType::kGpt2) {
    TANDEM_CHECK(n_kv_head == 0 || n_kv_head == n_head,
                 "GPT-2 has as many key/value heads as query heads; leave num_key_value_heads "
                 "out or use model.type \"llama\"");
    TANDEM_CHECK(intermediate_size == 0 || intermediate_size == 4 * n_embd,
                 "GPT-2's MLP is 4 * n_embd wide; leave intermediate_size out or use model.type "
                 "\"llama\"");
    TANDEM_CHECK(tie_word_embeddings, "GPT-2's LM head is tied to the token embedding");
    TANDEM_CHECK((head_dim == 0 || head_dim * n_head == n_embd) && !qkv_bias && !o_bias &&
                     !qk_norm && sliding_window == 0 && rope_scaling == RopeScaling{},
                 "GPT-2 has none of head_dim, attention biases of their own, q/k norms, a "
                 "sliding window or rotary scaling; use a model.type of the Llama family");
    return;
  }
  // The Llama family: rotary embeddings rotate pairs of a head's channels, so the head size
  // is even.
  if (head_dim != 0) check_range("head_dim", head_dim, kMaxEmbd);
  TANDEM_CHECK(
      head_size() % 2 == 0, "the head size ", head_size(),
      head_dim != 0 ? " (model.head_dim)" : " (model.hidden_size / model.num_attention_heads)",
      " is odd; rotary embeddings need an even head size");
  check_range("num_key_value_heads", kv_heads(), n_head);
  TANDEM_CHECK(n_head % kv_heads() == 0, "model.num_key_value_heads = ", kv_heads(),
               " does not divide model.num_attention_heads = ", n_head, "; choose it among ",
               divisors_of(n_head));
  check_range("intermediate_size", mlp_width(), 16 * kMaxEmbd);
  TANDEM_CHECK(std::isfinite(rms_norm_eps) && rms_norm_eps > 0,
               "model.rms_norm_eps = ", rms_norm_eps,
               " must be a number > 0 (Llama uses 1e-5 or 1e-6)");
  TANDEM_CHECK(std::isfinite(rope_theta) && rope_theta > 1, "model.rope_theta = ", rope_theta,
               " must be a number > 1 (Llama-2 uses 10000)");
  TANDEM_CHECK(!o_bias || qkv_bias,
               "an output projection bias without q, k and v biases is no model tandem knows");
  TANDEM_CHECK(sliding_window >= 0, "model.sliding_window = ", sliding_window,
               " must be a number of positions (or null: no window)");
  const RopeScaling& rope = rope_scaling;
  if (rope.type != RopeType::kDefault)
    TANDEM_CHECK(std::isfinite(rope.factor) && rope.factor > 0,
                 "model.rope_scaling.factor = ", rope.factor,
                 " must be a number > 0 (Llama 3.1 uses 8)");
  if (rope.type == RopeType::kLlama3) {
    TANDEM_CHECK(std::isfinite(rope.low_freq_factor) && std::isfinite(rope.high_freq_factor) &&
                     rope.low_freq_factor > 0 && rope.high_freq_factor > rope.low_freq_factor,
                 "model.rope_scaling: low_freq_factor = ", rope.low_freq_factor,
                 " and high_freq_factor = ", rope.high_freq_factor,
                 " must be numbers with 0 < low < high (Llama 3.1 uses 1 and 4)");
    TANDEM_CHECK(rope.original_max_position_embeddings >= 1,
                 "model.rope_scaling.original_max_position_embeddings = ",
                 rope.original_max_position_embeddings,
                 " must be the context the model was trained on before the scaling (Llama 3.1: "
                 "8192)");
  }
}

int64_t ModelConfig::num_parameters() const {
  const int64_t V = vocab_size, maxT = context_length, L = n_layer, C = n_embd;
  if (is_llama_family(type)) {
    const int64_t HS = head_size(), Q = static_cast<int64_t>(n_head) * HS;
    const int64_t KV = static_cast<int64_t>(kv_heads()) * HS, I = mlp_width();
    // Per block: input_layernorm (C) + q, o (2C*Q) + k, v (2C*KV) + post_attention_layernorm
    // (C) + gate, up, down (3C*I), and the options: q, k, v biases (Q + 2KV), o's (C), the
    // q and k norms (2HS).
    const int64_t per_layer = 2 * C + 2 * C * Q + 2 * C * KV + 3 * C * I +
                              (qkv_bias ? Q + 2 * KV : 0) + (o_bias ? C : 0) +
                              (qk_norm ? 2 * HS : 0);
    return V * C + L * per_layer + C /*norm*/ + (tie_word_embeddings ? 0 : V * C);
  }
  // Per block: ln_1 (2C) + c_attn (3C*C + 3C) + attn c_proj (C*C + C) + ln_2 (2C)
  //          + c_fc (4C*C + 4C) + mlp c_proj (4C*C + C) = 12C^2 + 13C.
  const int64_t per_layer = 12 * C * C + 13 * C;
  // wte doubles as the LM head (tied), so it is counted once; 2C is the final LayerNorm.
  return V * C + maxT * C + L * per_layer + 2 * C;
}

}  // namespace tandem

namespace tandem {

std::string describe_model_difference(const ModelConfig& a, const ModelConfig& b) {
  std::string diff;
  auto compare = [&](const char* key, const auto& x, const auto& y) {
    if (x != y) diff += cat(diff.empty() ? "" : ", ", "model.", key, " ", x, " vs ", y);
  };
  compare("type", model_type_name(a.type), model_type_name(b.type));
  compare("vocab_size", a.vocab_size, b.vocab_size);
  compare("context_length", a.context_length, b.context_length);
  compare("n_layer", a.n_layer, b.n_layer);
  compare("n_head", a.n_head, b.n_head);
  compare("n_embd", a.n_embd, b.n_embd);
  compare("num_key_value_heads", a.kv_heads(), b.kv_heads());
  compare("intermediate_size", a.mlp_width(), b.mlp_width());
  compare("rms_norm_eps", a.rms_norm_eps, b.rms_norm_eps);
  compare("rope_theta", a.rope_theta, b.rope_theta);
  compare("tie_word_embeddings", a.tie_word_embeddings, b.tie_word_embeddings);
  compare("head_dim", a.head_size(), b.head_size());
  compare("q, k, v biases", a.qkv_bias, b.qkv_bias);
  compare("o_proj bias", a.o_bias, b.o_bias);
  compare("q/k norms", a.qk_norm, b.qk_norm);
  compare("sliding_window", a.sliding_window, b.sliding_window);
  const RopeScaling &ra = a.rope_scaling, &rb = b.rope_scaling;
  compare("rope_scaling.rope_type", enum_name(kRopeTypeNames, ra.type),
          enum_name(kRopeTypeNames, rb.type));
  compare("rope_scaling.factor", ra.factor, rb.factor);
  compare("rope_scaling.low_freq_factor", ra.low_freq_factor, rb.low_freq_factor);
  compare("rope_scaling.high_freq_factor", ra.high_freq_factor, rb.high_freq_factor);
  compare("rope_scaling.original_max_position_embeddings", ra.original_max_position_embeddings,
          rb.original_max_position_embeddings);
  return diff;
}

}  // namespace tandem
