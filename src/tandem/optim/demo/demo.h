// DeMo, decoupled momentum (Peng, Quesnelle, Kingma; arXiv 2411.19870), as a library on
// plain host arrays: the paper's update rule, one tensor at a time, with the ranks'
// exchange over a Communicator. (The update engine's DeMo rule, on CPU and GPU subgroups,
// is built on these pieces: demo_rule.h.)
//
// Per tensor, on each rank, with beta = compression_decay and lr the step's learning rate
// (a double, as the schedule computes it; rounded to float where it multiplies an array):
//   1. p     = p * (1 - lr * weight_decay)          (the factor in double, rounded to
//                                                    float once, as the reference)
//   2. delta = fma(beta, delta, lr * grad)           lr inside the momentum, local gradient
//                                                    (times the clipping scale, if any)
//   3. Z     = DCT(delta) per block (demo_transform.h)
//      S     = the compression_topk coefficients of largest |Z| per block, ties to the
//              lower index, sent in that order (decreasing |Z|); a block of fewer
//              coefficients sends all of them (demo_topk: the reference's clamp)
//   4. delta = delta - IDCT(Z restricted to S)       error feedback
//   then every rank's (indices, values) are all-gathered, packed (demo_wire.h), and
//   5. Q[i]  = (sum of the values sent for coefficient i, ranks in order, from 0) / number
//              of ranks that sent i; 0 where none did
//      u     = IDCT(Q);  p = p - lr * sign(u)        sign(0) = 0
// Every rank decodes the same messages in the same order, so every rank holds the same
// parameters, bit for bit (the reference implementation leaves top-k ties and the order of
// the decode's sum to the hardware, and its replicas can drift).
//
// Usage, on each rank (in-process ranks: comm/local_group.h):
//   DemoTensor w("h.0.attn.c_attn.weight", {2304, 768}, hyper);
//   DemoArrays arrays{params, delta, grad};                 // fp32 host arrays
//   demo_step({&w}, {arrays}, lr, comm);                    // a collective
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/optim/demo/demo_transform.h"
#include "tandem/optim/demo/demo_wire.h"

namespace tandem {

class ThreadPool;

struct DemoHyper {
  float compression_decay = 0.999f;  // beta
  int64_t compression_topk = 32;     // coefficients sent per block
  int64_t compression_chunk = 64;    // most rows or columns of a block
  double weight_decay = 0.0;         // as the config gives it (see decay_factor)
  DemoValueFormat compression_values = DemoValueFormat::kFp32;  // demo_wire.h
};

// One tensor's fp32 arrays on this rank, row-major, of the tensor's size each.
struct DemoArrays {
  float* params = nullptr;  // the same on every rank
  float* delta = nullptr;   // this rank's momentum
  const float* grad = nullptr;
};

// What one rank sends for one tensor: per block, compression_topk coefficient indices
// (within the block) and their values, blocks in order.
struct DemoMessage {
  std::vector<int32_t> indices;
  std::vector<float> values;
};

// The coefficients a tensor of `blocks` sends per block: compression_topk, or the block's
// size where that is smaller (a short 1-D tensor, a prime length's blocks of 1), as the
// reference clamps it per tensor.
int64_t demo_topk(int64_t compression_topk, const DemoBlocks& blocks);

class DemoTensor {
 public:
  // Throws tandem::Error naming the tensor or the key for a tensor DeMo cannot compress
  // (0 or more than 2 dimensions) and a compression_topk below 1; topk() is demo_topk's.
  DemoTensor(std::string name, const std::vector<int64_t>& shape, const DemoHyper& hyper,
             SimdTarget target = best_simd_target());

  const std::string& name() const { return name_; }
  const DemoBlocks& blocks() const { return blocks_; }
  int64_t topk() const { return topk_; }
  float compression_decay() const { return beta_; }
  double weight_decay() const { return weight_decay_; }
  // Step 1's factor, 1 - lr * weight_decay: the double product rounded to float once, as
  // the reference's p.mul_(1 - lr * weight_decay) does (the CUDA kernels get the same).
  float decay_factor(double lr) const { return static_cast<float>(1.0 - lr * weight_decay_); }
  // How this tensor's messages are packed (the same size on every rank).
  const DemoWire& wire() const { return wire_; }

  // Steps 1 to 4 on this rank: updates params (decay) and delta, and fills `sent`. With a
  // pool, its workers share the elements and the blocks (the same bits for any number).
  // `grad_scale` multiplies the gradient first (clipping; 1 leaves it exact).
  void compress(const DemoArrays& arrays, double lr, DemoMessage& sent, ThreadPool* pool = nullptr,
                float grad_scale = 1.0f) const;
  // Step 5 from every rank's message, in rank order: u (if not null, [num_elements]) and
  // the sign step on params.
  void apply(const std::vector<const DemoMessage*>& by_rank, double lr, float* params,
             float* u = nullptr, ThreadPool* pool = nullptr) const;

 private:
  std::string name_;
  DemoBlocks blocks_;
  int64_t topk_;
  DemoWire wire_;
  float beta_;
  double weight_decay_;
};

// Every rank's messages for `tensors` ([rank][tensor], as the wire format carries them),
// from this rank's `mine` (one per tensor): one all-gather of the packed messages. A
// collective.
std::vector<std::vector<DemoMessage>> demo_exchange(const std::vector<const DemoTensor*>& tensors,
                                                    const std::vector<DemoMessage>& mine,
                                                    Communicator& comm);

// One DeMo step of every tensor on this rank: compress, one all-gather of every rank's
// packed messages (demo_wire.h) over `comm`, apply what was received (with lossy value
// formats, the error feedback still subtracts the coefficients as computed, as the
// reference does). `sent` (optional) receives this rank's messages as computed; `u`
// (optional, one array per tensor) the decoded updates.
void demo_step(const std::vector<const DemoTensor*>& tensors, const std::vector<DemoArrays>& arrays,
               double lr, Communicator& comm, std::vector<DemoMessage>* sent = nullptr,
               const std::vector<float*>* u = nullptr, ThreadPool* pool = nullptr);

}  // namespace tandem
