#include "tandem/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/data/byte_tokenizer.h"
#include "tandem/data/loss_mask.h"
#include "tandem/data/token_shard.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {

// Token ids index the embedding table, so one id >= vocab_size would read outside it.
void check_vocab(const std::vector<int32_t>& tokens, int vocab_size, const std::string& name) {
  const auto bad = std::find_if(tokens.begin(), tokens.end(),
                                [&](int32_t token) { return token >= vocab_size; });
  if (bad == tokens.end()) return;
  const int32_t max_token = *std::max_element(tokens.begin(), tokens.end());
  fail(name, ": token id ", *bad, " at position ", std::distance(tokens.begin(), bad),
       " is outside the model's vocabulary of ", vocab_size,
       " tokens; set model.vocab_size to at least ", static_cast<int64_t>(max_token) + 1);
}

// The loss mask beside a token shard, if there is one; empty otherwise.
std::vector<uint8_t> mask_beside(const fs::path& path, size_t tokens, std::string& mask_path) {
  if (path.extension() != ".bin") return {};
  const fs::path mask = loss_mask_path_for(path);
  std::error_code ec;
  if (!fs::exists(mask, ec)) return {};
  mask_path = mask.string();
  return read_loss_mask(mask, tokens);
}

}  // namespace

std::vector<int32_t> load_tokens(const fs::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  TANDEM_CHECK(fs::exists(status), name, ": no such file; check data.train_path / data.val_path");
  TANDEM_CHECK(!fs::is_directory(status), name,
               ": is a directory, expected a text file or an llm.c token shard (*.bin)");

  std::vector<int32_t> tokens;
  if (path.extension() == ".bin") {
    tokens = read_token_shard(path);
    TANDEM_CHECK(!tokens.empty(), name, ": token shard holds no tokens");
  } else {
    const std::string text = read_file_text(path);
    TANDEM_CHECK(!text.empty(), name, ": file is empty; expected training text");
    tokens = ByteTokenizer().encode(text);
  }
  return tokens;
}

TokenSplit load_dataset(const std::string& train_path, const std::string& val_path,
                        double val_fraction, int vocab_size) {
  TANDEM_CHECK(vocab_size > 0, "model.vocab_size is ", vocab_size, "; it must be positive");
  TANDEM_CHECK(!train_path.empty(),
               "data.train_path is empty; set it to a text file or an llm.c "
               "token shard (*.bin)");
  TokenSplit split;
  split.train = load_tokens(train_path);
  check_vocab(split.train, vocab_size, train_path);
  split.train_mask = mask_beside(train_path, split.train.size(), split.train_mask_path);
  if (!val_path.empty()) {
    split.val = load_tokens(val_path);
    check_vocab(split.val, vocab_size, val_path);
    split.val_mask = mask_beside(val_path, split.val.size(), split.val_mask_path);
    return split;
  }

  TANDEM_CHECK(val_fraction > 0.0 && val_fraction < 1.0, "data.val_fraction is ", val_fraction,
               "; it must be in (0, 1) when data.val_path is empty (e.g. 0.1 holds out the last "
               "10% of ",
               train_path, ")");
  // The tail, not a random sample, is held out: validation text then never overlaps a
  // training window, which random positions in one stream would.
  const size_t n = split.train.size();
  const auto val_count = static_cast<size_t>(std::floor(static_cast<double>(n) * val_fraction));
  split.val.assign(split.train.end() - static_cast<std::ptrdiff_t>(val_count), split.train.end());
  split.train.resize(n - val_count);
  if (!split.train_mask.empty()) {
    split.val_mask.assign(split.train_mask.end() - static_cast<std::ptrdiff_t>(val_count),
                          split.train_mask.end());
    split.train_mask.resize(n - val_count);
    split.val_mask_path = split.train_mask_path;
  }
  return split;
}

}  // namespace tandem
