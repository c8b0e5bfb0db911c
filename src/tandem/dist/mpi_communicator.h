// The MPI backend (host memory): the ranks of an `mpirun -np N` launch. The collectives
// keep the Communicator contract by doing their own sums, with tree_sum (tree_sum.h):
// reduce-scatter exchanges the slices with MPI_Alltoall and tree-sums them on each rank,
// all-reduce is that reduce-scatter followed by an all-gather, and reduce gathers every
// rank's data on the root with MPI_Gather and tree-sums it there. MPI's own reductions
// (whose order the library picks) are never used.
#pragma once

#include <memory>

#include "tandem/dist/communicator.h"

namespace tandem {

// Whether tandem was built with MPI (Debian's libopenmpi-dev found at configure time).
bool mpi_available();
// Whether this process was started by an MPI launcher (mpirun, srun with PMI).
bool launched_by_mpi();

// The communicator of all ranks of the launch (a duplicate of MPI_COMM_WORLD). Initializes
// MPI on first use and finalizes it when the last such communicator is destroyed. Throws
// tandem::Error, saying how to fix it, when tandem was built without MPI.
std::unique_ptr<Communicator> make_mpi_communicator();

// The communicator a training process uses: MPI's when started by an MPI launcher, else a
// world of one rank that needs no MPI at all.
std::unique_ptr<Communicator> make_world_communicator();

}  // namespace tandem
