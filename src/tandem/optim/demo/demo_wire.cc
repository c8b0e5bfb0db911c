#include "tandem/optim/demo/demo_wire.h"

#include <cstring>

#include "tandem/core/error.h"
#include "tandem/core/half.h"
#include "tandem/optim/demo/demo.h"

namespace tandem {
namespace {

// A little-endian bit stream: bit i of the stream is bit (i % 8) of byte i / 8.
class BitWriter {
 public:
  explicit BitWriter(uint8_t* out) : out_(out) {}
  void put(uint32_t value, int bits) {
    for (int b = 0; b < bits; b++, position_++) {
      if (position_ % 8 == 0) out_[position_ / 8] = 0;
      out_[position_ / 8] |= static_cast<uint8_t>(((value >> b) & 1u) << (position_ % 8));
    }
  }

 private:
  uint8_t* out_;
  size_t position_ = 0;
};

class BitReader {
 public:
  explicit BitReader(const uint8_t* in) : in_(in) {}
  uint32_t get(int bits) {
    uint32_t value = 0;
    for (int b = 0; b < bits; b++, position_++)
      value |= static_cast<uint32_t>((in_[position_ / 8] >> (position_ % 8)) & 1u) << b;
    return value;
  }

 private:
  const uint8_t* in_;
  size_t position_ = 0;
};

size_t bytes_of_bits(size_t bits) { return (bits + 7) / 8; }

}  // namespace

int demo_index_bits(int64_t block_size) {
  TANDEM_CHECK(block_size >= 1 && block_size <= (int64_t{1} << 31), "DeMo: a block of ", block_size,
               " coefficients");
  int bits = 0;
  while ((int64_t{1} << bits) < block_size) bits++;
  return bits;
}

DemoWire::DemoWire(int64_t blocks, int64_t block_size, int64_t topk, DemoValueFormat format)
    : blocks_(blocks),
      block_size_(block_size),
      topk_(topk),
      format_(format),
      index_bits_(demo_index_bits(block_size)) {
  TANDEM_CHECK(blocks >= 0 && topk >= 1 && topk <= block_size, "DemoWire: ", topk,
               " coefficients of blocks of ", block_size);
}

size_t DemoWire::index_bytes() const {
  return bytes_of_bits(static_cast<size_t>(blocks_ * topk_) * index_bits_);
}

size_t DemoWire::value_bytes() const {
  const auto n = static_cast<size_t>(blocks_ * topk_);
  switch (format_) {
    case DemoValueFormat::kFp32:
      return n * sizeof(float);
    case DemoValueFormat::kBf16:
      return n * sizeof(uint16_t);
    case DemoValueFormat::kSign:
      return bytes_of_bits(n);
  }
  return 0;
}

void DemoWire::encode(const DemoMessage& message, uint8_t* out) const {
  const auto n = static_cast<size_t>(blocks_ * topk_);
  TANDEM_CHECK(message.indices.size() == n && message.values.size() == n, "DemoWire: a message of ",
               message.indices.size(), " indices and ", message.values.size(), " values, not ", n);
  BitWriter indices(out);
  for (int32_t i : message.indices) {
    TANDEM_CHECK(i >= 0 && i < block_size_, "DemoWire: coefficient ", i, " of a block of ",
                 block_size_);
    indices.put(static_cast<uint32_t>(i), index_bits_);
  }
  uint8_t* values = out + index_bytes();
  switch (format_) {
    case DemoValueFormat::kFp32:
      std::memcpy(values, message.values.data(), n * sizeof(float));
      return;
    case DemoValueFormat::kBf16:
      for (size_t j = 0; j < n; j++) {
        const uint16_t bits = float_to_bf16(message.values[j]);
        std::memcpy(values + 2 * j, &bits, sizeof bits);
      }
      return;
    case DemoValueFormat::kSign: {
      BitWriter signs(values);
      for (float v : message.values) signs.put(v < 0.0f ? 1u : 0u, 1);
      return;
    }
  }
}

void DemoWire::decode(const uint8_t* in, DemoMessage& message) const {
  const auto n = static_cast<size_t>(blocks_ * topk_);
  message.indices.resize(n);
  message.values.resize(n);
  BitReader indices(in);
  for (int32_t& i : message.indices) i = static_cast<int32_t>(indices.get(index_bits_));
  const uint8_t* values = in + index_bytes();
  switch (format_) {
    case DemoValueFormat::kFp32:
      std::memcpy(message.values.data(), values, n * sizeof(float));
      return;
    case DemoValueFormat::kBf16:
      for (size_t j = 0; j < n; j++) {
        uint16_t bits;
        std::memcpy(&bits, values + 2 * j, sizeof bits);
        message.values[j] = bf16_to_float(bits);
      }
      return;
    case DemoValueFormat::kSign: {
      BitReader signs(values);
      for (float& v : message.values) v = signs.get(1) ? -1.0f : 1.0f;
      return;
    }
  }
}

}  // namespace tandem
