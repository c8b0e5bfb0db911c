#include "tandem/train/sampler.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/data/byte_tokenizer.h"

namespace tandem {

std::string sample_bytes(Model& model, std::string_view prompt, int num_bytes, Rng& rng,
                         float temperature) {
  TANDEM_CHECK(temperature > 0.0f, "temperature must be > 0, got ", temperature);
  TANDEM_CHECK(model.config().vocab_size == ByteTokenizer::kVocabSize,
               "sampling text needs a byte-level model (vocab_size 256); this one has ",
               model.config().vocab_size);
  const ByteTokenizer tokenizer;
  std::vector<int32_t> tokens = tokenizer.encode(prompt.empty() ? std::string_view("\n") : prompt);
  const int V = model.config().vocab_size;
  std::vector<double> probs(V);
  std::vector<int32_t> generated;
  for (int i = 0; i < num_bytes; i++) {
    const int T = static_cast<int>(std::min<size_t>(tokens.size(), model.max_seq_len()));
    const int32_t* context = tokens.data() + tokens.size() - T;
    model.forward(context, nullptr, 1, T);
    const std::vector<float> logits = model.logits_to_host();
    const float* last = logits.data() + static_cast<size_t>(T - 1) * V;
    const float max_logit = *std::max_element(last, last + V);
    double sum = 0.0;
    for (int v = 0; v < V; v++) sum += probs[v] = std::exp((last[v] - max_logit) / temperature);
    // Inverse-CDF sampling with one uniform draw.
    const double target = rng.uniform() * sum;
    double cumulative = 0.0;
    int32_t next = V - 1;
    for (int v = 0; v < V; v++) {
      cumulative += probs[v];
      if (target < cumulative) {
        next = v;
        break;
      }
    }
    tokens.push_back(next);
    generated.push_back(next);
  }
  return tokenizer.decode(generated);
}

}  // namespace tandem
