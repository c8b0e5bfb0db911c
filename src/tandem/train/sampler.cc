#include "tandem/train/sampler.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/data/byte_tokenizer.h"

namespace tandem {

std::string sample_bytes(Model& model, std::string_view prompt, int num_bytes, Rng& rng,
                         float temperature) {
  TANDEM_CHECK(temperature >= 0.0f, "temperature must be >= 0 (0: greedy), got ", temperature);
  TANDEM_CHECK(model.config().vocab_size == ByteTokenizer::kVocabSize,
               "sampling text needs a byte-level model (vocab_size 256); this one has ",
               model.config().vocab_size);
  const ByteTokenizer tokenizer;
  const std::vector<int32_t> tokens =
      tokenizer.encode(prompt.empty() ? std::string_view("\n") : prompt);
  return tokenizer.decode(sample_tokens(model, tokens, num_bytes, rng, temperature));
}

std::vector<int32_t> sample_tokens(Model& model, std::span<const int32_t> prompt, int num_tokens,
                                   Rng& rng, float temperature, int vocab_limit) {
  TANDEM_CHECK(temperature >= 0.0f, "temperature must be >= 0 (0: greedy), got ", temperature);
  const int V = model.config().vocab_size;
  TANDEM_CHECK(vocab_limit >= 0 && vocab_limit <= V, "sampling among the first ", vocab_limit,
               " ids of a model whose vocabulary is ", V, " ids");
  TANDEM_CHECK(!prompt.empty(), "sampling needs a prompt of at least one token");
  for (size_t i = 0; i < prompt.size(); i++)
    TANDEM_CHECK(prompt[i] >= 0 && prompt[i] < V, "prompt token id ", prompt[i], " at position ", i,
                 " is outside the model's vocabulary of ", V, " ids (0..", V - 1, ")");
  const int candidates = vocab_limit == 0 ? V : vocab_limit;
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  std::vector<double> probs(candidates);
  std::vector<int32_t> generated;
  for (int i = 0; i < num_tokens; i++) {
    const int T = static_cast<int>(std::min<size_t>(tokens.size(), model.max_seq_len()));
    const int32_t* context = tokens.data() + tokens.size() - T;
    model.forward(context, nullptr, 1, T);
    const std::vector<float> logits = model.logits_to_host();
    const float* last = logits.data() + static_cast<size_t>(T - 1) * V;
    const float* top = std::max_element(last, last + candidates);  // the first of equals
    if (temperature == 0.0f) {  // greedy, as transformers' generate(do_sample=False)
      tokens.push_back(static_cast<int32_t>(top - last));
      generated.push_back(tokens.back());
      continue;
    }
    const float max_logit = *top;
    double sum = 0.0;
    for (int v = 0; v < candidates; v++)
      sum += probs[v] = std::exp((last[v] - max_logit) / temperature);
    // Inverse-CDF sampling with one uniform draw.
    const double target = rng.uniform() * sum;
    double cumulative = 0.0;
    int32_t next = candidates - 1;
    for (int v = 0; v < candidates; v++) {
      cumulative += probs[v];
      if (target < cumulative) {
        next = v;
        break;
      }
    }
    tokens.push_back(next);
    generated.push_back(next);
  }
  return generated;
}

std::string sample_text(Model& model, const BpeVocab& vocab, std::span<const int32_t> prompt,
                        int num_tokens, Rng& rng, float temperature) {
  TANDEM_CHECK(vocab.size() <= model.config().vocab_size, "the tokenizer has ", vocab.size(),
               " ids but the model's vocabulary is ", model.config().vocab_size,
               " ids; use the tokenizer.json the model's training shards were made with");
  return vocab.decode(sample_tokens(model, prompt, num_tokens, rng, temperature, vocab.size()));
}

}  // namespace tandem
