#include "tandem/ckpt/init_from.h"

#include <nlohmann/json.hpp>
#include <string>

#include "tandem/ckpt/hf_weights.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/model/model_family.h"

namespace tandem {

ModelConfig read_hf_model_config(const std::filesystem::path& dir, std::string_view option) {
  const std::string where = cat(option, " ", dir.string(), ": ");
  TANDEM_CHECK(std::filesystem::is_directory(dir), where,
               "not a directory; name a Hugging Face model directory (what save_pretrained "
               "writes: config.json and model.safetensors)");
  TANDEM_CHECK(std::filesystem::exists(dir / "config.json"), where,
               "no config.json; name a Hugging Face model directory (what save_pretrained "
               "writes: config.json and model.safetensors)");
  try {
    const nlohmann::json hf = nlohmann::json::parse(read_file_text(dir / "config.json"));
    return model_family_of_hf(hf.value("model_type", std::string())).from_hf_config(hf);
  } catch (const nlohmann::json::exception& e) {
    fail(where, "config.json is not valid JSON (", e.what(), ")");
  } catch (const Error& e) {
    fail(where, e.what());
  }
}

std::vector<float> read_init_weights(const std::filesystem::path& dir, const ModelConfig& model,
                                     const ParamLayout& layout) {
  const ModelConfig stored = read_hf_model_config(dir);
  try {
    const std::string diff = describe_model_difference(stored, model);
    TANDEM_CHECK(diff.empty(),
                 "the checkpoint's model differs from the config's (checkpoint vs "
                 "config: ",
                 diff, "); make the config's model section the checkpoint's");
    std::vector<float> params(layout.num_elements());
    read_hf_weights(dir, layout, params.data());
    return params;
  } catch (const Error& e) {
    fail("train.init_from ", dir.string(), ": ", e.what());
  }
}

}  // namespace tandem
