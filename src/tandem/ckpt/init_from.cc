#include "tandem/ckpt/init_from.h"

#include <nlohmann/json.hpp>
#include <string>

#include "tandem/ckpt/hf_weights.h"
#include "tandem/core/error.h"
#include "tandem/model/model_family.h"

namespace tandem {

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
