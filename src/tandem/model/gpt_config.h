// Hyper-parameters of a GPT-2 style model.
#pragma once

#include <cstdint>

namespace tandem {

struct GptConfig {
  int vocab_size = 256;      // V: number of token ids
  int context_length = 256;  // maxT: learned position embeddings
  int n_layer = 6;           // L: transformer blocks
  int n_head = 6;            // NH: attention heads; n_embd % n_head == 0
  int n_embd = 384;          // C: channels

  int head_size() const { return n_embd / n_head; }
  // Throws tandem::Error naming the offending field ("model.n_head") and what is allowed.
  void validate() const;
  // Total number of parameters (token and position embeddings included, LM head tied).
  int64_t num_parameters() const;
};

}  // namespace tandem
