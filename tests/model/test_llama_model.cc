// tandem's Llama on the CPU: finite differences of every tensor's gradient (grouped-query
// and multi-query heads, tied and untied heads, and the family's options: Qwen2's biases,
// Qwen3's q/k norms with heads wider than C / NH, Mistral's narrower heads, Llama 3's
// scaled rotation), gradients that accumulate, the blocks'
// gradients announced last layer first, the activation formula against what the model
// allocates, bf16 storage against fp32, and the config checks. The PyTorch comparison is
// test_llama_fixture.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "support/model_checks.h"
#include "support/test_util.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/core/rng.h"
#include "tandem/device/device.h"
#include "tandem/model/llama.h"
#include "tandem/model/model_family.h"

namespace tandem {
namespace {

struct Case {
  const char* name;
  ModelConfig config;
};

ModelConfig llama(int n_head, int n_kv_head, bool tied, int intermediate) {
  ModelConfig c;
  c.type = ModelType::kLlama;
  c.vocab_size = 29;
  c.context_length = 8;
  c.n_layer = 2;
  c.n_head = n_head;
  c.n_kv_head = n_kv_head;
  c.n_embd = 6 * n_head;  // head size 6: even, not a power of two
  c.intermediate_size = intermediate;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 100.0;  // large angles at 8 positions: every rotation matters
  c.tie_word_embeddings = tied;
  return c;
}

// The Llama family's options (model_config.h), each on a tiny model of its type.
ModelConfig with(ModelConfig c, ModelType type, const std::function<void(ModelConfig&)>& set) {
  c.type = type;
  set(c);
  c.validate();
  return c;
}

const Case kCases[] = {
    {"grouped_query_untied", llama(4, 2, false, 20)},
    {"multi_query_tied", llama(2, 1, true, 13)},
    {"qwen2_qkv_biases",
     with(llama(4, 2, false, 20), ModelType::kQwen2, [](ModelConfig& c) { c.qkv_bias = true; })},
    // Heads wider than C / NH (Q = 40 > C = 24), q/k norms, biases on q, k, v and o.
    {"qwen3_qk_norms_wide_heads", with(llama(4, 2, true, 20), ModelType::kQwen3,
                                       [](ModelConfig& c) {
                                         c.head_dim = 10;
                                         c.qk_norm = c.qkv_bias = c.o_bias = true;
                                       })},
    // Heads narrower than C / NH (Q = 16 < C = 24), a window no shorter than the sequence.
    {"mistral_narrow_heads", with(llama(4, 2, false, 20), ModelType::kMistral,
                                  [](ModelConfig& c) {
                                    c.head_dim = 4;
                                    c.sliding_window = 8;
                                  })},
    {"llama3_scaled_rotation", with(llama(4, 2, false, 20), ModelType::kLlama,
                                    [](ModelConfig& c) {
                                      c.rope_scaling = {.type = RopeType::kLlama3,
                                                        .factor = 4.0,
                                                        .low_freq_factor = 1.0,
                                                        .high_freq_factor = 4.0,
                                                        .original_max_position_embeddings = 16};
                                    })},
};

struct TinyLlama {
  std::unique_ptr<ComputeBackend> backend = make_cpu_backend();
  ModelConfig config;
  int B = 2, T = 7;
  Llama model;
  std::vector<int32_t> tokens, targets;
  std::vector<float> params, grads;

  explicit TinyLlama(const ModelConfig& c) : config(c), model(c, *backend, 2, 7) {
    Rng rng(42);
    for (int i = 0; i < B * T; i++) {
      tokens.push_back(static_cast<int32_t>(rng.next_u64() % config.vocab_size));
      targets.push_back(static_cast<int32_t>(rng.next_u64() % config.vocab_size));
    }
    // Random everything: norm weights away from 1 exercise every term of the backward.
    params.resize(model.layout().num_elements());
    for (const ParamView& view : model.layout().views())
      for (size_t i = 0; i < view.numel; i++)
        params[view.offset + i] = (view.shape.size() == 1 ? 1.0f : 0.0f) + 0.3f * rng.normal();
    model.set_params(params);
    model.zero_grads();
    model.forward(tokens.data(), targets.data(), B, T);
    model.backward();
    grads = model.grads_to_host();
  }
  double loss_at(const std::vector<float>& p) {
    model.set_params(p);
    return model.forward(tokens.data(), targets.data(), B, T);
  }
};

TEST(LlamaGradcheck, EveryTensorMatchesCentralDifferences) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    TinyLlama tiny(c.config);
    testing::expect_central_differences(
        tiny.model.layout(), tiny.params, tiny.grads,
        [&](const std::vector<float>& p) { return tiny.loss_at(p); });
  }
}

TEST(LlamaGradcheck, BackwardAccumulatesScaledGradients) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    TinyLlama tiny(c.config);
    tiny.model.zero_grads();
    for (int micro = 0; micro < 2; micro++) {
      tiny.model.forward(tiny.tokens.data(), tiny.targets.data(), tiny.B, tiny.T);
      tiny.model.backward(0.5f);
    }
    const std::vector<float> twice_half = tiny.model.grads_to_host();
    for (size_t i = 0; i < tiny.grads.size(); i++)
      ASSERT_NEAR(tiny.grads[i], twice_half[i], 1e-6f + 1e-5f * std::fabs(tiny.grads[i])) << i;
  }
}

TEST(LlamaModel, BackwardAnnouncesEachBlockOnceLastFirstAndTheyCoverTheLayout) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    TinyLlama tiny(c.config);
    std::vector<ParamRange> announced;
    tiny.model.forward(tiny.tokens.data(), tiny.targets.data(), tiny.B, tiny.T);
    tiny.model.backward(1.0f, [&](size_t begin, size_t end) { announced.push_back({begin, end}); });
    const std::vector<ParamRange>& blocks = tiny.model.blocks();
    ASSERT_EQ(announced.size(), blocks.size());
    ASSERT_EQ(blocks.size(), static_cast<size_t>(c.config.n_layer) + 2);
    for (size_t i = 0; i < blocks.size(); i++)
      EXPECT_EQ(announced[i], blocks[blocks.size() - 1 - i]);
    EXPECT_EQ(blocks.front().begin, 0u);
    EXPECT_EQ(blocks.back().end, tiny.model.layout().num_elements());
  }
}

TEST(LlamaModel, ActivationBytesFormulaMatchesWhatTheModelAllocates) {
  for (const Case& c : kCases) {
    for (const StorageDType dtype : {StorageDType::kF32, StorageDType::kBF16}) {
      auto backend = make_cpu_backend();
      Llama model(c.config, *backend, 3, 8, dtype);
      EXPECT_EQ(model.allocated_bytes(),
                2 * storage_dtype_bytes(dtype) * model.layout().num_elements() +
                    Llama::activation_bytes(c.config, 3, 8, dtype))
          << c.name;
      EXPECT_EQ(model_activation_bytes(c.config, 3, 8, dtype),
                Llama::activation_bytes(c.config, 3, 8, dtype));
    }
  }
}

TEST(LlamaModel, Bf16StorageTracksFp32WithinBf16Accuracy) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    TinyLlama fp32(c.config);
    auto backend = make_cpu_backend();
    Llama bf16(c.config, *backend, fp32.B, fp32.T, StorageDType::kBF16);
    bf16.set_params(fp32.params);
    bf16.zero_grads();
    const float loss32 =
        fp32.model.forward(fp32.tokens.data(), fp32.targets.data(), fp32.B, fp32.T);
    const float loss16 = bf16.forward(fp32.tokens.data(), fp32.targets.data(), fp32.B, fp32.T);
    EXPECT_NEAR(loss16, loss32, 2e-2 * loss32);
    EXPECT_NE(loss16, loss32) << "bf16 storage must round something";
    bf16.backward();
    const std::vector<float> g16 = bf16.grads_to_host();
    // Gradients agree as vectors: cosine similarity near 1 for every tensor.
    for (const ParamView& view : bf16.layout().views()) {
      double dot = 0, n32 = 0, n16 = 0;
      for (size_t i = view.offset; i < view.offset + view.numel; i++) {
        dot += static_cast<double>(fp32.grads[i]) * g16[i];
        n32 += static_cast<double>(fp32.grads[i]) * fp32.grads[i];
        n16 += static_cast<double>(g16[i]) * g16[i];
      }
      EXPECT_GT(dot / std::sqrt(n32 * n16), 0.99) << view.name;
    }
  }
}

TEST(LlamaModel, TheLayoutHasHuggingFaceNamesAndTheParameterCount) {
  const ModelConfig c = kCases[0].config;
  const ParamLayout layout = model_layout(c);
  EXPECT_EQ(layout.num_elements(), static_cast<size_t>(c.num_parameters()));
  EXPECT_EQ(layout.views().front().name, "model.embed_tokens.weight");
  EXPECT_EQ(layout.views().back().name, "lm_head.weight");
  const int HS = c.head_size();
  EXPECT_EQ(layout.at("model.layers.1.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{c.kv_heads() * HS, c.n_embd}));
  EXPECT_EQ(layout.at("model.layers.0.mlp.down_proj.weight").shape,
            (std::vector<int64_t>{c.n_embd, c.intermediate_size}));
  EXPECT_FALSE(layout.at("model.norm.weight").weight_decay);
  EXPECT_TRUE(layout.at("model.layers.0.self_attn.q_proj.weight").weight_decay);
  EXPECT_EQ(model_layout(kCases[1].config).find("lm_head.weight"), nullptr) << "tied";
}

TEST(LlamaModel, EveryOptionHasItsHuggingFaceTensorsAndTheParameterCount) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const ParamLayout layout = model_layout(c.config);
    EXPECT_EQ(layout.num_elements(), static_cast<size_t>(c.config.num_parameters()));
    const int64_t C = c.config.n_embd, HS = c.config.head_size();
    const int64_t Q = c.config.n_head * HS, KV = c.config.kv_heads() * HS;
    const std::string p = "model.layers.1.self_attn.";
    EXPECT_EQ(layout.at(p + "q_proj.weight").shape, (std::vector<int64_t>{Q, C}));
    EXPECT_EQ(layout.at(p + "o_proj.weight").shape, (std::vector<int64_t>{C, Q}));
    EXPECT_EQ(layout.find(p + "q_proj.bias") != nullptr, c.config.qkv_bias);
    EXPECT_EQ(layout.find(p + "v_proj.bias") != nullptr, c.config.qkv_bias);
    EXPECT_EQ(layout.find(p + "o_proj.bias") != nullptr, c.config.o_bias);
    EXPECT_EQ(layout.find(p + "q_norm.weight") != nullptr, c.config.qk_norm);
    if (c.config.qkv_bias) {
      EXPECT_EQ(layout.at(p + "k_proj.bias").shape, (std::vector<int64_t>{KV}));
    }
    if (c.config.qk_norm) {
      EXPECT_EQ(layout.at(p + "k_norm.weight").shape, (std::vector<int64_t>{HS}));
    }
  }
}

TEST(LlamaModel, ASequenceLongerThanTheSlidingWindowIsRefusedNamingIt) {
  ModelConfig mistral = kCases[4].config;
  mistral.sliding_window = 5;
  auto backend = make_cpu_backend();
  EXPECT_NO_THROW(Llama(mistral, *backend, 1, 5));
  const std::string message = testing::error_of([&] { Llama(mistral, *backend, 1, 6); });
  EXPECT_NE(message.find("model.sliding_window = 5 is shorter than the sequence (6 positions)"),
            std::string::npos)
      << message;
}

TEST(LlamaModel, BadConfigsAreRefusedNamingTheField) {
  auto message = [](ModelConfig c) { return testing::error_of([&] { c.validate(); }); };
  ModelConfig c = kCases[0].config;
  c.n_kv_head = 3;
  EXPECT_NE(message(c).find("num_key_value_heads = 3 does not divide"), std::string::npos)
      << message(c);
  c = kCases[0].config;
  c.n_embd = 20;  // head size 5: odd
  EXPECT_NE(message(c).find("is odd; rotary embeddings need an even head size"), std::string::npos)
      << message(c);
  c = kCases[0].config;
  c.rms_norm_eps = 0;
  EXPECT_NE(message(c).find("model.rms_norm_eps"), std::string::npos) << message(c);
  c = kCases[0].config;
  c.o_bias = true;  // without q, k, v biases
  EXPECT_NE(message(c).find("an output projection bias without"), std::string::npos) << message(c);
  c = kCases[0].config;
  c.rope_scaling = {.type = RopeType::kLlama3,
                    .factor = 8.0,
                    .low_freq_factor = 4.0,
                    .high_freq_factor = 1.0,
                    .original_max_position_embeddings = 8192};
  EXPECT_NE(message(c).find("must be numbers with 0 < low < high"), std::string::npos)
      << message(c);
  c = kCases[0].config;
  c.head_dim = 7;
  EXPECT_NE(message(c).find("the head size 7 (model.head_dim) is odd"), std::string::npos)
      << message(c);
  ModelConfig gpt;
  gpt.qk_norm = true;
  EXPECT_NE(message(gpt).find("GPT-2 has none of head_dim"), std::string::npos) << message(gpt);
  gpt = ModelConfig{};
  gpt.n_kv_head = 2;
  EXPECT_NE(message(gpt).find("GPT-2 has as many key/value heads"), std::string::npos)
      << message(gpt);
}

TEST(LlamaModel, TheRotaryTableIsHuggingFacesFp32Angles) {
  ModelConfig c = kCases[0].config;
  c.rope_theta = 10000.0;
  const std::vector<float> table = rope_cos_sin(c, 5);
  const int half = c.head_size() / 2;
  ASSERT_EQ(table.size(), static_cast<size_t>(5 * half * 2));
  for (int t = 0; t < 5; t++) {
    for (int i = 0; i < half; i++) {
      const double angle = t * std::pow(10000.0, -2.0 * i / c.head_size());
      EXPECT_NEAR(table[(t * half + i) * 2], std::cos(angle), 1e-6);
      EXPECT_NEAR(table[(t * half + i) * 2 + 1], std::sin(angle), 1e-6);
    }
  }
  EXPECT_EQ(table[0], 1.0f);  // position 0 does not turn
  EXPECT_EQ(table[1], 0.0f);
}

}  // namespace
}  // namespace tandem
