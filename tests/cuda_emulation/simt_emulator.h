// A SIMT emulator that runs CUDA kernel source on the CPU, so that tests can check the real
// kernels (their indexing, tiling, barriers, and the register layouts of the tensor-core
// instructions they use) on machines without a GPU or nvcc. See README.md.
//
// Every CUDA thread of a block is a fiber (its own stack) on the one calling OS thread.
// A fiber runs until it reaches a barrier: __syncthreads, __syncwarp, or a warp-collective
// operation (shuffles, and the ldmatrix and mma emulations in hardware_primitives.inc),
// which all wait for real. Then a Schedule picks the next thread to run. So a barrier that
// not every thread reaches is a detected deadlock rather than a hang, and a kernel whose
// result depends on the order in which threads run (a missing barrier) shows up as
// results that differ between schedules or as the NaN garbage that fills shared memory.
//
// This header is also the CUDA surface that emulated source compiles against: the
// keywords (__global__, __shared__, ...), the runtime types it names (dim3, cudaStream_t),
// the built-in index variables, and the synchronizing intrinsics. stub/cuda_runtime.h and
// stub/cuda_bf16.h include it in place of the toolkit's headers.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "emulated_streams.h"

// ---- CUDA keywords: plain C++ on the host -----------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__ __restrict
#define __shared__

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// CUDA's device-side integer min and max.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

namespace cuda_emulation {

// The order in which the threads of a block run between barriers. A race-free kernel
// gives the same bits under every schedule.
enum class Schedule {
  kRoundRobin,    // the next runnable thread after the one that last ran (the default)
  kLowestFirst,   // the lowest-numbered runnable thread: warp 0 runs ahead of the others
  kHighestFirst,  // the highest-numbered: the last warp runs ahead
  kRandom,        // a pseudo-random runnable thread, from a seeded generator
};
// Applies to later launches; kRandom restarts its generator from `seed`.
void set_schedule(Schedule schedule, uint64_t seed = 1);
const char* schedule_name(Schedule schedule);

// A fault the emulator detected (a deadlock, an operand that the hardware would reject, a
// write outside shared memory). Thrown by launch(), on the calling thread.
class EmulationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs body() as every thread of every block of `grid` (one block at a time, each thread
// with threadIdx, blockIdx, blockDim and gridDim set; threads are numbered x fastest, and
// each 32 consecutive ones are a warp, as on the hardware) and returns when all are done. Each
// block gets `shared_bytes` of dynamic shared memory filled with 0xff bytes, which read as
// NaN in float and bf16, so a value read before it was written stands out.
void launch(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body);

// A kernel launch as generate_emulated_source.cmake rewrites `kernel<<<grid, block,
// shared_bytes, stream>>>(args)`: body calls the kernel with copies of the arguments (as a
// launch copies them), since it runs when the stream gets to it: at once in the default
// StreamOrder::kImmediate, later in the others (emulated_streams.h).
inline void launch_kernel(std::function<void()> body, dim3 grid, dim3 block,
                          size_t shared_bytes = 0, cudaStream_t stream = nullptr) {
  stream_scheduler().submit(stream, [body = std::move(body), grid, block, shared_bytes] {
    launch(grid, block, shared_bytes, body);
  });
}

// ---- For emulated device code (only valid inside launch()) ------------------------------

// Aborts the launch: launch() throws EmulationError(what, with the block and thread).
[[noreturn]] void fault(const std::string& what);

unsigned char* shared_memory();
size_t shared_memory_bytes();

// Waits until every thread of the block (block_barrier) or of the calling thread's warp
// (warp_barrier) has arrived. `operation` names the instruction that synchronizes: all
// lanes of a warp must be at the same one, or the emulator faults.
void block_barrier();
void warp_barrier(const char* operation);

// Where the lanes of a warp pass their operands to each other in a warp-collective
// operation: each lane writes its own slot, warp_barrier, each lane reads what it needs,
// warp_barrier again (so that no lane overwrites a slot that another still reads).
struct LaneSlot {
  uint32_t words[12];   // register operands (a shuffle uses words[0])
  const void* address;  // a per-lane address (ldmatrix's row addresses)
};
LaneSlot* warp_slots();  // the calling thread's warp: 32 slots, one per lane
unsigned lane_id();

// __syncthreads_count: a block barrier that returns how many threads passed a non-zero
// predicate.
int syncthreads_count(int predicate);

// The storage of a static __shared__ variable of `bytes` bytes, 16-byte aligned: one per
// `key` (the declaration) and block, filled with 0xff bytes when the block's first thread
// reaches the declaration, shared by all the block's threads.
void* static_shared(const void* key, size_t bytes);
// The generated sources declare `__shared__ T name[N];` as
// `T (&name)[N] = cuda_emulation::shared_variable<T[N]>([] {});`: the lambda's type is
// unique to the declaration (and to each instantiation of a template holding it).
template <typename T, typename Key>
T& shared_variable(Key) {
  static const char key = 0;
  return *static_cast<T*>(static_shared(&key, sizeof(T)));
}

// The calling thread's cp.async copies: those issued since the last commit (open) and the
// committed groups still in flight, oldest first.
struct AsyncCopy {
  void* dst;
  const void* src;
  size_t bytes;
  bool zero_fill;  // src-size 0: the destination receives zeros and src is not read
};
struct AsyncCopies {
  std::vector<AsyncCopy> open;
  std::vector<std::vector<AsyncCopy>> committed;
};
AsyncCopies& async_copies();

namespace detail {
extern dim3 thread_index, block_index, block_dim, grid_dim;
}  // namespace detail

}  // namespace cuda_emulation

// The built-in variables, read-only as in CUDA.
inline const dim3& threadIdx = cuda_emulation::detail::thread_index;
inline const dim3& blockIdx = cuda_emulation::detail::block_index;
inline const dim3& blockDim = cuda_emulation::detail::block_dim;
inline const dim3& gridDim = cuda_emulation::detail::grid_dim;

inline void __syncthreads() { cuda_emulation::block_barrier(); }
inline int __syncthreads_count(int predicate) {
  return cuda_emulation::syncthreads_count(predicate);
}

// Only whole-warp masks: the kernels this emulates never use partial ones, and emulating
// one needs the semantics of lanes that are not named.
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) cuda_emulation::fault("__syncwarp with a partial mask");
  cuda_emulation::warp_barrier("__syncwarp");
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  static_assert(sizeof(T) == sizeof(uint32_t), "32-bit shuffles only");
  if (mask != 0xffffffffu || width != 32) {
    cuda_emulation::fault("__shfl_xor_sync with a partial mask or width");
  }
  const unsigned lane = cuda_emulation::lane_id();
  cuda_emulation::LaneSlot* slots = cuda_emulation::warp_slots();
  std::memcpy(&slots[lane].words[0], &value, sizeof(T));
  cuda_emulation::warp_barrier("shfl.sync");
  T result;
  std::memcpy(&result, &slots[(lane ^ static_cast<unsigned>(lane_mask)) % 32].words[0], sizeof(T));
  cuda_emulation::warp_barrier("shfl.sync");
  return result;
}
