#include "tandem/model/gpt_config.h"

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

void GptConfig::validate() const {
  check_range("vocab_size", vocab_size, kMaxVocabSize);
  check_range("context_length", context_length, kMaxContextLength);
  check_range("n_layer", n_layer, kMaxLayer);
  check_range("n_embd", n_embd, kMaxEmbd);
  check_range("n_head", n_head, n_embd);
  TANDEM_CHECK(n_embd % n_head == 0, "model.n_head = ", n_head,
               " does not divide model.n_embd = ", n_embd, "; choose n_head among ",
               divisors_of(n_embd));
}

int64_t GptConfig::num_parameters() const {
  const int64_t V = vocab_size, maxT = context_length, L = n_layer, C = n_embd;
  // Per block: ln_1 (2C) + c_attn (3C*C + 3C) + attn c_proj (C*C + C) + ln_2 (2C)
  //          + c_fc (4C*C + 4C) + mlp c_proj (4C*C + C) = 12C^2 + 13C.
  const int64_t per_layer = 12 * C * C + 13 * C;
  // wte doubles as the LM head (tied), so it is counted once; 2C is the final LayerNorm.
  return V * C + maxT * C + L * per_layer + 2 * C;
}

}  // namespace tandem
