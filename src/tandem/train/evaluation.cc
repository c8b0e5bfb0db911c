#include "tandem/train/evaluation.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace tandem {

float validation_loss(Model& model, DataLoader& loader, int64_t max_batches, int B, int T) {
  loader.reset();
  const int64_t batches = std::min<int64_t>(max_batches, loader.batches_per_epoch());
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  double sum = 0.0;
  int64_t counted = 0;  // with a loss mask: the mean over every counted target
  for (int64_t i = 0; i < batches; i++) {
    loader.next_batch(inputs, targets);
    const float loss = model.forward(inputs.data(), targets.data(), B, T);
    sum += loader.has_loss_mask() ? double{loss} * model.counted_targets() : loss;
    counted += model.counted_targets();
  }
  if (loader.has_loss_mask())
    return counted == 0 ? std::numeric_limits<float>::quiet_NaN()
                        : static_cast<float>(sum / static_cast<double>(counted));
  return static_cast<float>(sum / batches);
}

}  // namespace tandem
