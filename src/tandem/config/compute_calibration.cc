#include "tandem/config/compute_calibration.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "tandem/comm/agreement.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/core/error.h"
#include "tandem/core/timer.h"
#include "tandem/model/model_family.h"

namespace tandem {

namespace {

struct PassTimes {
  double forward = std::numeric_limits<double>::infinity();
  double backward = std::numeric_limits<double>::infinity();
};

// One forward and backward of a micro-batch of B on `model`, timed.
PassTimes time_pass(Model& model, const std::vector<int32_t>& tokens,
                    const std::vector<int32_t>& targets, int B, int T) {
  Stream& stream = model.backend().stream();
  model.zero_grads();
  stream.synchronize();
  PassTimes pass;
  Stopwatch forward;
  model.forward(tokens.data(), targets.data(), B, T);
  stream.synchronize();
  pass.forward = forward.seconds();
  Stopwatch backward;
  model.backward();
  stream.synchronize();
  pass.backward = backward.seconds();
  return pass;
}

// Every rank's `pass` (every rank calls it), the slowest of each: ranks that train together
// wait for the slowest at every collective.
PassTimes slowest_rank(Communicator& peers, const PassTimes& pass) {
  std::vector<PassTimes> all(static_cast<size_t>(peers.world_size()));
  peers.all_gather(&pass, all.data(), sizeof pass);
  PassTimes slowest{0, 0};
  for (const PassTimes& p : all)
    slowest = {std::max(slowest.forward, p.forward), std::max(slowest.backward, p.backward)};
  return slowest;
}

PassTimes fastest(const std::vector<PassTimes>& passes) {
  PassTimes best;
  for (const PassTimes& p : passes)
    best = {std::min(best.forward, p.forward), std::min(best.backward, p.backward)};
  return best;
}

PassTimes median(std::vector<PassTimes> passes) {
  const auto middle = [&](double PassTimes::*part) {
    std::vector<double> v;
    for (const PassTimes& p : passes) v.push_back(p.*part);
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  return {middle(&PassTimes::forward), middle(&PassTimes::backward)};
}

// A layer's time and the rest's from the one- and two-layer models' (t1, t2), kept
// positive when noise makes the difference implausible (a layer at least a twentieth and
// at most half of the two-layer model's time).
PassSeconds split_layers(double t1, double t2) {
  const double layer = std::clamp(t2 - t1, 0.05 * t2, 0.5 * t2);
  return {layer, std::max(0.0, t2 - 2 * layer)};
}

}  // namespace

ComputeRates calibrate_compute_rates(const TrainConfig& config, Device& device,
                                     std::vector<int> micro_batches, int passes,
                                     Communicator* peers) {
  if (peers != nullptr && peers->world_size() == 1) peers = nullptr;
  if (peers != nullptr) {  // rank 0's list: a rank's host memory may have left it others
    nlohmann::json mine = micro_batches;
    micro_batches =
        nlohmann::json::parse(broadcast_string(*peers, mine.dump(), 0)).get<std::vector<int>>();
  }
  std::sort(micro_batches.begin(), micro_batches.end());
  micro_batches.erase(std::unique(micro_batches.begin(), micro_batches.end()), micro_batches.end());
  TANDEM_CHECK(!micro_batches.empty() && micro_batches.front() > 0,
               "calibrate_compute_rates needs positive micro-batches");
  const int T = config.seq_len();
  std::unique_ptr<ComputeBackend> backend =
      device.kind() == DeviceKind::kCuda ? make_cuda_backend(device) : make_cpu_backend(device);
  ModelConfig shapes[2] = {config.model, config.model};
  shapes[0].n_layer = 1;
  shapes[1].n_layer = 2;
  // What a model of `shape` takes at micro-batch B: its parameters, gradients, activations
  // (a tenth more for the backend's workspace).
  const auto bytes = [&](const ModelConfig& shape, int B) {
    const size_t e = storage_dtype_bytes(config.storage_dtype());
    return (model_layout(shape).num_elements() * 2 * e +
            model_activation_bytes(shape, B, T, config.storage_dtype())) /
           10 * 11;
  };
  const size_t free = device.device_free();
  std::erase_if(micro_batches, [&](int B) { return bytes(shapes[1], B) > free; });
  // What a model needs grows with B, so every rank kept a prefix of the same list: the
  // shortest is the one all can time.
  if (peers != nullptr) micro_batches.resize(min_over_ranks(*peers, micro_batches.size()));
  TANDEM_CHECK(!micro_batches.empty(), "the ", device.name(),
               " device cannot hold a two-layer model of this width to time its passes; set "
               "train_micro_batch_size_per_gpu, gradient_accumulation_steps and "
               "activation_checkpointing.interval to numbers");
  const int most = micro_batches.back();
  // Both models at once when they fit, their passes alternating so that a neighbour's load
  // falls on both alike; else one after the other. Each time is the fastest of `passes`
  // (with peers, the median: see the header).
  bool together = bytes(shapes[0], most) + bytes(shapes[1], most) <= free;
  if (peers != nullptr) together = all_ranks_ok(*peers, together);
  // With peers, every rank starts the pass together and its time is the slowest rank's.
  const auto timed_pass = [&](Model& model, const std::vector<int32_t>& tokens,
                              const std::vector<int32_t>& targets, int B) {
    if (peers != nullptr) peers->barrier();
    const PassTimes pass = time_pass(model, tokens, targets, B, T);
    return peers != nullptr ? slowest_rank(*peers, pass) : pass;
  };
  const std::vector<std::vector<int>> groups =
      together ? std::vector<std::vector<int>>{{0, 1}} : std::vector<std::vector<int>>{{0}, {1}};
  std::vector<PassTimes> times[2];
  for (const std::vector<int>& group : groups) {
    std::unique_ptr<Model> models[2];
    for (int m : group) {
      models[m] = make_model(shapes[m], *backend, most, T, config.storage_dtype());
      // Zero weights: the kernels' time does not depend on the values, and a random
      // initialisation of a large vocabulary's embeddings would take longer than the timing.
      backend->fill_zero(models[m]->params(), models[m]->layout().num_elements() *
                                                  storage_dtype_bytes(models[m]->dtype()));
    }
    for (int B : micro_batches) {
      const size_t n = static_cast<size_t>(B) * T;
      std::vector<int32_t> tokens(n), targets(n);
      const auto V = static_cast<size_t>(config.model.vocab_size);
      for (size_t i = 0; i < n; i++) {  // any ids: the kernels' time does not depend on them
        tokens[i] = static_cast<int32_t>((i * 7919) % V);
        targets[i] = static_cast<int32_t>((i * 104729 + 1) % V);
      }
      for (int m : group) timed_pass(*models[m], tokens, targets, B);  // warm-up
      std::vector<PassTimes> passes_of[2];
      for (int pass = 0; pass < passes; pass++)
        for (int m : group) passes_of[m].push_back(timed_pass(*models[m], tokens, targets, B));
      for (int m : group)
        times[m].push_back(peers != nullptr ? median(passes_of[m]) : fastest(passes_of[m]));
    }
  }
  ComputeRates rates;
  for (size_t i = 0; i < micro_batches.size(); i++)
    rates.samples.push_back({.micro_batch = micro_batches[i],
                             .forward = split_layers(times[0][i].forward, times[1][i].forward),
                             .backward = split_layers(times[0][i].backward, times[1][i].backward)});
  rates.source =
      cat("measured on the ", device.name(), " device (1 and 2 layers, ",
          peers != nullptr ? cat(peers->world_size(), " ranks in step, the slowest's, median")
                           : std::string("fastest"),
          " of ", passes, " passes)");
  return rates;
}

std::vector<int> calibration_batches(std::vector<int> wanted, int seq_len, int max_tokens,
                                     int most) {
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  if (wanted.empty()) return wanted;
  std::vector<int> within;
  for (int B : wanted)
    if (int64_t{B} * seq_len <= max_tokens) within.push_back(B);
  if (within.empty()) return {wanted.front()};
  // From the largest down, each at most half the one before, until `most` are taken.
  std::vector<int> chosen = {within.back()};
  for (auto it = within.rbegin() + 1; it != within.rend(); ++it)
    if (static_cast<int>(chosen.size()) < most - 1 && 2 * *it <= chosen.back())
      chosen.push_back(*it);
  if (chosen.back() != within.front()) chosen.push_back(within.front());
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

}  // namespace tandem
