// A range [begin, end) of the flat parameter space (model/param_layout.h): a block of the
// model, an offload subgroup, a rank's ZeRO partition.
#pragma once

#include <cstddef>

namespace tandem {

struct ParamRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
  bool operator==(const ParamRange&) const = default;
};

}  // namespace tandem
