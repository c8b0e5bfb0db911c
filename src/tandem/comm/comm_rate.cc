#include "tandem/comm/comm_rate.h"

#include <algorithm>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/core/timer.h"

namespace tandem {

CommRate measure_comm_rate(Communicator& comm, size_t floats) {
  const int N = comm.world_size();
  if (N <= 1) return {};
  TANDEM_CHECK(floats > 0, "measure_comm_rate needs a positive count of floats");
  // Zeros stay zeros, so the timed sums never meet an overflow or a denormal.
  std::vector<float> data(floats, 0.0f);
  comm.all_reduce_sum(data.data(), floats);  // warm-up: connections, pages, staging areas
  std::vector<double> seconds;
  for (int i = 0; i < 3; i++) {
    comm.barrier();
    const Stopwatch watch;
    comm.all_reduce_sum(data.data(), floats);
    seconds.push_back(watch.seconds());
  }
  const double ring_bytes = 2.0 * (N - 1) / N * static_cast<double>(floats) * sizeof(float);
  double rate = ring_bytes / std::max(median(seconds), 1e-9);
  comm.broadcast(&rate, sizeof(rate), 0);
  return {rate, cat("measured: ", comm.backend(), " all-reduce of ",
                    format_fixed(static_cast<double>(floats) * sizeof(float) / (1 << 20), 0),
                    " MiB over ", N, " ranks")};
}

}  // namespace tandem
