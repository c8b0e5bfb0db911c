// tools/tokenize_bpe.py end to end: a byte-level BPE trained here with the `tokenizers`
// package (tests/runs/tokenize_bpe_helper.py) tokenizes text files into llm.c shards; tandem
// reads the shards back (read_token_shard), finds the ids `tokenizers` gives for the whole
// text, and its decoder (BpeVocab) turns them back into the text. Skipped, saying why,
// where python3 has no `tokenizers` (`make test` installs it: the Makefile's pydeps); the
// tiktoken cases likewise without `tiktoken`, and GPT-2's own encoding where tiktoken
// cannot download it.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "support/test_util.h"
#include "tandem/core/file_io.h"
#include "tandem/core/rng.h"
#include "tandem/data/bpe_vocab.h"
#include "tandem/data/dataset.h"
#include "tandem/data/token_shard.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::run_command;

const std::string kPython = "python3";

std::string tool() { return (testing::source_dir() / "tools" / "tokenize_bpe.py").string(); }
std::string helper() {
  return (testing::source_dir() / "tests" / "runs" / "tokenize_bpe_helper.py").string();
}

// Why `python3 -c "import MODULE"` fails (the error's last line), or "" when it works.
std::string missing_module(const std::string& module) {
  auto result = run_command(kPython + " -c 'import " + module + "'");
  if (result.exit_code == 0) return "";
  std::string& why = result.output;
  while (!why.empty() && why.back() == '\n') why.pop_back();
  why = why.substr(why.rfind('\n') == std::string::npos ? 0 : why.rfind('\n') + 1);
  return cat(kPython, " cannot import ", module, " (", why, "); install it with: ", kPython,
             " -m pip install ", module, " (`make test` does, through the Makefile's pydeps)");
}

// Three documents of made-up text with what tokenizers trip on: multi-byte UTF-8 (two,
// three and four bytes), spaces before newlines (which GPT-2's regex splits differently
// when the text is cut after the newline), CRLF, tabs, indentation, digits, contractions.
std::vector<std::string> make_documents() {
  const std::vector<std::string> words = {"the",  "tandem", "optimizer", "state", "café", "naïve",
                                          "über", "日本語", "😀",         "don't", "it's", "2024",
                                          "1337", "x",      "(a+b)",     "--",    "...",  "émigré"};
  const std::vector<std::string> line_ends = {"\n", " \n", "  \n", "\r\n", "\n\n", "\t\n"};
  const std::vector<std::string> line_starts = {"", "", "", " ", "    ", "\t"};
  Rng rng(2024);
  std::vector<std::string> documents(3);
  for (size_t d = 0; d < documents.size(); ++d) {
    for (int line = 0; line < 250 + 100 * static_cast<int>(d); ++line) {
      std::string text = line_starts[rng.next_u64() % line_starts.size()];
      const int n = 1 + static_cast<int>(rng.next_u64() % 9);
      for (int w = 0; w < n; ++w) text += (w ? " " : "") + words[rng.next_u64() % words.size()];
      documents[d] += text + line_ends[rng.next_u64() % line_ends.size()];
    }
  }
  return documents;
}

// The magic (header word 0) of a shard.
int32_t shard_magic(const fs::path& path) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  return static_cast<int32_t>(bytes[0] | bytes[1] << 8 | bytes[2] << 16 | bytes[3] << 24);
}

class TokenizeBpe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_reason_ = new std::string(missing_module("tokenizers"));
    dir_ = new testing::ScratchDir("tokenize_bpe");
    documents_ = new std::vector<std::string>(make_documents());
    if (!skip_reason_->empty()) return;
    for (size_t d = 0; d < documents_->size(); ++d) write_file_atomic(doc(d), (*documents_)[d]);
    train_ = new testing::CommandResult(
        run_command(cat(kPython, " ", helper(), " train ", tokenizer(), " 400 ", docs())));
  }
  static void TearDownTestSuite() {
    delete train_;
    delete documents_;
    delete dir_;
    delete skip_reason_;
  }
  void SetUp() override {
    if (!skip_reason_->empty()) GTEST_SKIP() << *skip_reason_;
    ASSERT_EQ(train_->exit_code, 0) << train_->output;
  }

  static fs::path doc(size_t d) { return *dir_ / cat("doc", d, ".txt"); }
  static std::string docs() { return cat(doc(0), " ", doc(1), " ", doc(2)); }
  static fs::path tokenizer() { return *dir_ / "trained.json"; }

  // The documents as the tool writes them with --eot: <|endoftext|> between them.
  static std::string joined_with_eot() {
    return (*documents_)[0] + "<|endoftext|>" + (*documents_)[1] + "<|endoftext|>" +
           (*documents_)[2];
  }

  // The JSON a helper command writes: `helper COMMAND OUT ARGS`.
  static json helper_json(const std::string& command, const std::string& args,
                          const std::string& env = "") {
    const fs::path out = *dir_ / "helper.json";
    const auto result =
        run_command(cat(env, kPython, " ", helper(), " ", command, " ", out, " ", args));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return result.exit_code == 0 ? json::parse(read_file_text(out)) : json();
  }
  static fs::path shard(const fs::path& dir, const std::string& name, const char* split, int k) {
    char file[128];
    std::snprintf(file, sizeof file, "%s_%s_%06d.bin", name.c_str(), split, k);
    return dir / file;
  }
  // Every shard of `name` in `dir`: val, then train from index `first_train`.
  static std::vector<int32_t> read_all(const fs::path& dir, const std::string& name,
                                       int first_train, int* train_shards = nullptr) {
    std::vector<int32_t> ids;
    if (fs::exists(shard(dir, name, "val", 0))) ids = read_token_shard(shard(dir, name, "val", 0));
    int k = first_train;
    for (; fs::exists(shard(dir, name, "train", k)); ++k) {
      const std::vector<int32_t> part = read_token_shard(shard(dir, name, "train", k));
      ids.insert(ids.end(), part.begin(), part.end());
    }
    if (train_shards != nullptr) *train_shards = k - first_train;
    return ids;
  }
  // Expected ids: each document's, joined by the end-of-text id.
  static std::vector<int32_t> join(const json& per_document, int32_t eot) {
    std::vector<int32_t> ids;
    for (size_t d = 0; d < per_document.size(); ++d) {
      if (d > 0) ids.push_back(eot);
      for (const auto& id : per_document[d]) ids.push_back(id.get<int32_t>());
    }
    return ids;
  }

  static std::string* skip_reason_;
  static testing::ScratchDir* dir_;
  static std::vector<std::string>* documents_;
  static testing::CommandResult* train_;
};
std::string* TokenizeBpe::skip_reason_ = nullptr;
testing::ScratchDir* TokenizeBpe::dir_ = nullptr;
std::vector<std::string>* TokenizeBpe::documents_ = nullptr;
testing::CommandResult* TokenizeBpe::train_ = nullptr;

TEST_F(TokenizeBpe, ShardsHoldTheIdsOfTokenizersAndDecodeToTheText) {
  const fs::path out = *dir_ / "hf";
  const auto run = run_command(cat(kPython, " ", tool(), " --tokenizer ", tokenizer(),
                                   " --output-dir ", out, " --name corpus --eot --val-tokens 500 ",
                                   "--shard-tokens 4000 --chunk-bytes 256 ", docs()));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, "tandem train --config FILE --set data.train_path=");

  // The first 500 tokens in the val shard, then train shards of 4000 but the last.
  EXPECT_EQ(read_token_shard(shard(out, "corpus", "val", 0)).size(), 500u);
  EXPECT_EQ(shard_magic(shard(out, "corpus", "val", 0)), kShardMagicUint16);
  int train_shards = 0;
  const std::vector<int32_t> ids = read_all(out, "corpus", 1, &train_shards);
  ASSERT_GE(train_shards, 2) << run.output;
  for (int k = 1; k <= train_shards; ++k) {
    const size_t n = read_token_shard(shard(out, "corpus", "train", k)).size();
    if (k < train_shards) {
      EXPECT_EQ(n, 4000u) << k;
    }
    EXPECT_LE(n, 4000u) << k;
  }

  // The ids `tokenizers` gives each whole document (so cutting the text into 256-byte
  // pieces changed nothing), <|endoftext|> (id 0) between them.
  const json expected = helper_json("encode", cat(tokenizer(), " ", docs()));
  ASSERT_FALSE(expected.is_null());
  EXPECT_EQ(ids, join(expected["whole"], 0));
  // Cutting at every newline would change them, so that check can fail.
  EXPECT_NE(expected["whole"], expected["by_line"]);

  // tandem's decoder gives the text back, byte for byte, from the tokenizer.json written
  // next to the shards.
  const BpeVocab vocab = BpeVocab::load(out / "tokenizer.json");
  EXPECT_EQ(vocab.size(), expected["vocab_size"].get<int>());
  EXPECT_EQ(vocab.decode(ids), joined_with_eot());

  // The trainer's loader takes the shards as they are.
  const TokenSplit split = load_dataset(shard(out, "corpus", "train", 1).string(),
                                        shard(out, "corpus", "val", 0).string(), 0.0, vocab.size());
  EXPECT_EQ(split.val.size(), 500u);
  EXPECT_EQ(split.train.size(), 4000u);
}

TEST_F(TokenizeBpe, Uint32ShardsOnRequest) {
  const fs::path out = *dir_ / "u32";
  const auto run = run_command(cat(kPython, " ", tool(), " --tokenizer ", tokenizer(),
                                   " --output-dir ", out, " --dtype uint32 --quiet ", docs()));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output, "") << "--quiet";
  // One shard (the default), named after the first input, no separators without --eot.
  const fs::path only = shard(out, "doc0", "train", 0);
  EXPECT_EQ(shard_magic(only), kShardMagicUint32);
  EXPECT_FALSE(fs::exists(shard(out, "doc0", "train", 1)));
  const std::vector<int32_t> ids = read_token_shard(only);
  const json expected = helper_json("encode", cat(tokenizer(), " ", docs()));
  std::vector<int32_t> concatenated;
  for (const auto& document : expected["whole"])
    for (const auto& id : document) concatenated.push_back(id.get<int32_t>());
  EXPECT_EQ(ids, concatenated);
  EXPECT_EQ(BpeVocab::load(out / "tokenizer.json").decode(ids),
            (*documents_)[0] + (*documents_)[1] + (*documents_)[2]);
}

TEST_F(TokenizeBpe, BadInputIsOneLineNamingItAndWritesNoShard) {
  const fs::path out = *dir_ / "bad";
  const fs::path wordlevel = *dir_ / "wordlevel.json";
  ASSERT_EQ(run_command(cat(kPython, " ", helper(), " wordlevel ", wordlevel)).exit_code, 0);
  write_file_atomic(*dir_ / "latin1.txt", std::string("caf\xE9\n"));
  // A `tokenizers` that cannot be imported, in front of the real one.
  fs::create_directories(*dir_ / "shadow" / "tokenizers");
  write_file_atomic(*dir_ / "shadow" / "tokenizers" / "__init__.py",
                    "raise ImportError('No module named tokenizers')\n");
  const std::string base = cat(kPython, " ", tool(), " --output-dir ", out, " ");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {cat("--tokenizer ", tokenizer(), " ", *dir_ / "absent.txt"),
       (*dir_ / "absent.txt").string() + ": no such input file"},
      {cat("--tokenizer ", *dir_ / "absent.json", " ", doc(0)),
       (*dir_ / "absent.json").string() + ": no such tokenizer file"},
      {cat("--tokenizer ", doc(0), " ", doc(0)), doc(0).string() + ": not JSON"},
      {cat("--tokenizer ", wordlevel, " ", doc(0)),
       wordlevel.string() + ": the model is WordLevel, not BPE; tandem needs a byte-level BPE"},
      {cat("--tokenizer ", tokenizer(), " ", *dir_ / "latin1.txt"),
       (*dir_ / "latin1.txt").string() + ": not UTF-8 text (byte 0xe9 at offset 3)"},
      {cat("--tokenizer ", tokenizer(), " --eot --eot-token '<eos>' ", docs()),
       "--eot: " + tokenizer().string() + " has no token <eos>"},
      {cat("--tokenizer ", tokenizer(), " --val-tokens 100000000 ", docs()),
       "tokens went to the validation split (--val-tokens 100000000)"},
  };
  for (const auto& [args, message] : cases) {
    const auto result = run_command(base + args);
    EXPECT_EQ(result.exit_code, 1) << args << "\n" << result.output;
    EXPECT_CONTAINS(result.output, "tokenize_bpe: error: ");
    EXPECT_CONTAINS(result.output, message);
  }
  const auto no_package = run_command(
      cat("PYTHONPATH=", *dir_ / "shadow", " ", base, "--tokenizer ", tokenizer(), " ", doc(0)));
  EXPECT_EQ(no_package.exit_code, 1) << no_package.output;
  EXPECT_CONTAINS(no_package.output,
                  "tokenize_bpe: error: --tokenizer needs the tokenizers package: ");
  EXPECT_CONTAINS(no_package.output, " -m pip install tokenizers");
  // No shard was left behind, finished or not.
  if (fs::exists(out)) {
    for (const auto& entry : fs::directory_iterator(out))
      ADD_FAILURE() << "left behind: " << entry.path();
  }
}

// The tiktoken path on an encoding made here (a tiktoken_ext plugin holding the trained
// vocabulary), so nothing is downloaded: tiktoken's ids, and the tokenizer.json the tool
// writes from tiktoken's ranks encodes as tiktoken does and decodes in tandem.
TEST_F(TokenizeBpe, TiktokenEncodingAndTheTokenizerJsonWrittenFromIt) {
  if (const std::string why = missing_module("tiktoken"); !why.empty()) GTEST_SKIP() << why;
  const fs::path plugin = *dir_ / "plugin";
  ASSERT_EQ(run_command(cat(kPython, " ", helper(), " tiktoken-plugin ", plugin, " ", tokenizer()))
                .exit_code,
            0);
  const std::string env = cat("PYTHONPATH=", plugin, " ");
  const fs::path out = *dir_ / "tiktoken";
  const auto run = run_command(cat(env, kPython, " ", tool(), " --tiktoken tandem_test_bpe ",
                                   "--output-dir ", out, " --eot --chunk-bytes 300 ", docs()));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::vector<int32_t> ids = read_all(out, "doc0", 0);
  const json tiktoken_ids = helper_json("tiktoken-encode", cat("tandem_test_bpe ", docs()), env);
  ASSERT_FALSE(tiktoken_ids.is_null());
  EXPECT_EQ(ids, join(tiktoken_ids["whole"], 0));

  const fs::path written = out / "tokenizer.json";
  const json by_written = helper_json("encode", cat(written, " ", docs()));
  ASSERT_FALSE(by_written.is_null());
  EXPECT_EQ(by_written["whole"], tiktoken_ids["whole"]);
  const BpeVocab vocab = BpeVocab::load(written);
  EXPECT_EQ(vocab.size(), by_written["vocab_size"].get<int>());
  EXPECT_EQ(vocab.end_of_text(), 0);
  EXPECT_EQ(vocab.decode(ids), joined_with_eot());
}

// GPT-2's own encoding, where tiktoken has it (it downloads it on first use).
TEST_F(TokenizeBpe, TiktokenGpt2) {
  if (const std::string why = missing_module("tiktoken"); !why.empty()) GTEST_SKIP() << why;
  write_file_atomic(*dir_ / "hello.txt", "Hello, world");
  const fs::path out = *dir_ / "gpt2";
  const auto run = run_command(
      cat(kPython, " ", tool(), " --tiktoken gpt2 --output-dir ", out, " ", *dir_ / "hello.txt"));
  if (run.exit_code != 0 && run.output.find("could not load the encoding") != std::string::npos)
    GTEST_SKIP() << "tiktoken cannot load gpt2 here: " << run.output;
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::vector<int32_t> ids = read_token_shard(shard(out, "hello", "train", 0));
  EXPECT_EQ(ids, (std::vector<int32_t>{15496, 11, 995}));  // GPT-2's "Hello", ",", " world"
  EXPECT_EQ(shard_magic(shard(out, "hello", "train", 0)), kShardMagicUint16);
  const BpeVocab vocab = BpeVocab::load(out / "tokenizer.json");
  EXPECT_EQ(vocab.size(), 50257);
  EXPECT_EQ(vocab.end_of_text(), 50256);
  EXPECT_EQ(vocab.decode(ids), "Hello, world");
}

}  // namespace
}  // namespace tandem
