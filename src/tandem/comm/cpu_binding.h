// The CPUs a job's ranks may run on, and a warning when their launcher's binding leaves most of
// a machine idle. OpenMPI's mpirun binds each rank to one core when it starts two or fewer
// (to a socket beyond), so `mpirun -np 2 tandem train` on a 64-core GPU server would update
// the offloaded optimizer state, and run the cpu device's compute, on 2 cores while 62 wait.
//
// The reference is the launcher's own CPUs (the rank's parent process: mpirun, OpenMPI's
// orted, Slurm's slurmstepd), not the machine's: a container's or a job allocation's cpuset
// narrows the launcher as much as its ranks, and is no binding of the launcher's making.
#pragma once

#include <string>
#include <vector>

namespace tandem {

class Communicator;

// Where one rank runs.
struct RankCpus {
  std::string host;  // as gethostname gives it (sent between ranks: its first 63 bytes)
  std::vector<int> cpus;           // those it may run on (its affinity), in increasing order
  std::vector<int> launcher_cpus;  // its parent process's; empty when they cannot be read
};

// This process's: its host name, its main thread's affinity (the trainer's threads start from
// it; a thread pool may pin its workers within it) and its parent's.
RankCpus this_rank_cpus();

// "0-3,8,10-11": CPU numbers in increasing order, runs of consecutive ones as ranges.
std::string cpu_list_text(const std::vector<int>& cpus);

// For every rank's `RankCpus` (in rank order), the warning due on the first host whose ranks
// may together run on at most half of the CPUs their launcher may, with the options that give
// them the rest; "" where every host's ranks may use more.
std::string cpu_binding_warning(const std::vector<RankCpus>& ranks);

// The same over `comm`'s ranks (every rank calls it; each gets the same text).
std::string cpu_binding_warning(Communicator& comm);

}  // namespace tandem
