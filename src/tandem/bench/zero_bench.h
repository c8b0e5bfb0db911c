// `tandem bench zero`: each ZeRO stage at each world size, as real training runs that this
// process launches (mpirun for more than one rank), measured from their metrics: seconds
// per step, bytes per rank per tier (allocated up front, so the run's peak) and bytes each
// rank sent and received per step. The state digest of every run is reported too: at one
// world size every stage must give the same one.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem {

struct ZeroBenchOptions {
  std::filesystem::path config;
  std::vector<std::string> overrides;  // --set key=value, applied to every run
  std::vector<int> world_sizes = {1, 2, 4};
  std::vector<int> stages = {0, 1, 2, 3};
  int steps = 5;   // timed steps per run
  int warmup = 2;  // steps run first and not timed
  std::filesystem::path tandem_binary;
  // Told of each run before it starts ("stage 1, 4 ranks"); may be empty.
  std::function<void(const std::string&)> progress;
};

struct ZeroBenchCase {
  int world_size = 1;
  int stage = 0;
  double seconds_per_step = 0;   // median of the timed steps
  double tokens_per_s = 0;       // of the global batch, median
  size_t model_state_bytes = 0;  // rank 0: working params, gradients, fp32 params, m, v
  size_t device_bytes = 0, pinned_host_bytes = 0, host_bytes = 0;  // rank 0, per tier
  double comm_bytes_sent = 0, comm_bytes_received = 0;             // rank 0, per step
  // Rank 0, per step (medians): milliseconds its collectives on the model's buffers ran on
  // their own thread, and of them those the training thread waited for (overlap_comm; 0
  // without overlap).
  double collective_ms = 0, collective_wait_ms = 0;
  std::string state_digest;
};

// Runs every (world size, stage) pair; throws tandem::Error with the run's output when a
// run fails, or when mpirun is needed and missing.
std::vector<ZeroBenchCase> run_zero_bench(const ZeroBenchOptions& options);
std::string zero_bench_table(const std::vector<ZeroBenchCase>& cases);
nlohmann::json zero_bench_json(const std::vector<ZeroBenchCase>& cases);

}  // namespace tandem
