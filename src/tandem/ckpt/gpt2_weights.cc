#include "tandem/ckpt/gpt2_weights.h"

#include <vector>

namespace tandem {
namespace {

// [rows, cols] -> [cols, rows]
void transpose(const float* in, float* out, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) out[c * rows + r] = in[r * cols + c];
}

std::vector<int64_t> hf_shape(const ParamView& view) {
  if (!view.hf_transposed) return view.shape;
  return {view.shape[1], view.shape[0]};
}

}  // namespace

void write_gpt2_safetensors(const std::filesystem::path& path, const ParamLayout& layout,
                            const float* params) {
  // Transposed copies must outlive writer.write(); everything else is written in place.
  std::vector<std::vector<float>> transposed;
  transposed.reserve(layout.views().size());
  SafetensorsWriter writer;
  for (const ParamView& view : layout.views()) {
    const float* data = params + view.offset;
    if (view.hf_transposed) {
      transposed.emplace_back(view.numel);
      transpose(data, transposed.back().data(), view.shape[0], view.shape[1]);
      data = transposed.back().data();
    }
    writer.add(view.name, DType::kF32, hf_shape(view), data);
  }
  writer.set_metadata("format", "pt");
  writer.write(path);
}

void read_gpt2_safetensors(const SafetensorsFile& file, const ParamLayout& layout, float* params,
                           const std::string& prefix) {
  for (const ParamView& view : layout.views()) {
    const std::string name = prefix + view.name;
    if (!view.hf_transposed) {
      file.copy_f32(name, view.shape, std::span<float>(params + view.offset, view.numel));
      continue;
    }
    const std::vector<float> hf = file.read_f32(name, hf_shape(view));
    transpose(hf.data(), params + view.offset, view.shape[1], view.shape[0]);
  }
}

nlohmann::json hf_gpt2_config(const GptConfig& config) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", config.vocab_size},
          {"n_positions", config.context_length},
          {"n_ctx", config.context_length},
          {"n_embd", config.n_embd},
          {"n_layer", config.n_layer},
          {"n_head", config.n_head},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"initializer_range", 0.02},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"tie_word_embeddings", true},
          {"torch_dtype", "float32"}};
}

}  // namespace tandem
