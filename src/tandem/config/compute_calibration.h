// The forward and backward times the step planner (step_plan.h) predicts from, measured on
// the run's own device: a model of the config's widths, sequence and precision with one
// layer and with two, each pass timed at each micro-batch; a layer's time is the
// difference, the rest (embeddings, head, loss) what the one-layer model takes beyond it.
#pragma once

#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/config/step_plan.h"
#include "tandem/config/train_config.h"
#include "tandem/device/device.h"

namespace tandem {

// At each of `micro_batches` that the device's free memory holds a two-layer model of (throws
// naming the settings to fix when none): the fastest of `passes` timed passes after a
// warm-up. `peers`: the ranks that calibrate at this moment on the same cores, every one of
// them calling it with the same `passes`. They time rank 0's micro-batches, only those every
// rank's memory holds, start every pass together and count it at the slowest rank's time, the
// median of `passes`: a training step meets the others' load and waits for the slowest at its
// collectives. Timed alone, a rank's fastest pass is one that ran while the others happened
// to wait, and the plan would promise what training never sees.
constexpr int kCalibrationPasses = 5;
ComputeRates calibrate_compute_rates(const TrainConfig& config, Device& device,
                                     std::vector<int> micro_batches,
                                     int passes = kCalibrationPasses,
                                     Communicator* peers = nullptr);

// The micro-batches worth timing among `wanted` (ascending, distinct): those of at most
// `max_tokens` tokens (beyond, the time per sequence is the largest sample's), and of those
// at most `most` spread from the largest down (halving), the smallest always included.
std::vector<int> calibration_batches(std::vector<int> wanted, int seq_len, int max_tokens,
                                     int most = 5);

}  // namespace tandem
