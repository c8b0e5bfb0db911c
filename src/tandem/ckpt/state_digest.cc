#include "tandem/ckpt/state_digest.h"

#include <algorithm>

#include "tandem/comm/communicator.h"
#include "tandem/core/checksum.h"
#include "tandem/offload/update_engine.h"

namespace tandem {

std::string state_digest(UpdateEngine& engine, Communicator& comm, size_t num_params,
                         bool state_per_rank,
                         const std::function<void(float* array)>& gather_partitions) {
  if (comm.world_size() == 1) {
    Checksum64Stream digest;
    engine.read_state([&](size_t, ParamRange range, const float* values) {
      digest.update(values, range.size() * sizeof(float));
    });
    return checksum_hex(digest.digest());
  }
  std::vector<std::vector<float>> state = read_engine_state(engine, num_params);
  for (std::vector<float>& array : state) gather_partitions(array.data());
  const size_t P = num_params;
  const size_t world = static_cast<size_t>(comm.world_size());
  std::vector<float> all(state[0]);
  for (size_t k = 1; k < state.size(); k++) {
    const size_t at = all.size();
    all.resize(at + (state_per_rank ? world : 1) * P);
    if (state_per_rank)
      comm.all_gather(state[k].data(), all.data() + at, P * sizeof(float));
    else
      std::copy(state[k].begin(), state[k].end(), all.begin() + static_cast<ptrdiff_t>(at));
  }
  return checksum_hex(checksum64(all.data(), all.size() * sizeof(float)));
}

}  // namespace tandem
