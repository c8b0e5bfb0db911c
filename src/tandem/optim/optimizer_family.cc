#include "tandem/optim/optimizer_family.h"

#include <cmath>
#include <limits>

#include "tandem/model/param_layout.h"

namespace tandem {

namespace {

using Keys = JsonKeys<OptimizerConfig>;

// lr and weight_decay are kept as doubles, but AdamW rounds them to float: both must be
// floats too (1e39 is inf, 1e-50 is 0 as a float).
bool fits_a_float(double v) {
  return std::fabs(v) <= std::numeric_limits<float>::max() &&
         (v == 0 || static_cast<float>(v) != 0);
}

}  // namespace

JsonKey<OptimizerConfig> lr_param() {
  return Keys::real("lr", TANDEM_FIELD(lr), "a number > 0",
                    [](double v) { return v > 0 && fits_a_float(v); });
}

JsonKey<OptimizerConfig> weight_decay_param() {
  return Keys::real("weight_decay", TANDEM_FIELD(weight_decay), "a number >= 0",
                    [](double v) { return v >= 0 && fits_a_float(v); });
}

const OptimizerFamily& optimizer_family(OptimizerType type) {
  for (const OptimizerFamily& family : optimizer_families())
    if (family.type == type) return family;
  fail("optimizer type ", static_cast<int>(type), " has no family (optim/optimizer_family.cc)");
}

const OptimizerFamily* find_optimizer_family(std::string_view name) {
  for (const OptimizerFamily& family : optimizer_families())
    if (ascii_lower(family.name) == ascii_lower(name)) return &family;
  return nullptr;
}

std::vector<std::string> OptimizerFamily::state_names() const {
  return {state_arrays.begin() + 1, state_arrays.end()};
}

std::vector<size_t> OptimizerFamily::subgroup_cut_points(const ParamLayout& layout) const {
  std::vector<size_t> cuts;
  if (!cuts_at_tensor_ends) return cuts;
  for (const ParamView& view : layout.views()) cuts.push_back(view.offset + view.numel);
  return cuts;
}

}  // namespace tandem
