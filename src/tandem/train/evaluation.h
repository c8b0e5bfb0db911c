// The validation loss a run reports every train.eval_interval steps.
#pragma once

#include <cstdint>

#include "tandem/data/loader.h"
#include "tandem/model/model.h"

namespace tandem {

// The mean loss of `model` over the first `max_batches` batches of B x T of `loader` (from
// its start; at most an epoch). With a loss mask: the mean over every target it counts (NaN
// when it counts none).
float validation_loss(Model& model, DataLoader& loader, int64_t max_batches, int B, int T);

}  // namespace tandem
