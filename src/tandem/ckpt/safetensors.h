// safetensors: the Hugging Face weight format, so tandem checkpoints load in `transformers`
// and tandem can read weights written by PyTorch.
//
// Layout of a file:
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  JSON header: {"__metadata__": {"k": "v", ...},            (optional)
//                            "name": {"dtype": "F32", "shape": [2, 3],
//                                     "data_offsets": [begin, end]}, ...}
//              padded with spaces so that the data buffer starts at a multiple of 8
//   [rest]     the data buffer: raw little-endian tensor bytes, row-major; offsets are
//              relative to its start, tensors are packed with no gaps and cover it exactly
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/enum_names.h"

namespace tandem {

class File;

// The element types tandem writes or reads (a subset of those safetensors defines).
enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kU16, kU8 };

size_t dtype_size(DType dtype);
// The safetensors spelling: "F64", "F32", "F16", "BF16", "I64", "I32", "U16", "U8".
inline constexpr EnumName<DType> kDTypeNames[] = {
    {DType::kF64, "F64"}, {DType::kF32, "F32"}, {DType::kF16, "F16"}, {DType::kBF16, "BF16"},
    {DType::kI64, "I64"}, {DType::kI32, "I32"}, {DType::kU16, "U16"}, {DType::kU8, "U8"}};
constexpr std::string_view dtype_name(DType dtype) { return enum_name(kDTypeNames, dtype); }
// Inverse of dtype_name; nullopt for a name tandem does not know.
inline std::optional<DType> parse_dtype(std::string_view name) {
  return enum_from_exact_name(kDTypeNames, name);
}

// Collects tensors and writes them as one safetensors file, byte for byte as the
// reference writer lays them out (compact JSON, space padding, packed data), except
// that tensors keep the order they were added in rather than being sorted.
class SafetensorsWriter {
 public:
  // `data` is not copied: it must hold product(shape) elements of `dtype` and stay
  // alive until write() returns (null: only the placement is wanted). A scalar has shape {}.
  // Duplicate names are an error.
  void add(std::string name, DType dtype, std::vector<int64_t> shape, const void* data);
  void set_metadata(std::string key, std::string value);

  // Where write() puts everything, for writers that fill the file out of order (a
  // checkpoint streamed through a bounded buffer pool): the bytes before the data buffer
  // (the 8-byte length and the padded JSON header), each tensor's absolute file offset in
  // the order added, and the file's size. The tensors' `data` is not read.
  struct Placement {
    std::string prefix;
    std::vector<uint64_t> offsets;
    uint64_t file_bytes = 0;
  };
  Placement placement(const std::string& source) const;

  // Writes atomically (temp file, fsync, rename): a crash leaves the old file or the
  // new one. Tensor bytes stream straight from the callers' buffers.
  void write(const std::filesystem::path& path) const;
  // Writes into `out`, in order, from where it stands (a file of a staged checkpoint, whose
  // directory makes it atomic).
  void write(File& out) const;

  size_t num_tensors() const { return entries_.size(); }

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
    uint64_t bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // {} for a scalar
  int64_t numel;
  uint64_t begin;  // byte offsets into the data buffer, [begin, end)
  uint64_t end;
};

// A whole safetensors file held in memory, validated strictly on load so that later
// accessors can trust every offset. Every error names the file.
class SafetensorsFile {
 public:
  static SafetensorsFile read(const std::filesystem::path& path);
  // Validates bytes already in memory; `source` names them in error messages.
  static SafetensorsFile parse(std::vector<uint8_t> bytes, std::string source);
  // Reads the file open in `in` (`file_bytes` long, at its start) once, front to back: its
  // header, validated as parse() validates a whole file, then each tensor's bytes in file
  // order straight into place(info), a span of exactly that tensor's bytes (an empty span:
  // read past through a bounded buffer). Every byte read also goes to `observe` (a running
  // checksum), a few MiB at a time while they are in the cache. Once a placed tensor's bytes
  // are all in, `landed` (if set) gets it and its span, before the next tensor is placed (a
  // caller may reuse one buffer for several tensors). Returns the header alone: info(),
  // names() and metadata() work; the tensors' data is where `place` put it.
  using Placer = std::function<std::span<uint8_t>(const TensorInfo& tensor)>;
  using Observer = std::function<void(const void* bytes, size_t n)>;
  using Landed = std::function<void(const TensorInfo& tensor, std::span<uint8_t> bytes)>;
  static SafetensorsFile read_into(File& in, uint64_t file_bytes, const std::string& source,
                                   const Placer& place, const Observer& observe,
                                   const Landed& landed = {});
  // read_into for a reader that takes tensors in pieces rather than whole (into memory it
  // does not have room to give at once): the bytes of each tensor `wanted` accepts go to
  // `take(tensor, at, bytes)`, bytes [at, at + bytes.size()) of it, in order, a few MiB at
  // a time through one buffer (`bytes` is valid during the call; a piece of a tensor of
  // 4-byte elements holds whole ones); the others are read past. `observe` gets every byte
  // before `take` does. `into`, if set, may name where a piece is read instead of the buffer
  // (`bytes` then points there): memory of the piece's size, or null for the buffer.
  using Wanted = std::function<bool(const TensorInfo& tensor)>;
  using Taker =
      std::function<void(const TensorInfo& tensor, uint64_t at, std::span<const uint8_t> bytes)>;
  using PieceInto = std::function<uint8_t*(const TensorInfo& tensor, uint64_t at, size_t bytes)>;
  static SafetensorsFile read_pieces(File& in, uint64_t file_bytes, const std::string& source,
                                     const Wanted& wanted, const Observer& observe,
                                     const Taker& take, const PieceInto& into = {});
  // Throws, naming `source`, the tensor and what was expected, unless `tensor` has `dtype`
  // and `expected_shape` (what every typed accessor checks).
  static void check_tensor(const std::string& source, const TensorInfo& tensor, DType dtype,
                           const std::vector<int64_t>& expected_shape);

  const std::string& source() const { return source_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensor names in the order of their data in the file.
  std::vector<std::string> names() const { return order_; }
  size_t num_tensors() const { return order_.size(); }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws, listing a few names the file does have, when `name` is missing.
  const TensorInfo& info(const std::string& name) const;
  std::span<const uint8_t> bytes(const std::string& name) const;

  // Check the dtype and the shape against what the model expects, so that a checkpoint
  // from another model config fails with a clear message instead of loading garbage.
  std::vector<float> read_f32(const std::string& name,
                              const std::vector<int64_t>& expected_shape) const;
  // As read_f32, into a caller's buffer of exactly product(expected_shape) floats.
  void copy_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                std::span<float> out) const;
  // As copy_f32, also taking BF16 and F16 tensors, widened exactly (Hugging Face models
  // are often published in 16 bits).
  void copy_widened_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                        std::span<float> out) const;
  std::vector<int32_t> read_i32(const std::string& name,
                                const std::vector<int64_t>& expected_shape) const;
  void copy_i32(const std::string& name, const std::vector<int64_t>& expected_shape,
                std::span<int32_t> out) const;

 private:
  // Returns the tensor's bytes after checking its dtype and shape.
  std::span<const uint8_t> checked_bytes(const std::string& name, DType dtype,
                                         const std::vector<int64_t>& expected_shape) const;

  // Reads and validates the header of the file open in `in` (at its start), every byte
  // through `observe`: a SafetensorsFile that holds no data.
  static SafetensorsFile read_header(File& in, uint64_t file_bytes, const std::string& source,
                                     const Observer& observe);
  // Validates a file of `file_bytes` whose first bytes are `bytes` (all of them, or the
  // header alone).
  static SafetensorsFile parse_prefix(std::vector<uint8_t> bytes, uint64_t file_bytes,
                                      std::string source);

  std::string source_;
  std::vector<uint8_t> bytes_;  // the whole file, or (read_into) its header alone
  bool holds_data_ = true;
  uint64_t data_begin_ = 0;  // offset of the data buffer in bytes_
  std::map<std::string, std::string> metadata_;
  std::map<std::string, TensorInfo> tensors_;
  std::vector<std::string> order_;
};

}  // namespace tandem
