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
  views_.push_back(std::move(view));
}

ParamLayout ParamLayout::gpt2(const GptConfig& config) {
  const int64_t V = config.vocab_size, maxT = config.context_length, C = config.n_embd;
  ParamLayout layout;
  layout.add("transformer.wte.weight", {V, C}, true, false);
  layout.add("transformer.wpe.weight", {maxT, C}, true, false);
  for (int l = 0; l < config.n_layer; l++) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    layout.add(p + "ln_1.weight", {C}, false, false);
    layout.add(p + "ln_1.bias", {C}, false, false);
    layout.add(p + "attn.c_attn.weight", {3 * C, C}, true, true);
    layout.add(p + "attn.c_attn.bias", {3 * C}, false, false);
    layout.add(p + "attn.c_proj.weight", {C, C}, true, true);
    layout.add(p + "attn.c_proj.bias", {C}, false, false);
    layout.add(p + "ln_2.weight", {C}, false, false);
    layout.add(p + "ln_2.bias", {C}, false, false);
    layout.add(p + "mlp.c_fc.weight", {4 * C, C}, true, true);
    layout.add(p + "mlp.c_fc.bias", {4 * C}, false, false);
    layout.add(p + "mlp.c_proj.weight", {C, 4 * C}, true, true);
    layout.add(p + "mlp.c_proj.bias", {C}, false, false);
  }
  layout.add("transformer.ln_f.weight", {C}, false, false);
  layout.add("transformer.ln_f.bias", {C}, false, false);
  return layout;
}

const ParamView& ParamLayout::at(std::string_view name) const {
  for (const ParamView& view : views_)
    if (view.name == name) return view;
  fail("no parameter named '", name, "' in the model (first is '", views_.front().name, "')");
}

}  // namespace tandem
