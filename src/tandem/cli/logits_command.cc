// `tandem logits`: the logits a checkpoint's model gives a token sequence, written as
// safetensors (tokens I32 [1, T], logits F32 [1, T, V]). What tools/check_hf_load.py
// compares with the same checkpoint loaded in Hugging Face transformers: tandem's own, or a
// Hugging Face model directory (what transformers' save_pretrained writes).
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/ckpt/hf_weights.h"
#include "tandem/ckpt/init_from.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/cli/commands.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/core/error.h"
#include "tandem/model/model_family.h"

namespace tandem::cli {
namespace {

// "15496,11,995" -> {15496, 11, 995}; each id named when it is not one.
std::vector<int32_t> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(item, &used);
    } catch (const std::exception&) {
    }
    TANDEM_CHECK(used == item.size() && id >= 0 && id <= INT32_MAX, "--tokens: '", item,
                 "' is not a token id; give non-negative integers separated by commas");
    ids.push_back(static_cast<int32_t>(id));
  }
  TANDEM_CHECK(!ids.empty(), "--tokens is empty; give token ids separated by commas");
  return ids;
}

}  // namespace

void register_logits(CLI::App& app) {
  struct Args {
    std::string checkpoint, tokens, output;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "logits", "Write the logits a checkpoint's model gives a token sequence (safetensors)");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "A checkpoint dir, a checkpoints dir, a run dir (its latest checkpoint) or a "
                  "Hugging Face model dir (config.json and safetensors weights)")
      ->required();
  cmd->add_option("--tokens", args->tokens, "Token ids, comma separated")->required();
  cmd->add_option("--output", args->output, "The safetensors file to write")->required();
  cmd->callback([args] {
    const std::vector<int32_t> tokens = parse_token_ids(args->tokens);
    // A Hugging Face model directory (no tandem manifest, a config.json): its model as
    // `train.init_from` reads it, and its weights, so that a model transformers saved can be
    // compared too.
    const std::filesystem::path dir = args->checkpoint;
    const bool hugging_face = std::filesystem::exists(dir / "config.json") &&
                              !std::filesystem::exists(dir / "manifest.json");
    ModelConfig model_config;
    std::vector<float> params;
    if (hugging_face) {
      model_config = read_hf_model_config(dir, "--checkpoint");
      const ParamLayout layout = model_layout(model_config);
      params.resize(layout.num_elements());
      try {
        read_hf_weights(dir, layout, params.data());
      } catch (const Error& e) {
        fail("--checkpoint ", dir.string(), ": ", e.what());
      }
    } else {
      TrainingState state = load_checkpoint_weights(args->checkpoint);
      model_config = state.config.model;
      params = std::move(state.params);
    }
    const int T = static_cast<int>(tokens.size());
    TANDEM_CHECK(T <= model_config.context_length, "--tokens: ", T,
                 " tokens exceed the model's context of ", model_config.context_length);
    auto backend = make_cpu_backend();
    const std::unique_ptr<Model> model = make_model(model_config, *backend, 1, T);
    model->set_params(params);
    model->forward(tokens.data(), nullptr, 1, T);
    const std::vector<float> logits = model->logits_to_host();
    SafetensorsWriter writer;
    writer.add("tokens", DType::kI32, {1, T}, tokens.data());
    writer.add("logits", DType::kF32, {1, T, model_config.vocab_size}, logits.data());
    writer.write(args->output);
  });
}

}  // namespace tandem::cli
