#include "tandem/model/param_layout.h"

#include "tandem/core/error.h"

namespace tandem {

void ParamLayout::add(std::string name, std::vector<int64_t> shape, bool weight_decay,
                      bool hf_transposed) {
  ParamView view;
  view.name = std::move(name);
  view.numel = 1;
  for (int64_t d : shape) view.numel *= static_cast<size_t>(d);
  view.shape = std::move(shape);
  view.offset = num_elements_;
  view.weight_decay = weight_decay;
  view.hf_transposed = hf_transposed;
  num_elements_ += view.numel;
  if (blocks_.empty()) blocks_.push_back({view.offset, view.offset});
  blocks_.back().end = num_elements_;
  views_.push_back(std::move(view));
}

void ParamLayout::begin_block() {
  TANDEM_CHECK(blocks_.empty() || blocks_.back().size() > 0, "a block of the layout is empty");
  blocks_.push_back({num_elements_, num_elements_});
}

const ParamView* ParamLayout::find(std::string_view name) const {
  for (const ParamView& view : views_)
    if (view.name == name) return &view;
  return nullptr;
}

const ParamView& ParamLayout::at(std::string_view name) const {
  if (const ParamView* view = find(name)) return *view;
  fail("no parameter named '", name, "' in the model (first is '", views_.front().name, "')");
}

}  // namespace tandem
