#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/cli/commands.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/core/rng.h"
#include "tandem/data/bpe_vocab.h"
#include "tandem/data/byte_tokenizer.h"
#include "tandem/model/model_family.h"
#include "tandem/train/sampler.h"

namespace tandem::cli {
namespace {

struct Args {
  std::string checkpoint;
  std::string prompt;
  int bytes = 300;
  float temperature = 1.0f;
  uint64_t seed = 1337;
  // Models of a BPE vocabulary (vocab_size not 256, or --tokenizer given).
  std::string tokenizer;
  std::string prompt_tokens;
  int tokens = 100;
  bool raw = false;  // the bytes as sampled, control bytes included
  // Which options the command line gave (CLI11 knows; the callback asks it here).
  bool gave_prompt = false, gave_bytes = false, gave_prompt_tokens = false, gave_tokens = false;
};

// "15496,11" -> {15496, 11}.
std::vector<int32_t> parse_token_ids(std::string_view list) {
  std::vector<int32_t> ids;
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string_view item = list.substr(begin, end - begin);
    int32_t id = -1;
    const auto [rest, error] = std::from_chars(item.data(), item.data() + item.size(), id);
    TANDEM_CHECK(error == std::errc() && rest == item.data() + item.size() && id >= 0,
                 "--prompt-tokens ", list, ": \"", item,
                 "\" is not a token id; expected non-negative integers separated by commas, "
                 "e.g. 15496,11");
    ids.push_back(id);
    begin = end + 1;
  }
  return ids;
}

// The prompt and what followed it, on stdout: printable (printable_text) unless --raw.
void print_sample(const Args& args, const std::string& prompt, const std::string& text) {
  const std::string out = args.raw ? prompt + text : printable_text(prompt + text);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fputc('\n', stdout);
}

// A model of a BPE vocabulary: samples token ids and prints them decoded with the
// tokenizer, or as ids without one. Its prompt is ids too: encoding text would need the
// tokenizer's pre-tokenizer regex, which tandem does not implement.
void sample_token_ids(const Args& args, const TrainingState& state) {
  const int vocab_size = state.config.model.vocab_size;
  TANDEM_CHECK(!args.gave_prompt,
               "--prompt takes text, which tandem cannot encode into this "
               "model's ",
               vocab_size,
               " BPE tokens; give the prompt's ids with --prompt-tokens "
               "(python3 -c \"import tokenizers; print(tokenizers.Tokenizer.from_file("
               "'tokenizer.json').encode('your text').ids)\")");
  TANDEM_CHECK(!args.gave_bytes,
               "--bytes counts the bytes of a byte-level model; this model's "
               "vocabulary is ",
               vocab_size, " tokens: use --tokens N");
  std::unique_ptr<BpeVocab> vocab;
  if (!args.tokenizer.empty()) vocab = std::make_unique<BpeVocab>(BpeVocab::load(args.tokenizer));
  std::vector<int32_t> prompt;
  if (args.gave_prompt_tokens) {
    prompt = parse_token_ids(args.prompt_tokens);
  } else {
    // A document's start is what follows an end-of-text token in the training data.
    TANDEM_CHECK(vocab != nullptr && vocab->end_of_text() >= 0,
                 "--prompt-tokens is needed: this model's vocabulary is ", vocab_size,
                 " tokens, not bytes, and ",
                 vocab ? args.tokenizer + " has no <|endoftext|> token to start from"
                       : std::string("without --tokenizer there is no end-of-text token to "
                                     "start from"),
                 " (e.g. --prompt-tokens 50256, GPT-2's <|endoftext|>)");
    prompt = {vocab->end_of_text()};
  }

  // Activations for the positions the sample can use, not the model's whole context: a
  // Llama 3's 131,072 positions would take tens of GB of logits alone.
  const auto positions = static_cast<int>(std::min<int64_t>(
      state.config.model.context_length, static_cast<int64_t>(prompt.size()) + args.tokens));
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> model = make_model(state.config.model, *backend, 1, positions);
  model->set_params(state.params);
  Rng rng(args.seed);
  if (vocab != nullptr) {
    const std::string prompt_text = vocab->decode(prompt);
    const std::string text =
        sample_text(*model, *vocab, prompt, args.tokens, rng, args.temperature);
    print_sample(args, prompt_text, text);
    return;
  }
  std::fprintf(stderr,
               "tandem: the model's vocabulary is %d tokens, not bytes: printing the sampled "
               "token ids (--tokenizer tokenizer.json decodes them)\n",
               vocab_size);
  const std::vector<int32_t> ids =
      sample_tokens(*model, prompt, args.tokens, rng, args.temperature);
  for (size_t i = 0; i < ids.size(); i++) std::printf(i ? " %d" : "%d", ids[i]);
  std::fputc('\n', stdout);
}

// The newest checkpoint at `path` whose weights verify, as --resume chooses: a damaged newer
// one is passed over, saying so on stderr.
std::filesystem::path intact_checkpoint(const std::string& path) {
  const ResumableCheckpoint chosen = newest_checkpoint_with_weights(path);
  if (!chosen.damaged.empty()) {
    std::string line = "tandem:";
    for (const DamagedCheckpoint& d : chosen.damaged)
      line += cat(" ", d.dir.filename().string(), " is damaged (", d.why, ");");
    line += cat(" sampling from ", chosen.dir.filename().string(), " instead\n");
    std::fputs(line.c_str(), stderr);
  }
  return chosen.dir;
}

}  // namespace

void register_sample(CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "A checkpoint dir, a checkpoints dir or a run dir (its latest checkpoint)")
      ->required();
  CLI::Option* prompt = cmd->add_option("--prompt", args->prompt,
                                        "Text to continue (byte-level models; default: a newline)");
  CLI::Option* bytes =
      cmd->add_option("--bytes", args->bytes, "Bytes to generate (byte-level models)")
          ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", args->temperature,
                  "Sampling temperature (0: greedy, the most likely token each time)")
      ->check(non_negative_number());
  cmd->add_option("--seed", args->seed, "Random seed");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "A byte-level BPE tokenizer.json (as tools/tokenize_bpe.py writes next to the "
                  "shards) to decode the model's tokens with");
  CLI::Option* prompt_tokens = cmd->add_option(
      "--prompt-tokens", args->prompt_tokens,
      "Token ids to continue, comma-separated (BPE models; default: the tokenizer's "
      "<|endoftext|>)");
  CLI::Option* tokens = cmd->add_option("--tokens", args->tokens, "Tokens to generate (BPE models)")
                            ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--raw", args->raw,
                "Print the sampled bytes as they are; by default a control byte or a byte that "
                "is not UTF-8 prints as \\xNN");
  cmd->callback([args, prompt, bytes, prompt_tokens, tokens] {
    args->gave_prompt = prompt->count() > 0;
    args->gave_bytes = bytes->count() > 0;
    args->gave_prompt_tokens = prompt_tokens->count() > 0;
    args->gave_tokens = tokens->count() > 0;
    const TrainingState state = load_checkpoint_weights(intact_checkpoint(args->checkpoint));
    if (!args->tokenizer.empty() || state.config.model.vocab_size != ByteTokenizer::kVocabSize) {
      sample_token_ids(*args, state);
      return;
    }
    TANDEM_CHECK(!args->gave_prompt_tokens && !args->gave_tokens,
                 "--prompt-tokens and --tokens are for models of a BPE vocabulary; this model is "
                 "byte-level (vocab_size 256): use --prompt TEXT and --bytes N");
    auto backend = make_cpu_backend();
    const std::unique_ptr<Model> model =
        make_model(state.config.model, *backend, 1, state.config.model.context_length);
    model->set_params(state.params);
    Rng rng(args->seed);
    const std::string text =
        sample_bytes(*model, args->prompt, args->bytes, rng, args->temperature);
    print_sample(*args, args->prompt, text);
  });
}

}  // namespace tandem::cli
