// The buffer communicator of a one-rank job on a device whose memory the host cannot read
// (a GPU): the model's gradient and parameter buffers of a data-parallel run at world size 1
// on the cuda device go through it.
//
// Over one rank every collective is its own data: a sum over one rank is the value itself
// (the tree of comm/tree_sum.h over one value), a gather or a reduce-scatter is a copy, a
// broadcast or an in-place reduce is nothing. The in-process and MPI backends would do the
// same with memcpy and tree_sum on the host, which reads device memory: on a real GPU that
// is a segmentation fault (found by the first GPU run; the emulated GPU of CI keeps device
// memory in host memory and could not see it). NCCL would work, but a one-GPU job should
// not need the library. The copies run on the device's copy engine, on this communicator's
// own stream, and every call returns once they are done, as NCCL's calls do: the caller's
// work on the buffers must be finished before the call.
//
// Point to point has no peer at world size 1 and is refused, as by every backend; so are
// roots other than 0. Traffic stays zero (ring volumes over one rank).
#pragma once

#include <memory>

#include "tandem/comm/communicator.h"

namespace tandem {

class Device;

// A world of one rank over `device`'s memory; the device must outlive it.
std::unique_ptr<Communicator> make_one_rank_device_communicator(Device& device);

}  // namespace tandem
