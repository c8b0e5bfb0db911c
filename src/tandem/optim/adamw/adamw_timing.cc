#include "tandem/optim/adamw/adamw_timing.h"

#include <algorithm>
#include <vector>

#include "tandem/optim/adamw/adamw_rule.h"

namespace tandem {

UpdateRates calibrate_adamw_rates(Device& device, ThreadPool& pool, size_t sample_params,
                                  const UpdateDTypes& types, size_t pass_params,
                                  const std::function<void()>& before_each_kind) {
  AdamWRule adamw(AdamWHyper{.lr = 1e-4f, .weight_decay = 0.01f}, pool);
  return calibrate_update_rates(device, adamw, sample_params, types, pass_params,
                                before_each_kind);
}

AdamWArrays fill_adamw_timing_state(Device& device, Stream& stream, float* state, size_t n) {
  std::vector<float> init(4 * n, 0.0f);
  std::fill(init.begin(), init.begin() + n, 1.0f);
  std::fill(init.begin() + 3 * n, init.end(), 1e-3f);
  device.copy_async(state, init.data(), init.size() * sizeof(float), stream);
  stream.synchronize();
  AdamWArrays arrays;
  arrays.params = state;
  arrays.m = state + n;
  arrays.v = state + 2 * n;
  arrays.grads = state + 3 * n;
  return arrays;
}

}  // namespace tandem
