// safetensors writer and strict reader: round trips, the exact bytes of the format, and
// one test per kind of malformed file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ =
        fs::temp_directory_path() / cat("tandem_test_safetensors_", ::getpid(), "_", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

using testing::error_of;

// A safetensors file built by hand: length prefix (unpadded header), header, data.
std::vector<uint8_t> hand_made(const std::string& header, const std::vector<uint8_t>& data,
                               uint64_t header_len_override = UINT64_MAX) {
  const uint64_t n = header_len_override == UINT64_MAX ? header.size() : header_len_override;
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(n >> (8 * i)));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

TEST_F(SafetensorsTest, RoundTripsEveryDtypeScalarEmptyAndMetadata) {
  const std::vector<double> f64 = {1.5, -2.25};
  const std::vector<float> f32 = {0.f, 1.f, 2.f, 3.f, 4.f, -5.5f};
  const std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x7bff};
  const std::vector<uint16_t> bf16 = {0x3f80, 0xbf80, 0x4000, 0x0001};
  const std::vector<int64_t> i64 = {-(int64_t{1} << 40)};
  const int32_t i32_scalar = -123456;
  const std::vector<uint16_t> u16 = {0, 1, 65535, 300};
  const std::vector<uint8_t> u8 = {9, 8, 7, 6, 5};

  SafetensorsWriter writer;
  writer.add("f64", DType::kF64, {2}, f64.data());
  writer.add("w.f32", DType::kF32, {2, 3}, f32.data());
  writer.add("f16", DType::kF16, {3}, f16.data());
  writer.add("bf16", DType::kBF16, {2, 1, 2}, bf16.data());
  writer.add("i64", DType::kI64, {1}, i64.data());
  writer.add("scalar", DType::kI32, {}, &i32_scalar);
  writer.add("empty", DType::kF32, {0, 3}, nullptr);
  writer.add("u16", DType::kU16, {4}, u16.data());
  writer.add("u8", DType::kU8, {5}, u8.data());
  writer.set_metadata("format", "pt");
  writer.set_metadata("step", "500");
  EXPECT_EQ(writer.num_tensors(), 9u);
  const fs::path path = dir_ / "all.safetensors";
  writer.write(path);

  const SafetensorsFile file = SafetensorsFile::read(path);
  EXPECT_EQ(file.source(), path.string());
  // Names in data order; "empty" (0 bytes) ties with "u16" at the same offset and sorts first.
  EXPECT_EQ(file.names(), (std::vector<std::string>{"f64", "w.f32", "f16", "bf16", "i64", "scalar",
                                                    "empty", "u16", "u8"}));
  EXPECT_EQ(file.metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"step", "500"}}));

  EXPECT_EQ(file.read_f32("w.f32", {2, 3}), f32);
  EXPECT_EQ(file.read_i32("scalar", {}), std::vector<int32_t>{i32_scalar});
  EXPECT_TRUE(file.read_f32("empty", {0, 3}).empty());

  const TensorInfo& scalar = file.info("scalar");
  EXPECT_EQ(scalar.dtype, DType::kI32);
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.numel, 1);
  EXPECT_EQ(scalar.end - scalar.begin, 4u);
  const TensorInfo& empty = file.info("empty");
  EXPECT_EQ(empty.numel, 0);
  EXPECT_EQ(empty.begin, empty.end);
  EXPECT_EQ(file.info("bf16").shape, (std::vector<int64_t>{2, 1, 2}));
  EXPECT_EQ(file.info("bf16").dtype, DType::kBF16);
  EXPECT_EQ(file.info("bf16").numel, 4);

  auto same_bytes = [&](const std::string& name, const void* expected, size_t n) {
    const std::span<const uint8_t> got = file.bytes(name);
    ASSERT_EQ(got.size(), n) << name;
    EXPECT_EQ(std::memcmp(got.data(), expected, n), 0) << name;
  };
  same_bytes("f64", f64.data(), 16);
  same_bytes("f16", f16.data(), 6);
  same_bytes("bf16", bf16.data(), 8);
  same_bytes("i64", i64.data(), 8);
  same_bytes("u16", u16.data(), 8);
  same_bytes("u8", u8.data(), 5);

  std::vector<float> out(6, -1.f);
  file.copy_f32("w.f32", {2, 3}, out);
  EXPECT_EQ(out, f32);
  int32_t scalar_out = 0;
  file.copy_i32("scalar", {}, std::span<int32_t>(&scalar_out, 1));
  EXPECT_EQ(scalar_out, i32_scalar);
  EXPECT_TRUE(file.contains("u8"));
  EXPECT_FALSE(file.contains("u9"));
}

TEST_F(SafetensorsTest, DTypeNamesAndSizes) {
  const std::pair<DType, size_t> sizes[] = {{DType::kF64, 8},  {DType::kF32, 4}, {DType::kF16, 2},
                                            {DType::kBF16, 2}, {DType::kI64, 8}, {DType::kI32, 4},
                                            {DType::kU16, 2},  {DType::kU8, 1}};
  for (const auto& [dtype, size] : sizes) {
    EXPECT_EQ(dtype_size(dtype), size);
    EXPECT_EQ(parse_dtype(dtype_name(dtype)), dtype);
  }
  EXPECT_EQ(dtype_name(DType::kBF16), "BF16");
  EXPECT_FALSE(parse_dtype("f32").has_value());
  EXPECT_FALSE(parse_dtype("F8_E4M3").has_value());
}

// The exact bytes the format specifies: compact JSON with "__metadata__" first, keys
// in the order dtype/shape/data_offsets, space padding to a multiple of 8, packed data.
TEST_F(SafetensorsTest, WritesTheReferenceBytesExactly) {
  const float a[2] = {1.0f, -2.0f};
  const uint8_t b = 7;
  SafetensorsWriter writer;
  writer.add("a", DType::kF32, {2}, a);
  writer.add("b", DType::kU8, {}, &b);
  writer.set_metadata("k", "v");
  const fs::path path = dir_ / "exact.safetensors";
  writer.write(path);

  const std::string json =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[],"data_offsets":[8,9]}})";
  ASSERT_EQ(json.size(), 130u);
  // 130 + 6 spaces of padding. (Built by appending to a reserved vector: GCC 12 warns
  // falsely about inserting a range into a small initializer-list vector.)
  std::vector<uint8_t> expected;
  expected.reserve(160);
  expected.insert(expected.end(), {136, 0, 0, 0, 0, 0, 0, 0});
  expected.insert(expected.end(), json.begin(), json.end());
  expected.insert(expected.end(), 6, ' ');
  const uint8_t data[9] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0, 7};  // 1.0f, -2.0f, 7
  expected.insert(expected.end(), data, data + 9);
  EXPECT_EQ(read_file_bytes(path), expected);

  // No metadata: no "__metadata__" key at all (as the reference writes metadata=None).
  SafetensorsWriter plain;
  plain.add("b", DType::kU8, {1}, &b);
  plain.write(path);
  const std::string plain_json = R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  ASSERT_EQ(plain_json.size(), 53u);
  std::vector<uint8_t> plain_expected;
  plain_expected.reserve(64);
  plain_expected.insert(plain_expected.end(), {56, 0, 0, 0, 0, 0, 0, 0});
  plain_expected.insert(plain_expected.end(), plain_json.begin(), plain_json.end());
  plain_expected.insert(plain_expected.end(), {' ', ' ', ' ', 7});
  EXPECT_EQ(read_file_bytes(path), plain_expected);
}

TEST_F(SafetensorsTest, AtomicWriteLeavesNoTempFilesAndReplaces) {
  const std::vector<float> x = {1, 2, 3};
  const fs::path path = dir_ / "model.safetensors";
  for (int round = 0; round < 2; ++round) {
    SafetensorsWriter writer;
    writer.add("x", DType::kF32, {round == 0 ? 3 : 1}, x.data());
    writer.write(path);
  }
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir_)) entries.push_back(e.path().filename());
  EXPECT_EQ(entries, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(SafetensorsFile::read(path).read_f32("x", {1}), std::vector<float>{1});
}

TEST_F(SafetensorsTest, WriterRejectsBadTensors) {
  const float x = 1;
  SafetensorsWriter writer;
  writer.add("x", DType::kF32, {1}, &x);
  EXPECT_CONTAINS(error_of([&] { writer.add("x", DType::kF32, {1}, &x); }), "'x' added twice");
  EXPECT_CONTAINS(error_of([&] { writer.add("__metadata__", DType::kF32, {1}, &x); }), "reserved");
  EXPECT_CONTAINS(error_of([&] {
                    writer.add("neg", DType::kF32, {2, -1}, &x);
                  }),
                  "invalid shape [2, -1]");
  EXPECT_EQ(writer.num_tensors(), 1u);
  // A tensor without data may be placed (SafetensorsWriter::placement) but not written.
  writer.add("null", DType::kF32, {1}, nullptr);
  EXPECT_EQ(writer.placement("f").offsets.size(), 2u);
  EXPECT_CONTAINS(error_of([&] { writer.write(dir_ / "null.safetensors"); }),
                  "tensor 'null' has no data");
}

TEST_F(SafetensorsTest, ReadF32ChecksShapeDtypeAndName) {
  std::vector<float> wte(256 * 64, 0.5f);
  const int32_t step = 3;
  SafetensorsWriter writer;
  writer.add("transformer.wte.weight", DType::kF32, {256, 64}, wte.data());
  writer.add("step", DType::kI32, {}, &step);
  writer.add("transformer.wpe.weight", DType::kF32, {2, 64}, wte.data());
  writer.add("transformer.ln_f.weight", DType::kF32, {64}, wte.data());
  writer.add("transformer.ln_f.bias", DType::kF32, {64}, wte.data());
  const fs::path path = dir_ / "model.safetensors";
  writer.write(path);
  const SafetensorsFile file = SafetensorsFile::read(path);
  const std::string p = path.string();

  EXPECT_EQ(error_of([&] {
              file.read_f32("transformer.wte.weight", {256, 128});
            }),
            p + ": tensor 'transformer.wte.weight' has shape [256, 64], expected [256, 128]; "
                "was this checkpoint made with another model config?");
  EXPECT_CONTAINS(error_of([&] { file.read_f32("transformer.ln_f.weight", {}); }),
                  "has shape [64], expected []");
  EXPECT_EQ(error_of([&] { file.read_f32("step", {}); }),
            p + ": tensor 'step' has dtype I32, expected F32; convert the checkpoint to F32 first");
  EXPECT_CONTAINS(error_of([&] {
                    file.read_i32("transformer.wpe.weight", {2, 64});
                  }),
                  "has dtype F32, expected I32");
  const std::string missing = error_of([&] { file.read_f32("lm_head.weight", {256, 64}); });
  EXPECT_CONTAINS(missing, p + ": no tensor named 'lm_head.weight' (the file holds 5 tensors: ");
  EXPECT_CONTAINS(missing, "'transformer.wte.weight', 'step'");
  EXPECT_CONTAINS(missing, ", ...)");
  EXPECT_CONTAINS(error_of([&] { file.bytes("nope"); }), "no tensor named 'nope'");
  std::vector<float> small(10);
  EXPECT_CONTAINS(error_of([&] { file.copy_f32("transformer.ln_f.bias", {64}, small); }),
                  "has 64 elements but the destination holds 10");
  EXPECT_EQ(file.read_f32("transformer.wte.weight", {256, 64}), wte);
}

// read_into: each tensor's bytes land where the caller says (or are read past), every byte
// of the file passes the observer once and in order, and what comes back is the header alone.
TEST_F(SafetensorsTest, ReadIntoPutsEachTensorInPlaceAndObservesEveryByteOnce) {
  std::vector<float> big(3 * (1 << 20) + 5);  // past read_into's 4 MiB chunks
  for (size_t i = 0; i < big.size(); i++) big[i] = static_cast<float>(i % 977) * 0.25f;
  const std::vector<float> small = {1.5f, -2.0f, 3.25f};
  const int32_t step = 7;
  SafetensorsWriter writer;
  writer.add("small", DType::kF32, {3}, small.data());
  writer.add("skipped", DType::kI32, {}, &step);
  writer.add("big", DType::kF32, {static_cast<int64_t>(big.size())}, big.data());
  writer.set_metadata("k", "v");
  const fs::path path = dir_ / "into.safetensors";
  writer.write(path);
  const std::vector<uint8_t> file_bytes = read_file_bytes(path);

  std::vector<float> small_out(3), big_out(big.size());
  std::vector<uint8_t> observed;
  File in(path, "rb");
  const SafetensorsFile header = SafetensorsFile::read_into(
      in, file_bytes.size(), path.string(),
      [&](const TensorInfo& t) {
        if (t.name == "skipped") return std::span<uint8_t>();
        std::vector<float>& out = t.name == "small" ? small_out : big_out;
        return std::span<uint8_t>(reinterpret_cast<uint8_t*>(out.data()), out.size() * 4);
      },
      [&](const void* bytes, size_t n) {
        const auto* b = static_cast<const uint8_t*>(bytes);
        observed.insert(observed.end(), b, b + n);
      });
  EXPECT_EQ(small_out, small);
  EXPECT_EQ(big_out, big);
  EXPECT_EQ(observed, file_bytes);
  EXPECT_EQ(header.names(), (std::vector<std::string>{"small", "skipped", "big"}));
  EXPECT_EQ(header.metadata().at("k"), "v");
  EXPECT_EQ(header.info("big").numel, static_cast<int64_t>(big.size()));
  EXPECT_CONTAINS(error_of([&] { header.bytes("small"); }), "was read into place");
  // A destination of the wrong size is refused before anything lands in it.
  File again(path, "rb");
  std::vector<float> wrong(2);
  EXPECT_CONTAINS(error_of([&] {
                    SafetensorsFile::read_into(
                        again, file_bytes.size(), path.string(),
                        [&](const TensorInfo&) {
                          return std::span<uint8_t>(reinterpret_cast<uint8_t*>(wrong.data()), 8);
                        },
                        [](const void*, size_t) {});
                  }),
                  "tensor 'small' has 12 bytes, its destination 8");
}

// One hand-made bad file per check the reader makes; each message names the file.
TEST_F(SafetensorsTest, RejectsMalformedFiles) {
  const std::string entry_ok = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  const std::vector<uint8_t> eight(8, 0);
  struct Case {
    const char* label;
    std::vector<uint8_t> bytes;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"short", {1, 0, 0}, ": too short for safetensors (3 bytes"},
      {"long_header", hand_made("{}", {}, 1000), ": header length 1000 runs past the end"},
      {"not_json", hand_made("{\"a\":", eight), ": header is not valid JSON"},
      {"not_object", hand_made("[1,2]", {}), ": header is not a JSON object"},
      {"no_dtype", hand_made(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", eight),
       ": tensor 'a': header entry has no \"dtype\""},
      {"no_shape", hand_made(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", eight),
       ": tensor 'a': header entry has no \"shape\""},
      {"no_offsets", hand_made(R"({"a":{"dtype":"F32","shape":[2]}})", eight),
       ": tensor 'a': header entry has no \"data_offsets\""},
      {"bad_dtype", hand_made(R"({"a":{"dtype":"F8","shape":[2],"data_offsets":[0,8]}})", eight),
       ": tensor 'a': unknown dtype \"F8\" (tandem reads F64, F32, F16, BF16, I64, I32, U16, U8)"},
      {"negative_dim",
       hand_made(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
       ": tensor 'a': negative dimension in shape [-2]"},
      {"float_dim", hand_made(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", eight),
       ": tensor 'a': \"shape\" holds 2.0, not an integer"},
      {"begin_after_end",
       hand_made(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight),
       ": tensor 'a': data_offsets [8, 0] have begin > end"},
      {"past_buffer", hand_made(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", {1}),
       ": tensor 'a': data_offsets [0, 8] run past the data buffer (1 bytes)"},
      {"negative_offset",
       hand_made(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-1,7]}})", eight),
       ": tensor 'a': \"data_offsets\" is [-1,7], expected [begin, end] (two byte offsets >= 0)"},
      {"size_mismatch",
       hand_made(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
       ": tensor 'a': data_offsets [0, 8] hold 8 bytes but shape [3] of F32 needs 12"},
      {"overlap",
       hand_made(
           R"({"a":{)" + entry_ok + R"(},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
           eight),
       ": tensors 'a' [0, 8) and 'b' [4, 8) overlap in the data buffer"},
      {"gap",
       hand_made(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
                 eight),
       ": data buffer bytes [4, 6) belong to no tensor (a gap before 'b')"},
      {"trailing", hand_made(R"({"a":{)" + entry_ok + "}}", std::vector<uint8_t>(11, 0)),
       ": 3 trailing bytes after the last tensor (data buffer is 11 bytes, tensors cover 8)"},
      {"bad_metadata", hand_made(R"({"__metadata__":{"k":1}})", {}),
       ": metadata \"k\" is 1, not a string"},
  };
  for (const Case& c : cases) {
    const fs::path path = dir_ / (std::string(c.label) + ".safetensors");
    File(path, "wb").write_all(c.bytes.data(), c.bytes.size());
    const std::string message = error_of([&] { SafetensorsFile::read(path); });
    EXPECT_CONTAINS(message, path.string() + c.expected) << "case " << c.label;
    // Read into place, the header alone is in memory when it is validated: the same checks.
    const std::string streamed = error_of([&] {
      File in(path, "rb");
      SafetensorsFile::read_into(
          in, c.bytes.size(), path.string(), [](const TensorInfo&) { return std::span<uint8_t>(); },
          [](const void*, size_t) {});
    });
    EXPECT_CONTAINS(streamed, path.string() + c.expected) << "case " << c.label << ", read_into";
  }
  // The same checks on a valid hand-made file pass, so the cases above fail for their
  // own reason only.
  const fs::path good = dir_ / "good.safetensors";
  const std::vector<uint8_t> bytes = hand_made(R"({"a":{)" + entry_ok + "}}", eight);
  File(good, "wb").write_all(bytes.data(), bytes.size());
  EXPECT_EQ(SafetensorsFile::read(good).read_f32("a", {2}), (std::vector<float>{0, 0}));
  EXPECT_CONTAINS(error_of([&] { SafetensorsFile::read(dir_ / "absent.safetensors"); }),
                  "absent.safetensors: cannot open");
}

}  // namespace
}  // namespace tandem
