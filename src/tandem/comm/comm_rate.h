// How fast the ranks of a data-parallel run move their data: the bytes per second a rank's
// share of a collective moves at, counted as Communicator::traffic() counts it (a ring's
// volume). The step planner (config/step_plan.h) divides the ZeRO traffic of a step
// (zero/zero_traffic.h) by it.
#pragma once

#include <cstddef>
#include <string>

#include "tandem/comm/communicator.h"

namespace tandem {

struct CommRate {
  double bytes_per_s = 0;  // 0: none known (one rank: nothing to move)
  // "measured: mpi all-reduce of 16 MiB over 4 ranks", or what was assumed.
  std::string source;
};

// Times all-reduces of `floats` floats over `comm` (after one to warm up) and returns rank
// 0's figure on every rank. Collective: every rank calls it with the same `floats`.
CommRate measure_comm_rate(Communicator& comm, size_t floats = size_t{1} << 22);

}  // namespace tandem
