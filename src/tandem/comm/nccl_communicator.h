// The NCCL backend: the Communicator interface (communicator.h) with every buffer in the
// DEVICE memory of this rank's GPU (cudaMalloc'ed, on the GPU the communicator picked; see
// below). One rank per GPU; the ranks are those of a host communicator (`bootstrap`: MPI's,
// or a LocalGroup), which carries NCCL's unique id from rank 0 to the others.
//
// Placement: every rank tells the others its host name, its CUDA_VISIBLE_DEVICES and its
// number of GPUs (an all-gather over `bootstrap`); the ranks on one host that see the same
// devices take GPUs 0, 1, ... in rank order. Every rank makes the same decision, so a bad
// placement fails on every rank at once, with one line:
//
//   NCCL needs a GPU per rank; this machine (host h) has none (cudaGetDeviceCount: ...); run
//   the MPI backend on the cpu device
//   rank 4 is the 5th rank on host h, which has 4 GPUs; start at most one rank per GPU
//   (mpirun --map-by ppr:4:node)
//
// NCCL is loaded at run time (dlopen of libnccl.so.2, or of TANDEM_NCCL_LIBRARY): tandem
// binaries do not link it, and nothing but this backend needs it. A missing library is one
// line naming LD_LIBRARY_PATH and where NCCL comes from.
//
// Determinism as for every backend: no NCCL reduction is ever used. Data moves with grouped
// ncclSend/ncclRecv (reduce-scatter: every rank's slice for this rank into a device staging
// area; reduce: everything to the root, in pieces of 4 Mi floats) and is then summed in the
// tree order of tree_sum.h on the device, one level of the tree at a time, with cuBLAS
// saxpy (y = 1 * x + y, which is exactly the IEEE sum x + y, fused or not). All-reduce is
// that reduce-scatter (slices of ceil(n / N)) and an ncclAllGather of the sums; all-gather,
// broadcast, send and recv are ncclAllGather, ncclBroadcast, ncclSend and ncclRecv. The
// sums match tree_sum on the host bit for bit, except possibly the payload of a NaN.
//
// Every call is synchronous: it runs on the communicator's own CUDA stream and returns once
// that stream is done. The caller's work on the buffers (on its own streams) must be
// finished before the call. The staging area (world_size slices of the largest all-reduce
// or reduce-scatter, about its size) is kept for later calls.
//
// Timeouts: a call waits for its stream at most timeout() (TANDEM_COMM_TIMEOUT_S, else 600
// s; set_timeout), polling cudaStreamQuery and ncclCommGetAsyncError, and then throws
// "rank R: the NCCL all_reduce_sum did not finish within T s ..." after aborting the NCCL
// communicator; NCCL cannot say which rank is missing. ncclCommInitRank and the connection
// set-up of a pair's first exchange (inside ncclGroupEnd) wait by NCCL's own rules. After a
// failed call the communicator refuses further calls: stop the job with abort()
// (ncclCommAbort, then the bootstrap's abort: MPI_Abort).
//
// Tags of send and recv are not checked: NCCL matches the messages of a pair of ranks in
// order, whatever their tags.
//
// What has run where: CI (no GPU) builds this backend and runs the no-GPU error, the
// placement rules and a build without NCCL; world size 1 through NCCL and the device tree
// sum against tree_sum need a GPU (tests/comm/test_nccl.cc, run by bench/gpu_goals.sh), and
// several ranks need several GPUs (NcclOnSeveralGpus, not run by this project so far).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/half.h"

namespace tandem {

// The library the NCCL backend loads instead of libnccl.so.2 (a path, or a name that
// LD_LIBRARY_PATH resolves).
inline constexpr const char* kNcclLibraryVariable = "TANDEM_NCCL_LIBRARY";

// Whether tandem was built with the NCCL backend (a CUDA toolkit with nccl.h at configure
// time). libnccl itself is looked for only when a communicator is made.
bool nccl_available();

// The NCCL communicator of bootstrap's ranks, on GPU (node-local rank) of each; collective
// over `bootstrap`, which must outlive it (abort() aborts it too). Throws tandem::Error,
// on every rank, for the placements above, a missing libnccl, or a build without NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap);
// The GPU an NCCL communicator (from make_nccl_communicator) runs on: the one the rank's
// training device must use.
int nccl_communicator_device(const Communicator& nccl);

// What a rank tells the others before NCCL starts (for the placement rules; public for
// tests).
struct NcclRankPlace {
  std::string host;             // gethostname
  std::string visible_devices;  // CUDA_VISIBLE_DEVICES as this rank sees it ("" if unset)
  int gpu_count = 0;            // cudaGetDeviceCount
  std::string no_gpu_reason;    // why gpu_count is 0: "cudaGetDeviceCount: ..."
};

// The GPU index rank `rank` uses, from every rank's place; throws the one-line errors
// above (the same on every rank: the first rank that cannot have a GPU is named, this
// rank first when it has none).
int nccl_device_of_rank(const std::vector<NcclRankPlace>& places, int rank);

// The backend's sum on the device (for tests): `slots` holds `count` arrays of n floats
// one after another in the current GPU's memory; afterwards slots[0, n) is their tree sum
// (tree_sum.h), computed with cuBLAS saxpy as the backend computes it; the other slots are
// overwritten. Synchronous. Throws in a build without NCCL.
void nccl_tree_sum_on_device(float* slots, int count, size_t n);
// The same over bf16 values, every addition in fp32 rounded to bf16 (cublasAxpyEx), as
// all_reduce_sum_bf16 and reduce_sum_bf16 sum them.
void nccl_tree_sum_on_device(Bf16* slots, int count, size_t n);

}  // namespace tandem
