#include "tandem/ckpt/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/half.h"

namespace tandem {
namespace fs = std::filesystem;
using json = nlohmann::json;

// Tensor bytes are written and read as they lie in memory; safetensors is little-endian.
static_assert(std::endian::native == std::endian::little, "tandem assumes a little-endian host");

namespace {

constexpr DType kAllDTypes[] = {DType::kF64, DType::kF32, DType::kF16, DType::kBF16,
                                DType::kI64, DType::kI32, DType::kU16, DType::kU8};
constexpr char kMetadataKey[] = "__metadata__";

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string known_dtypes() {
  std::string text;
  for (DType d : kAllDTypes) text += (text.empty() ? "" : ", ") + std::string(dtype_name(d));
  return text;
}

// numel * dtype size, or nullopt when a dimension is negative or the product overflows.
std::optional<uint64_t> byte_size(const std::vector<int64_t>& shape, DType dtype) {
  uint64_t bytes = dtype_size(dtype);
  for (int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes)) return std::nullopt;
  }
  return bytes;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

uint64_t load_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

TensorInfo parse_entry(const std::string& where, const std::string& name, const json& entry,
                       uint64_t data_size) {
  const std::string what = cat(where, ": tensor '", name, "'");
  if (!entry.is_object()) fail(what, ": header entry is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) fail(what, ": header entry has no \"", key, "\"");
  }

  const json& dtype_json = entry["dtype"];
  if (!dtype_json.is_string()) fail(what, ": \"dtype\" is not a string");
  const std::string dtype_text = dtype_json.get<std::string>();
  const std::optional<DType> dtype = parse_dtype(dtype_text);
  if (!dtype)
    fail(what, ": unknown dtype \"", dtype_text, "\" (tandem reads ", known_dtypes(), ")");

  const json& shape_json = entry["shape"];
  if (!shape_json.is_array()) fail(what, ": \"shape\" is not a list");
  std::vector<int64_t> shape;
  for (const json& dim : shape_json) {
    if (!dim.is_number_integer()) fail(what, ": \"shape\" holds ", dim.dump(), ", not an integer");
    if (dim.is_number_unsigned() &&
        dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(what, ": dimension ", dim.dump(), " is too large");
    shape.push_back(dim.get<int64_t>());
    if (shape.back() < 0) fail(what, ": negative dimension in shape ", shape_json.dump());
  }

  const json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    fail(what, ": \"data_offsets\" is ", offsets.dump(),
         ", expected [begin, end] (two byte offsets >= 0)");
  const uint64_t begin = offsets[0].get<uint64_t>();
  const uint64_t end = offsets[1].get<uint64_t>();
  if (begin > end) fail(what, ": data_offsets [", begin, ", ", end, "] have begin > end");
  if (end > data_size)
    fail(what, ": data_offsets [", begin, ", ", end, "] run past the data buffer (", data_size,
         " bytes); the file is truncated or corrupted");

  const std::optional<uint64_t> bytes = byte_size(shape, *dtype);
  if (!bytes || *bytes != end - begin)
    fail(what, ": data_offsets [", begin, ", ", end, "] hold ", end - begin, " bytes but shape ",
         shape_string(shape), " of ", dtype_text, " needs ",
         bytes ? std::to_string(*bytes) : std::string("more than 2^64"));
  const int64_t numel = numel_of(shape);
  return TensorInfo{name, *dtype, std::move(shape), numel, begin, end};
}

}  // namespace

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kU16:
      return 2;
    case DType::kU8:
      return 1;
  }
  fail("dtype_size: invalid DType ", static_cast<int>(dtype));
}

// ---------------------------------------------------------------------------- writer

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape,
                            const void* data) {
  TANDEM_CHECK(!name.empty(), "safetensors writer: empty tensor name");
  TANDEM_CHECK(name != kMetadataKey, "safetensors writer: '", kMetadataKey,
               "' is reserved for metadata and cannot name a tensor");
  for (const Entry& e : entries_) {
    TANDEM_CHECK(e.name != name, "safetensors writer: tensor '", name, "' added twice");
  }
  const std::optional<uint64_t> bytes = byte_size(shape, dtype);
  TANDEM_CHECK(bytes.has_value(), "safetensors writer: tensor '", name, "' has invalid shape ",
               shape_string(shape));
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), data, *bytes});
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

SafetensorsWriter::Placement SafetensorsWriter::placement(const std::string& source) const {
  // ordered_json keeps keys in insertion order: "__metadata__" first, then the tensors
  // in the order they were added, each as {"dtype", "shape", "data_offsets"}, which is
  // how the reference (Rust) writer serializes them.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header[kMetadataKey] = metadata_;
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    info["dtype"] = dtype_name(e.dtype);
    info["shape"] = nlohmann::ordered_json::array();
    for (int64_t dim : e.shape) info["shape"].push_back(dim);
    info["data_offsets"] = nlohmann::ordered_json::array({offset, offset + e.bytes});
    header[e.name] = std::move(info);
    offset += e.bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception&) {
    fail(source, ": a tensor name or metadata string is not valid UTF-8");
  }
  // Pad so the data buffer starts 8-byte aligned, letting readers map tensors in place.
  text.append((8 - text.size() % 8) % 8, ' ');

  Placement out;
  out.prefix.resize(8);
  for (int i = 0; i < 8; ++i)
    out.prefix[i] = static_cast<char>(static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i)));
  out.prefix += text;
  uint64_t at = out.prefix.size();
  for (const Entry& e : entries_) {
    out.offsets.push_back(at);
    at += e.bytes;
  }
  out.file_bytes = at;
  return out;
}

void SafetensorsWriter::write(const fs::path& path) const {
  // A tensor without data throws inside: the temporary file goes with `out`.
  AtomicFileWriter out(path);
  write(out.file());
  out.commit();
}

void SafetensorsWriter::write(File& out) const {
  for (const Entry& e : entries_)
    TANDEM_CHECK(e.data != nullptr || e.bytes == 0, out.path().string(), ": tensor '", e.name,
                 "' has no data");
  out.write_all(placement(out.path().string()).prefix);
  for (const Entry& e : entries_) out.write_all(e.data, e.bytes);
}

// ---------------------------------------------------------------------------- reader

SafetensorsFile SafetensorsFile::read(const fs::path& path) {
  return parse(read_file_bytes(path), path.string());
}

SafetensorsFile SafetensorsFile::parse(std::vector<uint8_t> bytes, std::string source) {
  const uint64_t size = bytes.size();
  return parse_prefix(std::move(bytes), size, std::move(source));
}

SafetensorsFile SafetensorsFile::read_header(File& in, uint64_t file_bytes,
                                             const std::string& source, const Observer& observe) {
  // Its length, then the JSON (a length past the file fails in parse_prefix before anything
  // more is read).
  std::vector<uint8_t> header(static_cast<size_t>(std::min<uint64_t>(8, file_bytes)));
  in.read_observed(header.data(), header.size(), observe);
  if (header.size() == 8 && load_le64(header.data()) <= file_bytes - 8) {
    const auto length = static_cast<size_t>(load_le64(header.data()));
    header.resize(8 + length);
    in.read_observed(header.data() + 8, length, observe);
  }
  SafetensorsFile file = parse_prefix(std::move(header), file_bytes, source);
  file.holds_data_ = false;
  return file;
}

namespace {
// The pieces read_pieces hands over: a few MiB, still in the cache when they are taken.
constexpr size_t kReadChunk = size_t{4} << 20;
}  // namespace

SafetensorsFile SafetensorsFile::read_into(File& in, uint64_t file_bytes, const std::string& source,
                                           const Placer& place, const Observer& observe,
                                           const Landed& landed) {
  SafetensorsFile file = read_header(in, file_bytes, source, observe);
  // The tensors tile the data buffer (parse_prefix checked), so walking them in file order
  // reads every remaining byte once.
  for (const std::string& name : file.order_) {
    const TensorInfo& tensor = file.tensors_.at(name);
    const auto n = static_cast<size_t>(tensor.end - tensor.begin);
    const std::span<uint8_t> to = place(tensor);
    TANDEM_CHECK(to.empty() || to.size() == n, source, ": tensor '", name, "' has ", n,
                 " bytes, its destination ", to.size());
    if (to.empty()) {
      in.read_past(n, observe);
      continue;
    }
    in.read_observed(to.data(), n, observe);
    if (landed) landed(tensor, to);
  }
  return file;
}

SafetensorsFile SafetensorsFile::read_pieces(File& in, uint64_t file_bytes,
                                             const std::string& source, const Wanted& wanted,
                                             const Observer& observe, const Taker& take,
                                             const PieceInto& into) {
  SafetensorsFile file = read_header(in, file_bytes, source, observe);
  std::vector<uint8_t> buffer;
  for (const std::string& name : file.order_) {
    const TensorInfo& tensor = file.tensors_.at(name);
    const auto n = static_cast<size_t>(tensor.end - tensor.begin);
    const bool taken = wanted(tensor);
    for (size_t at = 0; at < n; at += kReadChunk) {
      const size_t chunk = std::min(kReadChunk, n - at);
      uint8_t* to = taken && into ? into(tensor, at, chunk) : nullptr;
      if (to == nullptr) {
        buffer.resize(std::max(buffer.size(), chunk));
        to = buffer.data();
      }
      in.read_observed(to, chunk, observe);
      if (taken) take(tensor, at, std::span<const uint8_t>(to, chunk));
    }
  }
  return file;
}

SafetensorsFile SafetensorsFile::parse_prefix(std::vector<uint8_t> bytes, uint64_t file_bytes,
                                              std::string source) {
  SafetensorsFile file;
  file.source_ = std::move(source);
  file.bytes_ = std::move(bytes);
  const std::string& where = file.source_;
  const uint64_t size = file_bytes;

  if (size < 8)
    fail(where, ": too short for safetensors (", size,
         " bytes, less than the 8-byte header length); the file is truncated or not safetensors");
  const uint64_t header_len = load_le64(file.bytes_.data());
  if (header_len > size - 8)
    fail(where, ": header length ", header_len, " runs past the end of the file (", size,
         " bytes); the file is truncated or not safetensors");
  file.data_begin_ = 8 + header_len;
  const uint64_t data_size = size - file.data_begin_;

  json header;
  const auto* text = reinterpret_cast<const char*>(file.bytes_.data() + 8);
  try {
    header = json::parse(text, text + header_len);
  } catch (const json::parse_error& e) {
    fail(where, ": header is not valid JSON (error at byte ", e.byte,
         " of the header); the file is corrupted or not safetensors");
  }
  if (!header.is_object()) fail(where, ": header is not a JSON object; is this safetensors?");

  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) fail(where, ": \"", kMetadataKey, "\" is not a JSON object");
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string())
          fail(where, ": metadata \"", mkey, "\" is ", mvalue.dump(), ", not a string");
        file.metadata_[mkey] = mvalue.get<std::string>();
      }
      continue;
    }
    file.tensors_.emplace(key, parse_entry(where, key, value, data_size));
  }

  // The tensors must tile the data buffer exactly: no overlap (two tensors sharing
  // bytes), no holes and no trailing bytes (data that no tensor accounts for).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& [name, info] : file.tensors_) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo* info : by_offset) {
    if (info->begin < covered)
      fail(where, ": tensors '", previous->name, "' [", previous->begin, ", ", previous->end,
           ") and '", info->name, "' [", info->begin, ", ", info->end,
           ") overlap in the data buffer; the file is corrupted");
    if (info->begin > covered)
      fail(where, ": data buffer bytes [", covered, ", ", info->begin,
           ") belong to no tensor (a gap before '", info->name, "'); the file is corrupted");
    covered = info->end;
    previous = info;
    file.order_.push_back(info->name);
  }
  if (covered != data_size)
    fail(where, ": ", data_size - covered, " trailing bytes after the last tensor (data buffer is ",
         data_size, " bytes, tensors cover ", covered,
         "); the file is corrupted or not safetensors");
  return file;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second;
  std::string some;
  constexpr size_t kShown = 4;
  for (size_t i = 0; i < order_.size() && i < kShown; ++i)
    some += (i ? ", '" : "'") + order_[i] + "'";
  if (order_.size() > kShown) some += ", ...";
  if (order_.empty()) fail(source_, ": no tensor named '", name, "' (the file holds no tensors)");
  fail(source_, ": no tensor named '", name, "' (the file holds ", order_.size(),
       " tensors: ", some, "); was this checkpoint made for another model?");
}

std::span<const uint8_t> SafetensorsFile::bytes(const std::string& name) const {
  const TensorInfo& t = info(name);
  TANDEM_CHECK(holds_data_, source_, ": tensor '", name,
               "' was read into place (read_into); its bytes are not held here");
  return {bytes_.data() + data_begin_ + t.begin, static_cast<size_t>(t.end - t.begin)};
}

std::span<const uint8_t> SafetensorsFile::checked_bytes(
    const std::string& name, DType dtype, const std::vector<int64_t>& expected_shape) const {
  check_tensor(source_, info(name), dtype, expected_shape);
  return bytes(name);
}

void SafetensorsFile::check_tensor(const std::string& source, const TensorInfo& t, DType dtype,
                                   const std::vector<int64_t>& expected_shape) {
  if (t.dtype != dtype)
    fail(source, ": tensor '", t.name, "' has dtype ", dtype_name(t.dtype), ", expected ",
         dtype_name(dtype), "; convert the checkpoint to ", dtype_name(dtype), " first");
  if (t.shape != expected_shape)
    fail(source, ": tensor '", t.name, "' has shape ", shape_string(t.shape), ", expected ",
         shape_string(expected_shape), "; was this checkpoint made with another model config?");
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name,
                                             const std::vector<int64_t>& expected_shape) const {
  std::vector<float> out(info(name).numel);
  copy_f32(name, expected_shape, out);
  return out;
}

void SafetensorsFile::copy_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                               std::span<float> out) const {
  const std::span<const uint8_t> src = checked_bytes(name, DType::kF32, expected_shape);
  TANDEM_CHECK(out.size() * sizeof(float) == src.size(), source_, ": tensor '", name, "' has ",
               src.size() / sizeof(float), " elements but the destination holds ", out.size());
  if (!src.empty()) std::memcpy(out.data(), src.data(), src.size());
}

void SafetensorsFile::copy_widened_f32(const std::string& name,
                                       const std::vector<int64_t>& expected_shape,
                                       std::span<float> out) const {
  const DType dtype = info(name).dtype;
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    copy_f32(name, expected_shape, out);
    return;
  }
  const std::span<const uint8_t> src = checked_bytes(name, dtype, expected_shape);
  TANDEM_CHECK(out.size() * sizeof(uint16_t) == src.size(), source_, ": tensor '", name, "' has ",
               src.size() / sizeof(uint16_t), " elements but the destination holds ", out.size());
  for (size_t i = 0; i < out.size(); i++) {
    uint16_t bits;
    std::memcpy(&bits, src.data() + i * sizeof bits, sizeof bits);
    out[i] = dtype == DType::kBF16 ? bf16_to_float(bits) : fp16_to_float(bits);
  }
}

std::vector<int32_t> SafetensorsFile::read_i32(const std::string& name,
                                               const std::vector<int64_t>& expected_shape) const {
  std::vector<int32_t> out(info(name).numel);
  copy_i32(name, expected_shape, out);
  return out;
}

void SafetensorsFile::copy_i32(const std::string& name, const std::vector<int64_t>& expected_shape,
                               std::span<int32_t> out) const {
  const std::span<const uint8_t> src = checked_bytes(name, DType::kI32, expected_shape);
  TANDEM_CHECK(out.size() * sizeof(int32_t) == src.size(), source_, ": tensor '", name, "' has ",
               src.size() / sizeof(int32_t), " elements but the destination holds ", out.size());
  if (!src.empty()) std::memcpy(out.data(), src.data(), src.size());
}

}  // namespace tandem
