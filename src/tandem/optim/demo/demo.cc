#include "tandem/optim/demo/demo.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"

namespace tandem {

namespace {

// compression_topk, at least 1 (the config's own check says so for a config's).
int64_t checked_topk(int64_t topk, const std::string& name) {
  TANDEM_CHECK(topk >= 1, "optimizer.params.compression_topk = ", topk, " for ", name,
               ": must be at least 1");
  return topk;
}

}  // namespace

// The reference clamps topk to the coefficients of the block, per tensor: bloc97/DeMo
// demo.py (commit 0e48145), CompressDCT._clamp_topk, lines 266-271 ("if topk > x.shape[-1]:
// topk = x.shape[-1]"), called by CompressDCT.compress at lines 279-281 on the coefficients
// laid out [..., block] ("y x (h w)" for a 2-D tensor, [blocks, w] for a 1-D one).
int64_t demo_topk(int64_t compression_topk, const DemoBlocks& blocks) {
  return std::min(compression_topk, blocks.block_size());
}

DemoTensor::DemoTensor(std::string name, const std::vector<int64_t>& shape, const DemoHyper& hyper,
                       SimdTarget target)
    : name_(std::move(name)),
      blocks_(shape, hyper.compression_chunk, name_.c_str(), target),
      topk_(demo_topk(checked_topk(hyper.compression_topk, name_), blocks_)),
      wire_(blocks_.count(), blocks_.block_size(), topk_, hyper.compression_values),
      beta_(hyper.compression_decay),
      weight_decay_(hyper.weight_decay) {}

namespace {

// Runs fn(begin, end) over contiguous chunks of [0, n) on `pool`'s threads, or all of it on
// this thread without one: a thread whose core another program took leaves its chunks to
// the others (core/thread_pool.h). Each block is computed the same way whatever the split,
// so the bits do not depend on the number of threads.
template <typename Fn>
void split_work(ThreadPool* pool, int64_t n, Fn&& fn) {
  if (pool == nullptr || pool->size() == 1 || n <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  pool->parallel_for(static_cast<size_t>(n), 1, [&](size_t begin, size_t end) {
    fn(static_cast<int64_t>(begin), static_cast<int64_t>(end));
  });
}

// Steps 1 and 2 over [begin, end). The clones with FMA make std::fma one instruction in a
// vector loop (the baseline calls libm's fmaf per element); fma is exactly rounded on every
// path, so every clone gives the same bits.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void
decay_and_accumulate(float* __restrict params, float* __restrict delta,
                     const float* __restrict grad, int64_t n, float decay, float beta, float lr,
                     float grad_scale) {
  // p * 1 is p: without weight decay the parameters are neither read nor written here.
  if (decay != 1.0f)
    for (int64_t i = 0; i < n; i++) params[i] = params[i] * decay;
  for (int64_t i = 0; i < n; i++) delta[i] = std::fma(beta, delta[i], lr * (grad_scale * grad[i]));
}

// Step 5's p = p - lr * sign(u) over [begin, end), sign(0) = 0, vectorised as
// decay_and_accumulate is.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void sign_step(
    float* __restrict params, const float* __restrict u, int64_t n, float lr) {
  for (int64_t i = 0; i < n; i++) {
    const float s = u[i] > 0.0f ? 1.0f : u[i] < 0.0f ? -1.0f : 0.0f;
    params[i] = params[i] - lr * s;
  }
}

// out[i] = out[i] + -1 * x[i] for i < n: the error feedback's subtraction of IDCT(kept),
// vectorised as decay_and_accumulate is.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void
subtract_feedback(float* __restrict out, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = out[i] + -1.0f * x[i];
}

// Elements of top_k_by_magnitude's chunks: one 16-wide vector on AVX-512.
constexpr int64_t kTopkChunk = 16;

// order[0, k) = the indices of the k largest |z[i]| of z[0, n), largest first, equal
// magnitudes lower index first: partial_sort's result under that order.
//
// A key holds |z|'s bits (ordered as the magnitudes are) above the complement of the index,
// so a larger key is a larger magnitude or an equal one at a lower index. The k-th largest
// of the chunks' maxima is a floor: those k maxima are k elements at least that large, so
// every one of the k largest is at or above it. Only the elements at or above the floor
// (in a block of DCT coefficients, about k of them) become keys, and only those are sorted.
// magnitude[n], maxima[n / kTopkChunk + 1] and keys[n] are scratch.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void
top_k_by_magnitude(const float* z, int64_t n, int64_t k, uint32_t* magnitude, uint32_t* maxima,
                   uint64_t* keys, int32_t* order) {
  for (int64_t i = 0; i < n; i++) magnitude[i] = std::bit_cast<uint32_t>(z[i]) & 0x7fffffffu;
  const int64_t chunks = (n + kTopkChunk - 1) / kTopkChunk;
  uint32_t floor = 0;  // with fewer chunks than k, every element is a candidate
  if (chunks >= k) {
    for (int64_t c = 0; c < chunks; c++) {
      uint32_t most = 0;
      for (int64_t i = c * kTopkChunk; i < std::min(n, (c + 1) * kTopkChunk); i++)
        most = std::max(most, magnitude[i]);
      maxima[c] = most;
    }
    std::nth_element(maxima, maxima + (k - 1), maxima + chunks, std::greater<>());
    floor = maxima[k - 1];
  }
  int64_t count = 0;
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t begin = c * kTopkChunk, end = std::min(n, begin + kTopkChunk);
    bool any = false;  // one vector compare per chunk where the CPU has 16-wide vectors
    for (int64_t i = begin; i < end; i++) any |= magnitude[i] >= floor;
    if (!any) continue;
    for (int64_t i = begin; i < end; i++) {
      if (magnitude[i] < floor) continue;
      keys[count++] = static_cast<uint64_t>(magnitude[i]) << 32 |
                      static_cast<uint32_t>(~static_cast<uint32_t>(i));
    }
  }
  std::partial_sort(keys, keys + k, keys + count, std::greater<>());
  for (int64_t j = 0; j < k; j++) order[j] = static_cast<int32_t>(~static_cast<uint32_t>(keys[j]));
}

}  // namespace

void DemoTensor::compress(const DemoArrays& arrays, double step_lr, DemoMessage& sent,
                          ThreadPool* pool, float grad_scale) const {
  const int64_t bs = blocks_.block_size(), count = blocks_.count();
  const float decay = decay_factor(step_lr), lr = static_cast<float>(step_lr);
  sent.indices.resize(static_cast<size_t>(count * topk_));
  sent.values.resize(static_cast<size_t>(count * topk_));
  const int64_t cm = blocks_.block_rows(), cn = blocks_.block_cols(), cols = blocks_.cols();
  split_work(pool, count, [&](int64_t first, int64_t last) {
    std::vector<float> z(static_cast<size_t>(bs)), x(static_cast<size_t>(bs));
    std::vector<uint32_t> magnitude(static_cast<size_t>(bs));
    std::vector<uint32_t> maxima(static_cast<size_t>(bs / kTopkChunk + 1));
    std::vector<uint64_t> keys(static_cast<size_t>(bs));
    std::vector<int32_t> order(static_cast<size_t>(topk_));
    std::vector<float> kept(static_cast<size_t>(topk_));
    for (int64_t b = first; b < last; b++) {
      // Steps 1 and 2 on the block's elements, just before its DCT reads them (the blocks
      // tile the tensor, so every element gets them once).
      for (int64_t a = 0, o = blocks_.block_origin(b); a < cm; a++, o += cols)
        decay_and_accumulate(arrays.params + o, arrays.delta + o, arrays.grad + o, cn, decay, beta_,
                             lr, grad_scale);
      blocks_.forward(arrays.delta, b, z.data());
      // Largest |Z| first; equal magnitudes: the lower index first (every rank, every
      // device).
      top_k_by_magnitude(z.data(), bs, topk_, magnitude.data(), maxima.data(), keys.data(),
                         order.data());
      for (int64_t j = 0; j < topk_; j++) {
        sent.indices[b * topk_ + j] = order[j];
        sent.values[b * topk_ + j] = z[order[j]];
      }
      // Error feedback, delta += -1 * IDCT(Z restricted to the kept): the kept by index.
      std::sort(order.begin(), order.end());
      for (int64_t j = 0; j < topk_; j++) kept[j] = z[order[j]];
      blocks_.inverse_sparse(order.data(), kept.data(), static_cast<size_t>(topk_), x.data());
      for (int64_t a = 0, o = blocks_.block_origin(b); a < cm; a++, o += cols)
        subtract_feedback(arrays.delta + o, x.data() + a * cn, cn);
    }
  });
}

void DemoTensor::apply(const std::vector<const DemoMessage*>& by_rank, double step_lr,
                       float* params, float* u, ThreadPool* pool) const {
  const auto lr = static_cast<float>(step_lr);
  const int64_t bs = blocks_.block_size(), count = blocks_.count();
  const int64_t cm = blocks_.block_rows(), cn = blocks_.block_cols(), cols = blocks_.cols();
  split_work(pool, count, [&](int64_t first, int64_t last) {
    // q and senders are all zero between blocks: a block clears what it touched.
    std::vector<float> q(static_cast<size_t>(bs), 0.0f), x(static_cast<size_t>(bs));
    std::vector<int32_t> senders(static_cast<size_t>(bs), 0);
    std::vector<int32_t> touched;
    touched.reserve(static_cast<size_t>(topk_) * by_rank.size());
    std::vector<float> means(static_cast<size_t>(topk_) * by_rank.size());
    for (int64_t b = first; b < last; b++) {
      touched.clear();
      for (const DemoMessage* message : by_rank) {
        for (int64_t j = 0; j < topk_; j++) {
          const int32_t i = message->indices[b * topk_ + j];
          TANDEM_CHECK(i >= 0 && i < bs, "DeMo: ", name_, ": a rank sent coefficient ", i,
                       " of a block of ", bs);
          q[i] = q[i] + message->values[b * topk_ + j];
          if (senders[i]++ == 0) touched.push_back(i);
        }
      }
      // The means, by coefficient index, and u for this block from them.
      std::sort(touched.begin(), touched.end());
      for (size_t t = 0; t < touched.size(); t++) {
        const int32_t i = touched[t];
        means[t] = senders[i] > 1 ? q[i] / static_cast<float>(senders[i]) : q[i];
      }
      blocks_.inverse_sparse(touched.data(), means.data(), touched.size(), x.data());
      for (int64_t a = 0, o = blocks_.block_origin(b); a < cm; a++, o += cols) {
        const float* ua = x.data() + a * cn;
        sign_step(params + o, ua, cn, lr);
        if (u != nullptr) std::copy(ua, ua + cn, u + o);
      }
      for (int32_t i : touched) {
        q[i] = 0.0f;
        senders[i] = 0;
      }
    }
  });
}

std::vector<std::vector<DemoMessage>> demo_exchange(const std::vector<const DemoTensor*>& tensors,
                                                    const std::vector<DemoMessage>& mine,
                                                    Communicator& comm) {
  size_t bytes = 0;  // of one rank's messages, every tensor's packed one after another
  for (const DemoTensor* t : tensors) bytes += t->wire().bytes();
  const int world = comm.world_size();
  std::vector<uint8_t> send(bytes), all(bytes * world);
  size_t offset = 0;
  for (size_t t = 0; t < tensors.size(); t++) {
    tensors[t]->wire().encode(mine[t], send.data() + offset);
    offset += tensors[t]->wire().bytes();
  }
  if (world == 1) {
    all = send;
  } else {
    comm.all_gather(send.data(), all.data(), bytes);
  }
  std::vector<std::vector<DemoMessage>> received(world, std::vector<DemoMessage>(tensors.size()));
  for (int r = 0; r < world; r++) {
    const uint8_t* from = all.data() + r * bytes;
    for (size_t t = 0; t < tensors.size(); t++) {
      tensors[t]->wire().decode(from, received[r][t]);
      from += tensors[t]->wire().bytes();
    }
  }
  return received;
}

void demo_step(const std::vector<const DemoTensor*>& tensors, const std::vector<DemoArrays>& arrays,
               double lr, Communicator& comm, std::vector<DemoMessage>* sent,
               const std::vector<float*>* u, ThreadPool* pool) {
  TANDEM_CHECK(arrays.size() == tensors.size(), "demo_step: ", arrays.size(), " arrays for ",
               tensors.size(), " tensors");
  std::vector<DemoMessage> mine(tensors.size());
  for (size_t t = 0; t < tensors.size(); t++) tensors[t]->compress(arrays[t], lr, mine[t], pool);
  const auto received = demo_exchange(tensors, mine, comm);
  for (size_t t = 0; t < tensors.size(); t++) {
    std::vector<const DemoMessage*> by_rank;
    for (const auto& rank : received) by_rank.push_back(&rank[t]);
    tensors[t]->apply(by_rank, lr, arrays[t].params, u != nullptr ? (*u)[t] : nullptr, pool);
  }
  if (sent != nullptr) *sent = std::move(mine);
}

}  // namespace tandem
