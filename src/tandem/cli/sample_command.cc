#include <cstdio>
#include <memory>
#include <string>

#include "tandem/cli/commands.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/core/rng.h"
#include "tandem/model/model_family.h"
#include "tandem/train/sampler.h"
#include "tandem/train/train_checkpoint.h"

namespace tandem::cli {

void register_sample(CLI::App& app) {
  struct Args {
    std::string checkpoint;
    std::string prompt;
    int bytes = 300;
    float temperature = 1.0f;
    uint64_t seed = 1337;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "A checkpoint dir, a checkpoints dir or a run dir (its latest checkpoint)")
      ->required();
  cmd->add_option("--prompt", args->prompt, "Text to continue (default: a newline)");
  cmd->add_option("--bytes", args->bytes, "Bytes to generate")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", args->temperature, "Sampling temperature (> 0)")
      ->check(positive_number());
  cmd->add_option("--seed", args->seed, "Random seed");
  cmd->callback([args] {
    const TrainingState state = load_checkpoint_weights(args->checkpoint);
    auto backend = make_cpu_backend();
    const std::unique_ptr<Model> model =
        make_model(state.config.model, *backend, 1, state.config.model.context_length);
    model->set_params(state.params);
    Rng rng(args->seed);
    const std::string text =
        sample_bytes(*model, args->prompt, args->bytes, rng, args->temperature);
    std::fwrite(args->prompt.data(), 1, args->prompt.size(), stdout);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  });
}

}  // namespace tandem::cli
