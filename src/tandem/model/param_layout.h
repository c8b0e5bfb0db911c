// The flat parameter space: every parameter of the model lives in one contiguous fp32
// buffer, and this manifest names each tensor inside it. Gradients, Adam moments and
// (later) offload subgroups all use the same layout, so a subgroup is just a range
// of this buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/model/gpt_config.h"

namespace tandem {

struct ParamView {
  std::string name;            // Hugging Face GPT-2 name, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;  // tandem's layout: Linear weights are [out, in]
  size_t offset = 0;           // in elements, into the flat buffer
  size_t numel = 0;
  bool weight_decay = false;  // AdamW decays 2-D weights only
  // Hugging Face stores this weight as a Conv1D, [in, out]: transpose on export/import.
  bool hf_transposed = false;
};

class ParamLayout {
 public:
  // GPT-2 order, one layer's tensors contiguous so that a layer's gradients complete
  // together during backward: wte, wpe, h.0.*, ..., h.{L-1}.*, ln_f.*.
  static ParamLayout gpt2(const GptConfig& config);

  const std::vector<ParamView>& views() const { return views_; }
  size_t num_elements() const { return num_elements_; }
  // Throws tandem::Error for an unknown name.
  const ParamView& at(std::string_view name) const;

 private:
  void add(std::string name, std::vector<int64_t> shape, bool weight_decay, bool hf_transposed);
  std::vector<ParamView> views_;
  size_t num_elements_ = 0;
};

}  // namespace tandem
