// The MPI backend (host memory): the ranks of an `mpirun -np N` launch. The collectives
// keep the Communicator contract by doing their own sums, with tree_sum (tree_sum.h), over
// nonblocking point-to-point messages (MPI_Isend, MPI_Irecv to and from each peer):
// reduce-scatter sends each rank its slice of every rank's data and tree-sums them there,
// all-reduce is that reduce-scatter (slices of ceil(n / N), the last ones shorter) followed
// by an all-gather of the sums, and reduce sends every rank's data to the root in 4 MiB
// pieces and tree-sums each there. MPI's own collectives and reductions (whose order the
// library picks, and which wait forever) are never used.
//
// Every call waits for its messages with a deadline (Communicator::timeout:
// TANDEM_COMM_TIMEOUT_S, else 600 s; set_timeout), polling MPI_Testsome and sleeping
// between polls (50 us, growing to 1 ms after 2 ms without progress: a rank waiting for
// a slow or hung one leaves the cores to the others). At the deadline it throws, naming
// the ranks whose messages did not arrive (or that did not take this rank's):
//
//   rank 0: no data from rank(s) 2 within 600 s in all_reduce_sum (dead or hung?); raise
//   TANDEM_COMM_TIMEOUT_S if a rank is only slow
//
// It cancels its receives still posted; its sends cannot be taken back. After a timeout
// (or any failed collective) the communicator refuses every further call, since the ranks
// are out of step: stop the job with abort() (MPI_Abort, which also ends the hung rank;
// tandem train does). Destroying the last communicator finalizes MPI, which waits for every
// rank, so a process must not just return after a timeout while a rank hangs.
//
// Point to point goes on its own duplicate of MPI_COMM_WORLD, the collectives on another,
// tagged by a count of collectives: a user's tags never meet theirs. Messages past 1 GiB go
// in several MPI messages (MPI counts are int).
#pragma once

#include <memory>
#include <string>

#include "tandem/comm/communicator.h"

namespace tandem {

// Whether tandem was built with MPI (Debian's libopenmpi-dev found at configure time).
bool mpi_available();
// Whether this process was started by an MPI launcher (mpirun, srun with PMI).
bool launched_by_mpi();

// What follows `mpirun` to start `ranks` ranks on this machine: " -np N", after
// --allow-run-as-root when this process is root (OpenMPI refuses root without it) and
// --oversubscribe when there are more ranks than CPUs (it refuses that without it).
std::string mpirun_options(int ranks);

// The communicator of all ranks of the launch (a duplicate of MPI_COMM_WORLD). Initializes
// MPI on first use and finalizes it when the last such communicator is destroyed. Throws
// tandem::Error, saying how to fix it, when tandem was built without MPI.
std::unique_ptr<Communicator> make_mpi_communicator();

// The communicator a training process uses: MPI's when started by an MPI launcher, else a
// world of one rank that needs no MPI at all.
std::unique_ptr<Communicator> make_world_communicator();

}  // namespace tandem
