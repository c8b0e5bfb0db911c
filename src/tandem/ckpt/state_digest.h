// The optimizer state as one number: XXH3-64 over the fp32 params and every state array of
// the update rule, flat over all parameters. Equal digests mean bit-identical state; the
// tests and tools/record_digests.sh compare runs by it, and every run's last metrics
// record carries it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace tandem {

class Communicator;
class UpdateEngine;

// The digest of the whole run's state, the same on every rank (a collective). With one
// rank it is hashed piece by piece as the engine reads it (no host copy of the state: 81 GB
// for a 7B model). With several, `gather_partitions` fills an array's partitions from their
// owners (ZeRO), and state every rank keeps of its own (`state_per_rank`, DeMo's momentum)
// is hashed for every rank, in rank order.
std::string state_digest(UpdateEngine& engine, Communicator& comm, size_t num_params,
                         bool state_per_rank,
                         const std::function<void(float* array)>& gather_partitions);

}  // namespace tandem
