#include "tandem/bench/checkpoint_io_bench.h"

#include <unistd.h>

#include <cstring>

#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/comm/mpi_communicator.h"
#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/core/rng.h"
#include "tandem/core/scratch_dir.h"
#include "tandem/core/thread_pool.h"
#include "tandem/core/timer.h"
#include "tandem/device/device.h"
#include "tandem/model/model_family.h"
#include "tandem/offload/update_engine.h"
#include "tandem/optim/optimizer_family.h"

namespace tandem {
namespace fs = std::filesystem;
namespace {

// The model's params and optimizer state, random and finite (a checkpoint refuses others),
// at a step past the first so that every file is the one a run writes.
TrainingState random_state(const TrainConfig& config) {
  TrainingState state;
  state.config = config;
  state.step = 1000;
  const size_t P = model_layout(config.model).num_elements();
  Rng rng(config.train.seed);
  state.params.resize(P);
  for (float& x : state.params) x = 0.02f * rng.normal();
  for (size_t k = 0; k < optimizer_family(config.optimizer.type).state_names().size(); k++) {
    std::vector<float>& array = state.optimizer_state.emplace_back(P);
    for (float& x : array) x = 1e-3f * rng.uniform();
  }
  return state;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

CheckpointIoBenchResult run_checkpoint_io_bench(const CheckpointIoBenchOptions& options) {
  TANDEM_CHECK(options.rounds > 0, "bench checkpoint-io: --rounds ", options.rounds,
               " is not positive; pass 1 or more");
  const fs::path parent = options.dir.empty() ? fs::temp_directory_path() : options.dir;
  std::error_code ec;
  TANDEM_CHECK(fs::is_directory(parent, ec), "bench checkpoint-io: --dir ", parent.string(),
               " is not a directory; name an existing directory on the disk to measure");
  const ScratchDir scratch(parent / cat("tandem_bench_checkpoint_io_", ::getpid()));
  const TrainingState state = random_state(options.config);

  CheckpointIoBenchResult result;
  result.params = static_cast<int64_t>(state.params.size());
  result.array_bytes = (1 + state.optimizer_state.size()) * state.params.size() * sizeof(float);
  result.dir = parent;
  const ParamLayout layout = model_layout(options.config.model);
  for (const ParamView& view : layout.views()) result.tensors.emplace_back(view.name, view.shape);
  result.optimizer_arrays = optimizer_family(options.config.optimizer.type).state_names();
  // What a resume streams the files into: the update engine of a run on the cpu device,
  // as the config plans its subgroups, new each round (as a resumed run's is).
  const std::unique_ptr<Device> device = make_cpu_device({});
  ThreadPool pool;
  const std::unique_ptr<Communicator> comm = make_world_communicator();
  for (int round = 0; round < options.rounds; round++) {
    DeviceAllocation working = device->allocate(MemorySpace::kDevice, state.params.size() * 4);
    DeviceAllocation grads = device->allocate(MemorySpace::kDevice, state.params.size() * 4);
    UpdateEngine engine(
        *device, layout, make_offload_plan(options.config.offload, state.params.size()),
        optimizer_family(options.config.optimizer.type)
            .make_rule(options.config.optimizer, layout, *comm, pool),
        UpdateEngine::DeviceBuffers{.working_params = working.data(), .grads = grads.data()});
    const fs::path root = scratch.path() / cat("round_", round);
    Stopwatch save_watch;
    const fs::path saved = save_training_checkpoint(root, state);
    result.save_ms.push_back(save_watch.millis());
    result.checkpoint_bytes = directory_bytes(saved);

    Stopwatch load_watch;
    const TrainingState loaded = load_training_checkpoint(saved);
    result.load_ms.push_back(load_watch.millis());
    // What was measured must be a round trip: the bits that went out came back.
    bool same = same_bits(loaded.params, state.params) &&
                loaded.optimizer_state.size() == state.optimizer_state.size();
    for (size_t k = 0; same && k < state.optimizer_state.size(); k++)
      same = same_bits(loaded.optimizer_state[k], state.optimizer_state[k]);
    TANDEM_CHECK(same, saved.string(), ": the state read back differs from the state saved");

    Stopwatch resume_watch;
    const TrainingState resumed = read_training_state(saved);
    engine.load_state(
        [&](const UpdateEngine::StateSink& put, const UpdateEngine::StatePlace& place) {
          stream_training_arrays(saved, resumed, {}, put, place);
        },
        resumed.step);
    result.resume_ms.push_back(resume_watch.millis());
    std::vector<std::vector<float>> arrays(1 + state.optimizer_state.size(),
                                           std::vector<float>(state.params.size()));
    std::vector<float*> into;
    for (std::vector<float>& array : arrays) into.push_back(array.data());
    engine.read_state(into);
    same = same_bits(arrays[0], state.params);
    for (size_t k = 0; same && k < state.optimizer_state.size(); k++)
      same = same_bits(arrays[1 + k], state.optimizer_state[k]);
    TANDEM_CHECK(same, saved.string(), ": the state resumed differs from the state saved");
    fs::remove_all(root);
  }
  result.save_ms_median = median(result.save_ms);
  result.load_ms_median = median(result.load_ms);
  result.resume_ms_median = median(result.resume_ms);
  return result;
}

nlohmann::json CheckpointIoBenchResult::to_json() const {
  return {{"params", params},
          {"checkpoint_bytes", checkpoint_bytes},
          {"array_bytes", array_bytes},
          {"dir", dir.string()},
          {"tensors", tensors},
          {"optimizer_arrays", optimizer_arrays},
          {"rounds", save_ms.size()},
          {"save_ms", save_ms},
          {"load_ms", load_ms},
          {"resume_ms", resume_ms},
          {"save_ms_median", save_ms_median},
          {"load_ms_median", load_ms_median},
          {"resume_ms_median", resume_ms_median},
          {"save_gb_per_s", gb_per_s(save_ms_median)},
          {"load_gb_per_s", gb_per_s(load_ms_median)},
          {"resume_gb_per_s", gb_per_s(resume_ms_median)}};
}

std::string CheckpointIoBenchResult::to_text() const {
  const auto rate = [this](double ms) { return format_fixed(gb_per_s(ms), 2); };
  return cat(params, " parameters, a checkpoint of ", format_bytes(checkpoint_bytes), " in ",
             dir.string(), ", ", save_ms.size(), " rounds\n",
             "save (synchronous, fsync'ed): ", format_fixed(save_ms_median, 1), " ms median, ",
             rate(save_ms_median), " GB/s\n",
             "load (checksums verified):    ", format_fixed(load_ms_median, 1), " ms median, ",
             rate(load_ms_median), " GB/s\n",
             "resume (into the engine):     ", format_fixed(resume_ms_median, 1), " ms median, ",
             rate(resume_ms_median), " GB/s\n");
}

}  // namespace tandem
