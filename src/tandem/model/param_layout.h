// The flat parameter space: every parameter of the model lives in one contiguous
// buffer, and this manifest names each tensor inside it and groups the tensors into the
// model's blocks. Gradients, optimizer state, offload subgroups and ZeRO partitions all use
// the same layout, so each is just a range of this buffer. A model family builds its
// layout (model_family.h: model_layout) with add() and begin_block().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/model/param_range.h"

namespace tandem {

struct ParamView {
  std::string name;  // Hugging Face name, e.g. "transformer.h.0.attn.c_attn.weight" (GPT-2)
  std::vector<int64_t> shape;  // tandem's layout: Linear weights are [out, in]
  size_t offset = 0;           // in elements, into the flat buffer
  size_t numel = 0;
  bool weight_decay = false;  // AdamW decays 2-D weights only
  // Hugging Face stores this weight as a Conv1D, [in, out]: transpose on export/import.
  bool hf_transposed = false;
};

class ParamLayout {
 public:
  // Appends a tensor after the last one, to the current block.
  void add(std::string name, std::vector<int64_t> shape, bool weight_decay,
           bool hf_transposed = false);
  // Starts a new block: the tensors added from now on belong to it. A model's blocks are
  // the unit its memory works in (model/block_memory.h): a layer's tensors are contiguous
  // so that its gradients complete together during backward.
  void begin_block();

  const std::vector<ParamView>& views() const { return views_; }
  size_t num_elements() const { return num_elements_; }
  // The blocks in flat order; contiguous, together covering the parameters once.
  const std::vector<ParamRange>& blocks() const { return blocks_; }
  // Throws tandem::Error for an unknown name.
  const ParamView& at(std::string_view name) const;
  // Null for an unknown name.
  const ParamView* find(std::string_view name) const;

 private:
  std::vector<ParamView> views_;
  std::vector<ParamRange> blocks_;
  size_t num_elements_ = 0;
};

}  // namespace tandem
