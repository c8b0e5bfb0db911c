// Sampling from models of a BPE vocabulary: the sampler draws token ids (only the
// tokenizer's, when the model's vocabulary is padded past it) and decodes them with a
// tokenizer.json; `tandem sample` prints them decoded with --tokenizer, as ids without.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/byte_level_vocab.h"
#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/core/file_io.h"
#include "tandem/core/format.h"
#include "tandem/core/rng.h"
#include "tandem/data/bpe_vocab.h"
#include "tandem/data/byte_tokenizer.h"
#include "tandem/data/token_shard.h"
#include "tandem/model/gpt.h"
#include "tandem/train/sampler.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::added_token;
using testing::byte_level_tokenizer;
using testing::error_of;

// Eight tokens: "a", "b", " ", "\n", "ab", the two bytes of "é", and <|endoftext|>.
BpeVocab eight_token_vocab() {
  const json vocab = {{"a", 0}, {"b", 1}, {"Ġ", 2}, {"Ċ", 3}, {"ab", 4}, {"Ã", 5}, {"©", 6}};
  return BpeVocab::parse(
      byte_level_tokenizer(vocab, json::array({added_token(7, "<|endoftext|>")})).dump(),
      "eight.json");
}

// A random GPT-2 of the given vocabulary: its logits are nearly equal, so sampling
// reaches every id.
struct TinyModel {
  explicit TinyModel(int vocab_size)
      : backend(make_cpu_backend()),
        model(ModelConfig{.vocab_size = vocab_size,
                          .context_length = 8,
                          .n_layer = 1,
                          .n_head = 2,
                          .n_embd = 16},
              *backend, 1, 8) {
    model.init_weights(11);
  }
  std::unique_ptr<ComputeBackend> backend;
  Gpt model;
};

TEST(SampleTokens, SampleTextDecodesTheIdsSampleTokensDraws) {
  const BpeVocab vocab = eight_token_vocab();
  TinyModel tiny(vocab.size());
  const std::vector<int32_t> prompt = {vocab.end_of_text()};
  Rng a(5), b(5);
  const std::vector<int32_t> ids = sample_tokens(tiny.model, prompt, 40, a);
  ASSERT_EQ(ids.size(), 40u);
  std::set<int32_t> seen(ids.begin(), ids.end());
  EXPECT_GE(seen.size(), 5u) << "a near-uniform model draws most of the 8 ids in 40 tokens";
  // What the ids spell, token by token, from the table above.
  const char* spelled[] = {"a", "b", " ", "\n", "ab", "\xC3", "\xA9", "<|endoftext|>"};
  std::string expected;
  for (int32_t id : ids) expected += spelled[id];
  EXPECT_EQ(sample_text(tiny.model, vocab, prompt, 40, b), expected);
}

TEST(SampleTokens, APaddedVocabularyDrawsOnlyTheTokenizersIds) {
  const BpeVocab vocab = eight_token_vocab();
  TinyModel tiny(12);  // 4 padding rows, as llm.c pads 50257 to 50304
  const std::vector<int32_t> prompt = {0};
  Rng a(9);
  const std::vector<int32_t> unrestricted = sample_tokens(tiny.model, prompt, 60, a);
  EXPECT_TRUE(std::any_of(unrestricted.begin(), unrestricted.end(), [](int32_t id) {
    return id >= 8;
  })) << "without a limit the padding rows are drawn too (so the check below means something)";
  Rng b(9);
  const std::vector<int32_t> limited = sample_tokens(tiny.model, prompt, 60, b, 1.0f, 8);
  EXPECT_TRUE(std::all_of(limited.begin(), limited.end(), [](int32_t id) { return id < 8; }));
  Rng c(9);
  EXPECT_EQ(sample_text(tiny.model, vocab, prompt, 60, c), vocab.decode(limited));
}

TEST(SampleTokens, TheBytePathIsTheTokenPathOnBytes) {
  TinyModel tiny(ByteTokenizer::kVocabSize);
  Rng a(3), b(3);
  const std::string text = sample_bytes(tiny.model, "ab", 30, a, 0.8f);
  const std::vector<int32_t> ids =
      sample_tokens(tiny.model, std::vector<int32_t>{'a', 'b'}, 30, b, 0.8f);
  EXPECT_EQ(text, ByteTokenizer().decode(ids));
}

TEST(SampleTokens, BadInputIsNamed) {
  const BpeVocab vocab = eight_token_vocab();
  TinyModel small(6);
  Rng rng(1);
  EXPECT_CONTAINS(
      error_of([&] { sample_text(small.model, vocab, std::vector<int32_t>{0}, 3, rng); }),
      "the tokenizer has 8 ids but the model's vocabulary is 6 ids");
  EXPECT_CONTAINS(error_of([&] {
                    sample_tokens(small.model, std::vector<int32_t>{1, 6}, 3, rng);
                  }),
                  "prompt token id 6 at position 1 is outside the model's vocabulary of 6 ids");
  EXPECT_CONTAINS(error_of([&] { sample_tokens(small.model, std::vector<int32_t>{}, 3, rng); }),
                  "sampling needs a prompt of at least one token");
  EXPECT_CONTAINS(
      error_of([&] { sample_tokens(small.model, std::vector<int32_t>{0}, 3, rng, -1.0f); }),
      "temperature must be >= 0 (0: greedy)");
}

// `tandem sample` on a checkpoint of a 260-token model (bytes, three merges and
// <|endoftext|>) trained on a byte shard.
class SampleCommand : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::ScratchDir("sample_tokenizer");
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[testing::gpt2_byte_token(static_cast<uint8_t>(b))] = b;
    vocab["Ġt"] = 256;
    vocab["he"] = 257;
    vocab["Ġthe"] = 258;
    write_file_atomic(
        *dir_ / "tokenizer.json",
        byte_level_tokenizer(vocab, json::array({added_token(259, "<|endoftext|>")})).dump());
    const std::string text =
        read_file_text(testing::source_dir() / "data" / "tinyshakespeare.txt").substr(0, 20000);
    write_token_shard(*dir_ / "train.bin", ByteTokenizer().encode(text), ShardTokenType::kUint16);
    json config = testing::tiny_run_config(*dir_ / "train.bin", *dir_ / "run");
    config["model"]["vocab_size"] = 260;
    config["train"]["steps"] = 10;
    config["train"]["sample_bytes"] = 20;  // not bytes: a note, not an error at the end
    write_file_atomic(*dir_ / "config.json", config.dump(2));
    train_output_ =
        new testing::CommandResult(tandem("train --config " + (*dir_ / "config.json").string()));
  }
  static void TearDownTestSuite() {
    delete train_output_;
    delete dir_;
  }

  static testing::CommandResult tandem(const std::string& args) {
    return testing::run_command(testing::tandem_binary().string() + " " + args + " </dev/null");
  }
  // stdout alone (stderr to a file), and the exit status.
  static testing::CommandResult tandem_stdout(const std::string& args, const fs::path& err) {
    return testing::run_command(cat("(", testing::tandem_binary().string(), " ", args,
                                    " </dev/null 2>", err.string(), ")"));
  }
  static std::string sample_args(const std::string& more) {
    return "sample --checkpoint " + (*dir_ / "run").string() + " --seed 3 " + more;
  }

  static testing::ScratchDir* dir_;
  static testing::CommandResult* train_output_;
};
testing::ScratchDir* SampleCommand::dir_ = nullptr;
testing::CommandResult* SampleCommand::train_output_ = nullptr;

// The byte-level spelling above, decoded by hand.
std::string spell(const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) {
    if (id < 256) text += static_cast<char>(id);
    if (id == 256) text += " t";
    if (id == 257) text += "he";
    if (id == 258) text += " the";
    if (id == 259) text += "<|endoftext|>";
  }
  return text;
}

TEST_F(SampleCommand, TrainingANonByteModelEndsWithANoteNotAnError) {
  ASSERT_EQ(train_output_->exit_code, 0) << train_output_->output;
  EXPECT_CONTAINS(train_output_->output,
                  "no sample at the end: the model's 260 tokens are not "
                  "bytes");
}

TEST_F(SampleCommand, PrintsIdsWithoutATokenizerAndTextWithOne) {
  ASSERT_EQ(train_output_->exit_code, 0) << train_output_->output;
  const fs::path err = *dir_ / "stderr.txt";
  const auto ids_run = tandem_stdout(sample_args("--prompt-tokens 72,105 --tokens 12"), err);
  ASSERT_EQ(ids_run.exit_code, 0) << ids_run.output << read_file_text(err);
  EXPECT_CONTAINS(read_file_text(err),
                  "the model's vocabulary is 260 tokens, not bytes: printing "
                  "the sampled token ids (--tokenizer tokenizer.json");
  std::istringstream in(ids_run.output);
  std::vector<int32_t> ids;
  for (int32_t id; in >> id;) ids.push_back(id);
  ASSERT_EQ(ids.size(), 12u) << ids_run.output;
  for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < 260) << id;
  EXPECT_EQ(ids_run.output.back(), '\n');

  // The same seed with the tokenizer: the prompt and the same ids, decoded.
  const auto text_run =
      tandem_stdout(sample_args("--prompt-tokens 72,105 --tokens 12 --tokenizer " +
                                (*dir_ / "tokenizer.json").string()),
                    err);
  ASSERT_EQ(text_run.exit_code, 0) << text_run.output << read_file_text(err);
  // Decoded bytes that are not printable text print as \xNN; --raw prints them as they are.
  EXPECT_EQ(text_run.output, printable_text("Hi" + spell(ids)) + "\n");
  EXPECT_EQ(read_file_text(err), "");
  const auto raw_run =
      tandem_stdout(sample_args("--prompt-tokens 72,105 --tokens 12 --raw --tokenizer " +
                                (*dir_ / "tokenizer.json").string()),
                    err);
  ASSERT_EQ(raw_run.exit_code, 0) << raw_run.output << read_file_text(err);
  EXPECT_EQ(raw_run.output, "Hi" + spell(ids) + "\n");

  // Without --prompt-tokens the tokenizer's <|endoftext|> starts the sample.
  const auto from_eot = tandem_stdout(
      sample_args("--tokens 5 --tokenizer " + (*dir_ / "tokenizer.json").string()), err);
  ASSERT_EQ(from_eot.exit_code, 0) << from_eot.output << read_file_text(err);
  EXPECT_EQ(from_eot.output.rfind("<|endoftext|>", 0), 0u) << from_eot.output;
}

TEST_F(SampleCommand, BadOptionsAreNamed) {
  ASSERT_EQ(train_output_->exit_code, 0) << train_output_->output;
  const std::string tokenizer = " --tokenizer " + (*dir_ / "tokenizer.json").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--prompt Hi",
       "--prompt takes text, which tandem cannot encode into this model's 260 BPE "
       "tokens; give the prompt's ids with --prompt-tokens"},
      {"--prompt-tokens 72 --bytes 5", "--bytes counts the bytes of a byte-level model"},
      {"--prompt-tokens 72,x", "--prompt-tokens 72,x: \"x\" is not a token id"},
      {"--prompt-tokens 260",
       "prompt token id 260 at position 0 is outside the model's "
       "vocabulary of 260 ids"},
      {"--tokens 3", "--prompt-tokens is needed: this model's vocabulary is 260 tokens"},
      {"--tokenizer " + (*dir_ / "absent.json").string(), "absent.json: no such tokenizer file"},
      {"--tokenizer " + (*dir_ / "config.json").string(),
       "config.json: \"model\" has no \"type\" and no \"merges\", so this is not a Hugging "
       "Face tokenizer.json"},
  };
  for (const auto& [args, message] : cases) {
    const auto result = tandem(sample_args(args));
    EXPECT_NE(result.exit_code, 0) << args;
    EXPECT_CONTAINS(result.output, "tandem: error: ");
    EXPECT_CONTAINS(result.output, message);
  }
  // A tokenizer of more ids than the model has.
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[testing::gpt2_byte_token(static_cast<uint8_t>(b))] = b;
  write_file_atomic(
      *dir_ / "big.json",
      byte_level_tokenizer(vocab, json::array({added_token(299, "<|endoftext|>")})).dump());
  const auto big = tandem(sample_args("--tokenizer " + (*dir_ / "big.json").string()));
  EXPECT_NE(big.exit_code, 0);
  EXPECT_CONTAINS(big.output, "the tokenizer has 300 ids but the model's vocabulary is 260 ids");
}

}  // namespace
}  // namespace tandem
