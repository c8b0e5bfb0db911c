// What DeMo puts on the wire for one tensor on one rank: per block, the indices of the
// compression_topk coefficients sent, then their values, packed.
//
//   indices: each in the fewest bits that address a block's coefficients,
//            ceil(log2(block size)) (12 for a 64 x 64 block, 6 for a block of 37, none for a
//            block of 1), as one little-endian bit stream over every block;
//   values:  fp32 (default: lossless, the reference's numbers), bf16 (rounded to nearest
//            even, decoded exactly), or sign (1 bit each: +1 for a value >= 0, -1 below;
//            the decode then averages signs, as Nous Research's Psyche sends them).
//
// At the defaults a 64 x 64 block sends 32 x (12 bits + 4 bytes) = 176 bytes, against the
// reference's 32 x (8 + 4) = 384 (int64 indices); with sign values, 52 bytes. The stream
// of each tensor starts on a byte boundary; its size depends only on the tensor's blocks
// and the format, so every rank's message has the same size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tandem/core/enum_names.h"

namespace tandem {

struct DemoMessage;

enum class DemoValueFormat { kFp32, kBf16, kSign };

// optimizer.params.compression_values: fp32 is lossless (the default), sign 1 bit per value.
inline constexpr EnumName<DemoValueFormat> kDemoValueFormatNames[] = {
    {DemoValueFormat::kFp32, "fp32"},
    {DemoValueFormat::kBf16, "bf16"},
    {DemoValueFormat::kSign, "sign"}};
constexpr std::string_view demo_value_format_name(DemoValueFormat format) {
  return enum_name(kDemoValueFormatNames, format);
}

// Bits of one packed index for blocks of `block_size` coefficients.
int demo_index_bits(int64_t block_size);

class DemoWire {
 public:
  DemoWire(int64_t blocks, int64_t block_size, int64_t topk, DemoValueFormat format);

  // Bytes of one rank's message for the tensor.
  size_t bytes() const { return index_bytes() + value_bytes(); }
  size_t index_bytes() const;
  size_t value_bytes() const;

  // out[bytes()] from a message of blocks x topk indices (each < block size) and values.
  void encode(const DemoMessage& message, uint8_t* out) const;
  // The message the receiver sees: indices exactly, values as the format carries them
  // (fp32: exactly; bf16: rounded; sign: +1 or -1).
  void decode(const uint8_t* in, DemoMessage& message) const;

 private:
  int64_t blocks_, block_size_, topk_;
  DemoValueFormat format_;
  int index_bits_;
};

}  // namespace tandem
