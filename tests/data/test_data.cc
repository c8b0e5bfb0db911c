// Tests for the data layer: byte tokenizer, llm.c token shards, dataset loading, and the
// deterministic, resumable batch loader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/data/byte_tokenizer.h"
#include "tandem/data/dataset.h"
#include "tandem/data/loader.h"
#include "tandem/data/loss_mask.h"
#include "tandem/data/token_shard.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

const fs::path kShakespeare = testing::source_dir() / "data" / "tinyshakespeare.txt";

using testing::error_of;

// A fresh directory per test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() /
           ("tandem_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  fs::path path(const std::string& name) const { return dir_ / name; }

  fs::path dir_;
};

// Little-endian bytes, as llm.c's fwrite of int/uint16 arrays lays them out on x86.
void put_le(std::vector<uint8_t>& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

// A shard built by hand: header ints, then tokens of `token_bytes` each, plus `extra`.
std::vector<uint8_t> shard_bytes(int32_t magic, int32_t version, int32_t count,
                                 const std::vector<uint32_t>& tokens, int token_bytes) {
  std::vector<uint8_t> out;
  put_le(out, static_cast<uint32_t>(magic), 4);
  put_le(out, static_cast<uint32_t>(version), 4);
  put_le(out, static_cast<uint32_t>(count), 4);
  out.resize(kShardHeaderBytes, 0);
  for (uint32_t token : tokens) put_le(out, token, token_bytes);
  return out;
}

std::vector<int32_t> iota_tokens(size_t n) {
  std::vector<int32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), 0);
  return tokens;
}

// ---------------------------------------------------------------- byte tokenizer

TEST(ByteTokenizer, AllBytesRoundTrip) {
  std::string text;
  for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  const ByteTokenizer tok;
  const std::vector<int32_t> ids = tok.encode(text);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(ByteTokenizer::kVocabSize, 256);
}

TEST(ByteTokenizer, ShakespeareRoundTrip) {
  const std::string text = read_file_text(kShakespeare);
  ASSERT_GT(text.size(), 1000000u);
  const ByteTokenizer tok;
  const std::vector<int32_t> ids = tok.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[0], 'F');  // "First Citizen:"
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(ByteTokenizer, DecodeRejectsOutOfRangeIds) {
  const ByteTokenizer tok;
  const std::vector<int32_t> big = {65, 66, 256};
  const std::string msg = error_of([&] { tok.decode(big); });
  EXPECT_CONTAINS(msg, "256");
  EXPECT_CONTAINS(msg, "position 2");
  const std::vector<int32_t> negative = {-1};
  EXPECT_CONTAINS(error_of([&] { tok.decode(negative); }), "-1");
}

// ---------------------------------------------------------------- token shards

using TokenShard = TempDirTest;

TEST_F(TokenShard, Uint16RoundTrip) {
  const std::vector<int32_t> tokens = {0, 1, 255, 256, 50256, 65535, 7};
  write_token_shard(path("a.bin"), tokens, ShardTokenType::kUint16);
  EXPECT_EQ(fs::file_size(path("a.bin")), kShardHeaderBytes + 2 * tokens.size());
  EXPECT_EQ(read_token_shard(path("a.bin")), tokens);
}

TEST_F(TokenShard, Uint32RoundTrip) {
  const std::vector<int32_t> tokens = {0, 65535, 65536, 128000,
                                       std::numeric_limits<int32_t>::max()};
  write_token_shard(path("a.bin"), tokens, ShardTokenType::kUint32);
  EXPECT_EQ(fs::file_size(path("a.bin")), kShardHeaderBytes + 4 * tokens.size());
  EXPECT_EQ(read_token_shard(path("a.bin")), tokens);
}

TEST_F(TokenShard, EmptyShardRoundTrip) {
  write_token_shard(path("e.bin"), {}, ShardTokenType::kUint16);
  EXPECT_EQ(fs::file_size(path("e.bin")), kShardHeaderBytes);
  EXPECT_TRUE(read_token_shard(path("e.bin")).empty());
}

TEST_F(TokenShard, LargerThanOneChunk) {
  // More tokens than the 1 Mi-token conversion buffer, so the chunk seams are crossed.
  std::vector<int32_t> tokens((1 << 20) + 12345);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919) % 65536);
  write_token_shard(path("big.bin"), tokens, ShardTokenType::kUint16);
  EXPECT_EQ(read_token_shard(path("big.bin")), tokens);
}

TEST_F(TokenShard, MatchesLlmcLayoutByteForByte) {
  // What llm.c's data scripts write: int32 header {20240520, 1, 3, 0...} then uint16s.
  const std::vector<uint8_t> expected = shard_bytes(20240520, 1, 3, {0x1234, 50256, 1}, 2);
  ASSERT_EQ(expected.size(), 1024u + 6u);
  EXPECT_EQ(expected[0], 0x88);  // 20240520 = 0x0134D888, little-endian
  EXPECT_EQ(expected[1], 0xD8);
  EXPECT_EQ(expected[2], 0x34);
  EXPECT_EQ(expected[3], 0x01);
  EXPECT_EQ(expected[1024], 0x34);
  EXPECT_EQ(expected[1025], 0x12);
  write_file_atomic(path("llmc.bin"), expected);
  EXPECT_EQ(read_token_shard(path("llmc.bin")), (std::vector<int32_t>{0x1234, 50256, 1}));

  // And the writer produces exactly those bytes.
  write_token_shard(path("ours.bin"), std::vector<int32_t>{0x1234, 50256, 1},
                    ShardTokenType::kUint16);
  EXPECT_EQ(read_file_bytes(path("ours.bin")), expected);

  const std::vector<uint8_t> expected32 = shard_bytes(20240801, 7, 2, {70000, 3}, 4);
  write_token_shard(path("ours32.bin"), std::vector<int32_t>{70000, 3}, ShardTokenType::kUint32);
  EXPECT_EQ(read_file_bytes(path("ours32.bin")), expected32);
}

TEST_F(TokenShard, WrongMagic) {
  write_file_atomic(path("m.bin"), shard_bytes(1234, 1, 1, {5}, 2));
  const std::string msg = error_of([&] { read_token_shard(path("m.bin")); });
  EXPECT_CONTAINS(msg, path("m.bin").string());
  EXPECT_CONTAINS(msg, "bad magic 1234");
  EXPECT_CONTAINS(msg, "20240520");
  EXPECT_CONTAINS(msg, "20240801");
}

TEST_F(TokenShard, WrongVersion) {
  write_file_atomic(path("v.bin"), shard_bytes(20240520, 7, 1, {5}, 2));
  std::string msg = error_of([&] { read_token_shard(path("v.bin")); });
  EXPECT_CONTAINS(msg, path("v.bin").string());
  EXPECT_CONTAINS(msg, "version 7");
  write_file_atomic(path("v32.bin"), shard_bytes(20240801, 1, 1, {5}, 4));
  msg = error_of([&] { read_token_shard(path("v32.bin")); });
  EXPECT_CONTAINS(msg, "version 1");
  EXPECT_CONTAINS(msg, "expected 7");
}

TEST_F(TokenShard, TruncatedBody) {
  // The header promises 4 uint16 tokens (8 bytes) but only 3 tokens follow.
  write_file_atomic(path("t.bin"), shard_bytes(20240520, 1, 4, {1, 2, 3}, 2));
  const std::string msg = error_of([&] { read_token_shard(path("t.bin")); });
  EXPECT_CONTAINS(msg, path("t.bin").string());
  EXPECT_CONTAINS(msg, "truncated");
  EXPECT_CONTAINS(msg, "8 bytes");
  EXPECT_CONTAINS(msg, "only 6 bytes");
}

TEST_F(TokenShard, TrailingBytes) {
  std::vector<uint8_t> bytes = shard_bytes(20240801, 7, 2, {1, 2}, 4);
  bytes.push_back(0);
  write_file_atomic(path("x.bin"), bytes);
  const std::string msg = error_of([&] { read_token_shard(path("x.bin")); });
  EXPECT_CONTAINS(msg, path("x.bin").string());
  EXPECT_CONTAINS(msg, "1 trailing bytes");
  EXPECT_CONTAINS(msg, "8 bytes");
  EXPECT_CONTAINS(msg, "9 bytes");
}

TEST_F(TokenShard, ShorterThanHeader) {
  write_file_atomic(path("s.bin"), std::string(100, 'x'));
  const std::string msg = error_of([&] { read_token_shard(path("s.bin")); });
  EXPECT_CONTAINS(msg, path("s.bin").string());
  EXPECT_CONTAINS(msg, "100 bytes");
  EXPECT_CONTAINS(msg, "1024-byte header");
}

TEST_F(TokenShard, MissingFile) {
  const std::string msg = error_of([&] { read_token_shard(path("nope.bin")); });
  EXPECT_CONTAINS(msg, path("nope.bin").string());
}

TEST_F(TokenShard, Uint32TokenAboveInt32Max) {
  write_file_atomic(path("h.bin"), shard_bytes(20240801, 7, 2, {1, 0x80000000u}, 4));
  const std::string msg = error_of([&] { read_token_shard(path("h.bin")); });
  EXPECT_CONTAINS(msg, path("h.bin").string());
  EXPECT_CONTAINS(msg, "2147483648");
  EXPECT_CONTAINS(msg, "position 1");
}

TEST_F(TokenShard, WriteRejectsTokensThatDoNotFit) {
  const std::vector<int32_t> big = {1, 2, 65536};
  std::string msg =
      error_of([&] { write_token_shard(path("w.bin"), big, ShardTokenType::kUint16); });
  EXPECT_CONTAINS(msg, path("w.bin").string());
  EXPECT_CONTAINS(msg, "65536");
  EXPECT_CONTAINS(msg, "position 2");
  EXPECT_CONTAINS(msg, "uint32");
  EXPECT_FALSE(fs::exists(path("w.bin")));
  EXPECT_TRUE(fs::is_empty(dir_));  // no temporary file left behind either

  const std::vector<int32_t> negative = {3, -5};
  msg = error_of([&] { write_token_shard(path("w.bin"), negative, ShardTokenType::kUint32); });
  EXPECT_CONTAINS(msg, "-5");
  EXPECT_CONTAINS(msg, "position 1");
}

// ---------------------------------------------------------------- dataset

using Dataset = TempDirTest;

TEST_F(Dataset, LoadTokensTextAndShard) {
  write_file_atomic(path("a.txt"), std::string("hi\xff", 3));
  EXPECT_EQ(load_tokens(path("a.txt")), (std::vector<int32_t>{'h', 'i', 255}));
  write_token_shard(path("a.bin"), std::vector<int32_t>{300, 4}, ShardTokenType::kUint16);
  EXPECT_EQ(load_tokens(path("a.bin")), (std::vector<int32_t>{300, 4}));
  EXPECT_EQ(load_tokens(kShakespeare).size(), fs::file_size(kShakespeare));
}

TEST_F(Dataset, LoadTokensErrors) {
  std::string msg = error_of([&] { load_tokens(path("missing.txt")); });
  EXPECT_CONTAINS(msg, path("missing.txt").string());
  EXPECT_CONTAINS(msg, "no such file");

  write_file_atomic(path("empty.txt"), std::string());
  msg = error_of([&] { load_tokens(path("empty.txt")); });
  EXPECT_CONTAINS(msg, path("empty.txt").string());
  EXPECT_CONTAINS(msg, "empty");

  write_token_shard(path("empty.bin"), {}, ShardTokenType::kUint16);
  EXPECT_CONTAINS(error_of([&] { load_tokens(path("empty.bin")); }), "no tokens");
}

TEST_F(Dataset, SplitsTailOffAsValidation) {
  write_token_shard(path("t.bin"), iota_tokens(1003), ShardTokenType::kUint16);
  const TokenSplit split = load_dataset(path("t.bin").string(), "", 0.1, 2000);
  ASSERT_EQ(split.val.size(), 100u);  // floor(100.3)
  ASSERT_EQ(split.train.size(), 903u);
  EXPECT_EQ(split.train.front(), 0);
  EXPECT_EQ(split.train.back(), 902);
  EXPECT_EQ(split.val.front(), 903);
  EXPECT_EQ(split.val.back(), 1002);
}

TEST_F(Dataset, SeparateValidationFile) {
  write_file_atomic(path("train.txt"), std::string("abcdef"));
  write_file_atomic(path("val.txt"), std::string("xyz"));
  const TokenSplit split =
      load_dataset(path("train.txt").string(), path("val.txt").string(), 0.5, 256);
  EXPECT_EQ(split.train, (std::vector<int32_t>{'a', 'b', 'c', 'd', 'e', 'f'}));
  EXPECT_EQ(split.val, (std::vector<int32_t>{'x', 'y', 'z'}));
}

TEST_F(Dataset, TokenOutsideVocabulary) {
  write_token_shard(path("train.bin"), std::vector<int32_t>{1, 2, 50256, 7, 60000},
                    ShardTokenType::kUint16);
  std::string msg = error_of([&] { load_dataset(path("train.bin").string(), "", 0.1, 50000); });
  EXPECT_CONTAINS(msg, path("train.bin").string());
  EXPECT_CONTAINS(msg, "token id 50256 at position 2");
  EXPECT_CONTAINS(msg, "set model.vocab_size to at least 60001");

  // A byte-level text file needs vocab_size >= 256 once a byte >= vocab_size appears;
  // the validation file is checked and named too.
  write_file_atomic(path("train.txt"), std::string("aaaa"));
  write_file_atomic(path("val.txt"), std::string("ab\xc3"));
  msg = error_of(
      [&] { load_dataset(path("train.txt").string(), path("val.txt").string(), 0.1, 128); });
  EXPECT_CONTAINS(msg, path("val.txt").string());
  EXPECT_CONTAINS(msg, "token id 195 at position 2");
  EXPECT_CONTAINS(msg, "at least 196");
}

TEST_F(Dataset, RejectsBadValFraction) {
  write_file_atomic(path("t.txt"), std::string("abcdef"));
  for (double f : {0.0, 1.0, -0.5, 1.5}) {
    EXPECT_CONTAINS(error_of([&] { load_dataset(path("t.txt").string(), "", f, 256); }),
                    "data.val_fraction");
  }
}

// ---------------------------------------------------------------- loader

// With tokens[i] = i, a batch row's first input is window * T, so the window is known.
std::vector<uint64_t> windows_of(const std::vector<int32_t>& inputs, int B, int T) {
  std::vector<uint64_t> windows;
  for (int b = 0; b < B; ++b) windows.push_back(static_cast<uint64_t>(inputs[b * T]) / T);
  return windows;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
  bool operator==(const Batch&) const = default;
};

Batch next(DataLoader& loader) {
  const size_t n = static_cast<size_t>(loader.batch_size()) * loader.seq_len();
  Batch batch{std::vector<int32_t>(n), std::vector<int32_t>(n)};
  loader.next_batch(batch.inputs, batch.targets);
  return batch;
}

// The window order of one whole epoch.
std::vector<uint64_t> epoch_order(DataLoader& loader) {
  std::vector<uint64_t> order;
  for (size_t i = 0; i < loader.batches_per_epoch(); ++i) {
    const Batch batch = next(loader);
    for (uint64_t w : windows_of(batch.inputs, loader.batch_size(), loader.seq_len()))
      order.push_back(w);
  }
  return order;
}

TEST(DataLoader, WindowsAndShiftedTargets) {
  const std::vector<int32_t> tokens = iota_tokens(8 * 16 + 1);  // exactly 16 windows of T=8
  DataLoader loader(tokens, 4, 8, 1, /*shuffle=*/true, "train");
  EXPECT_EQ(loader.num_windows(), 16u);
  EXPECT_EQ(loader.batches_per_epoch(), 4u);
  for (int i = 0; i < 6; ++i) {
    const Batch batch = next(loader);
    for (int b = 0; b < 4; ++b) {
      const int32_t start = batch.inputs[b * 8];
      EXPECT_EQ(start % 8, 0);  // windows start at multiples of T
      for (int t = 0; t < 8; ++t) {
        EXPECT_EQ(batch.inputs[b * 8 + t], start + t);
        EXPECT_EQ(batch.targets[b * 8 + t], start + t + 1);
      }
    }
  }
}

TEST(DataLoader, UnshuffledIsInOrder) {
  const std::vector<int32_t> tokens = iota_tokens(50);  // (50-1)/4 = 12 windows
  DataLoader loader(tokens, 3, 4, 99, /*shuffle=*/false, "val");
  const std::vector<uint64_t> expected = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  EXPECT_EQ(epoch_order(loader), expected);
  EXPECT_EQ(epoch_order(loader), expected);
}

TEST(DataLoader, EveryWindowOncePerEpoch) {
  const std::vector<int32_t> tokens = iota_tokens(7 * 40 + 1);  // 40 windows of T=7
  DataLoader loader(tokens, 5, 7, 2024, /*shuffle=*/true, "train");
  for (int epoch = 0; epoch < 3; ++epoch) {
    EXPECT_EQ(loader.position(), (DataLoader::Position{static_cast<uint64_t>(epoch), 0}));
    std::vector<uint64_t> order = epoch_order(loader);
    std::sort(order.begin(), order.end());
    std::vector<uint64_t> all(40);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(order, all) << "epoch " << epoch;
  }
}

TEST(DataLoader, RemainderWindowsAreDroppedNotRepeated) {
  const std::vector<int32_t> tokens = iota_tokens(4 * 23 + 3);  // 23 windows, B=5: 4 batches
  DataLoader loader(tokens, 5, 4, 7, /*shuffle=*/true, "train");
  ASSERT_EQ(loader.num_windows(), 23u);
  ASSERT_EQ(loader.batches_per_epoch(), 4u);
  const std::vector<uint64_t> order = epoch_order(loader);
  EXPECT_EQ(order.size(), 20u);
  EXPECT_EQ(std::set<uint64_t>(order.begin(), order.end()).size(), 20u);
  for (uint64_t w : order) EXPECT_LT(w, 23u);
  EXPECT_EQ(loader.position(), (DataLoader::Position{1, 0}));
}

TEST(DataLoader, ShuffleIsDeterministicAndVaries) {
  const std::vector<int32_t> tokens = iota_tokens(4 * 64 + 1);  // 64 windows
  DataLoader a(tokens, 4, 4, 42, true, "train");
  DataLoader b(tokens, 4, 4, 42, true, "train");
  DataLoader c(tokens, 4, 4, 43, true, "train");
  const std::vector<uint64_t> a0 = epoch_order(a), a1 = epoch_order(a);
  const std::vector<uint64_t> b0 = epoch_order(b), b1 = epoch_order(b);
  const std::vector<uint64_t> c0 = epoch_order(c);
  EXPECT_EQ(a0, b0);
  EXPECT_EQ(a1, b1);
  EXPECT_NE(a0, a1);  // a new order each epoch
  EXPECT_NE(a0, c0);  // and per seed
  std::vector<uint64_t> in_order(64);
  std::iota(in_order.begin(), in_order.end(), 0);
  EXPECT_NE(a0, in_order);  // it does shuffle
}

TEST(DataLoader, RestoredPositionGivesIdenticalBatches) {
  const std::vector<int32_t> tokens = iota_tokens(3 * 30 + 1);  // 30 windows, B=4: 7 batches
  DataLoader original(tokens, 4, 3, 5, true, "train");
  for (int i = 0; i < 10; ++i) next(original);  // into epoch 1
  const DataLoader::Position saved = original.position();
  EXPECT_EQ(saved, (DataLoader::Position{1, 3}));
  std::vector<Batch> expected;
  for (int i = 0; i < 12; ++i) expected.push_back(next(original));  // crosses into epoch 3

  // A fresh loader, as after a restart, and the original itself rewound.
  DataLoader resumed(tokens, 4, 3, 5, true, "train");
  resumed.set_position(saved);
  original.set_position(saved);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(next(resumed), expected[i]) << "batch " << i;
    EXPECT_EQ(next(original), expected[i]) << "batch " << i;
  }

  // reset() replays the very first batches.
  DataLoader fresh(tokens, 4, 3, 5, true, "train");
  const Batch first = next(fresh), second = next(fresh);
  resumed.reset();
  EXPECT_EQ(resumed.position(), DataLoader::Position{});
  EXPECT_EQ(next(resumed), first);
  EXPECT_EQ(next(resumed), second);
}

TEST(DataLoader, RejectsPositionOutsideEpoch) {
  const std::vector<int32_t> tokens = iota_tokens(41);  // 10 windows of T=4, B=2: 5 batches
  DataLoader loader(tokens, 2, 4, 1, true, "train");
  const std::string msg = error_of([&] { loader.set_position({0, 5}); });
  EXPECT_CONTAINS(msg, "batch 5");
  EXPECT_CONTAINS(msg, "only 5 batches");
  loader.set_position({1000, 4});  // any epoch is fine
  EXPECT_EQ(loader.position(), (DataLoader::Position{1000, 4}));
}

TEST(DataLoader, TooSmallSplit) {
  const std::vector<int32_t> tokens = iota_tokens(32);  // (32-1)/8 = 3 windows < B=4
  const std::string msg = error_of([&] { DataLoader(tokens, 4, 8, 1, true, "val"); });
  EXPECT_CONTAINS(msg, "val split has 32 tokens, too few for one batch of 4 x (8+1)");
  EXPECT_CONTAINS(msg, "train_micro_batch_size_per_gpu");
  // Exactly enough: B*T+1 tokens.
  const std::vector<int32_t> enough = iota_tokens(33);
  EXPECT_EQ(DataLoader(enough, 4, 8, 1, true, "val").batches_per_epoch(), 1u);
  EXPECT_CONTAINS(error_of([&] { DataLoader(std::span<const int32_t>(), 1, 8, 1, true, "train"); }),
                  "train split has 0 tokens");
}

TEST(DataLoader, RejectsWrongBufferSize) {
  const std::vector<int32_t> tokens = iota_tokens(41);
  DataLoader loader(tokens, 2, 4, 1, true, "train");
  std::vector<int32_t> small(7), right(8);
  EXPECT_CONTAINS(error_of([&] { loader.next_batch(small, right); }), "expected B*T");
  EXPECT_EQ(loader.position(), DataLoader::Position{});  // nothing consumed
}

// A shard written in pieces is the shard written whole; a piece past the header's count,
// a short write at commit and a bad token are refused, and leave no file.
TEST_F(TokenShard, WrittenInPiecesItIsTheShardWrittenWhole) {
  std::vector<int32_t> tokens(70000);
  for (size_t i = 0; i < tokens.size(); i++) tokens[i] = static_cast<int32_t>((i * 7919) % 50257);
  write_token_shard(path("whole.bin"), tokens, ShardTokenType::kUint16);
  {
    TokenShardWriter writer(path("pieces.bin"), ShardTokenType::kUint16, tokens.size());
    writer.append(std::span<const int32_t>(tokens).first(3));
    writer.append(std::span<const int32_t>(tokens).subspan(3, 65536));
    writer.append(std::span<const int32_t>(tokens).subspan(3 + 65536));
    writer.commit();
  }
  EXPECT_EQ(read_file_bytes(path("pieces.bin")), read_file_bytes(path("whole.bin")));
  {
    TokenShardWriter writer(path("short.bin"), ShardTokenType::kUint16, 4);
    writer.append(std::vector<int32_t>{1, 2, 3});
    EXPECT_CONTAINS(error_of([&] {
                      writer.append(std::vector<int32_t>{4, 5});
                    }),
                    "more than the 4 tokens its header counts");
    EXPECT_CONTAINS(error_of([&] { writer.commit(); }),
                    "3 tokens written, but its header counts 4");
  }
  {
    TokenShardWriter writer(path("bad.bin"), ShardTokenType::kUint16, 2);
    writer.append(std::vector<int32_t>{1});
    EXPECT_CONTAINS(error_of([&] { writer.append(std::vector<int32_t>{70000}); }),
                    "token 70000 at position 1 does not fit a uint16 shard");
  }
  EXPECT_FALSE(fs::exists(path("short.bin")));
  EXPECT_FALSE(fs::exists(path("bad.bin")));
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// ---------------------------------------------------------------- loss masks

using LossMask = TempDirTest;

std::vector<uint8_t> alternating_mask(size_t n, size_t period) {
  std::vector<uint8_t> mask(n);
  for (size_t i = 0; i < n; i++) mask[i] = (i / period) % 2 == 1 ? 1 : 0;
  return mask;
}

TEST_F(LossMask, RoundTripsBesideItsShardAndIsSplitLikeTheTokens) {
  EXPECT_EQ(loss_mask_path_for(path("d_train_000000.bin")), path("d_train_000000.mask.bin"));
  write_token_shard(path("t.bin"), iota_tokens(1003), ShardTokenType::kUint32);
  const std::vector<uint8_t> mask = alternating_mask(1003, 7);
  write_loss_mask(loss_mask_path_for(path("t.bin")), mask);
  EXPECT_EQ(read_loss_mask(path("t.mask.bin"), 1003), mask);
  const TokenSplit split = load_dataset(path("t.bin").string(), "", 0.1, 2000);
  EXPECT_EQ(split.train_mask, std::vector<uint8_t>(mask.begin(), mask.begin() + 903));
  EXPECT_EQ(split.val_mask, std::vector<uint8_t>(mask.begin() + 903, mask.end()));
  EXPECT_EQ(split.train_mask_path, path("t.mask.bin").string());
  // A shard without one: every token counts.
  write_token_shard(path("plain.bin"), iota_tokens(100), ShardTokenType::kUint16);
  EXPECT_TRUE(load_dataset(path("plain.bin").string(), "", 0.1, 2000).train_mask.empty());
}

TEST_F(LossMask, AMaskThatIsNotItsShardsIsRefusedNamingIt) {
  write_token_shard(path("t.bin"), iota_tokens(50), ShardTokenType::kUint16);
  write_loss_mask(path("t.mask.bin"), alternating_mask(49, 3));
  std::string msg = error_of([&] { load_dataset(path("t.bin").string(), "", 0.1, 2000); });
  EXPECT_CONTAINS(msg, path("t.mask.bin").string());
  EXPECT_CONTAINS(msg, "masks 49 tokens but its token shard holds 50");
  std::vector<uint8_t> bad = alternating_mask(50, 3);
  bad[17] = 2;
  write_loss_mask(path("t.mask.bin"), bad);
  EXPECT_CONTAINS(error_of([&] { read_loss_mask(path("t.mask.bin"), 50); }),
                  "byte 2 at token 17 is neither 0 nor 1");
  write_token_shard(path("t.mask.bin"), iota_tokens(50), ShardTokenType::kUint16);
  EXPECT_CONTAINS(error_of([&] { read_loss_mask(path("t.mask.bin"), 50); }), "bad magic");
}

// The targets the mask does not count come as kIgnoredTarget, the rest as without a mask;
// counted_targets_ahead counts each batch ahead (past the end of the epoch too) as
// next_batch then gives it.
TEST(DataLoaderLossMask, UncountedTargetsAreIgnoredAndCountedAhead) {
  const std::vector<int32_t> tokens = iota_tokens(1000);
  const std::vector<uint8_t> mask = alternating_mask(tokens.size(), 5);
  const int B = 3, T = 8;
  DataLoader plain(tokens, B, T, 7, true, "train");
  DataLoader masked(tokens, B, T, 7, true, "train", mask);
  ASSERT_TRUE(masked.has_loss_mask());
  std::vector<uint64_t> predicted;
  for (uint64_t ahead = 0; ahead < 2 * masked.batches_per_epoch() + 3; ahead++)
    predicted.push_back(masked.counted_targets_ahead(ahead));
  std::vector<int32_t> in(B * T), want(B * T), in2(B * T), got(B * T);
  for (uint64_t batch = 0; batch < predicted.size(); batch++) {
    plain.next_batch(in, want);
    masked.next_batch(in2, got);
    ASSERT_EQ(in, in2);
    uint64_t counted = 0;
    for (int i = 0; i < B * T; i++) {
      if (mask[static_cast<size_t>(want[i])] == 1) {  // iota: a token is its own position
        ASSERT_EQ(got[i], want[i]);
        counted++;
      } else {
        ASSERT_EQ(got[i], kIgnoredTarget);
      }
    }
    ASSERT_EQ(counted, predicted[batch]) << "batch " << batch;
  }
  const std::vector<uint8_t> short_mask(10, 1);
  EXPECT_CONTAINS(error_of([&] { DataLoader(tokens, B, T, 7, true, "train", short_mask); }),
                  "a loss mask of 10 tokens for 1000 tokens");
}

}  // namespace
}  // namespace tandem
