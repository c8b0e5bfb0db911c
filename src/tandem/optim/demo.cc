#include "tandem/optim/demo.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"

namespace tandem {

namespace {

// compression_topk, when it fits the tensor's blocks.
int64_t checked_topk(int64_t topk, const DemoBlocks& blocks, const std::string& name) {
  TANDEM_CHECK(topk >= 1 && topk <= blocks.block_size(),
               "optimizer.params.compression_topk = ", topk, " does not fit the DCT blocks of ",
               name, " (", blocks.block_rows(), " x ", blocks.block_cols(), " = ",
               blocks.block_size(), " coefficients); use a value from 1 to ", blocks.block_size());
  return topk;
}

}  // namespace

DemoTensor::DemoTensor(std::string name, const std::vector<int64_t>& shape, const DemoHyper& hyper,
                       SimdTarget target)
    : name_(std::move(name)),
      blocks_(shape, hyper.compression_chunk, name_.c_str(), target),
      topk_(checked_topk(hyper.compression_topk, blocks_, name_)),
      wire_(blocks_.count(), blocks_.block_size(), topk_, hyper.compression_values),
      beta_(hyper.compression_decay),
      weight_decay_(hyper.weight_decay) {}

namespace {

// Runs fn(begin, end) over contiguous pieces of [0, n): one per worker of `pool`, or all
// of it on this thread without one. Each piece is computed the same way whatever the
// split, so the bits do not depend on the number of threads.
template <typename Fn>
void split_work(ThreadPool* pool, int64_t n, Fn&& fn) {
  if (pool == nullptr || pool->size() == 1 || n <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  pool->run([&](int worker) {
    const Range r = split_range(static_cast<size_t>(n), pool->size(), worker, 1);
    if (r.begin < r.end) fn(static_cast<int64_t>(r.begin), static_cast<int64_t>(r.end));
  });
}

}  // namespace

void DemoTensor::compress(const DemoArrays& arrays, double step_lr, DemoMessage& sent,
                          ThreadPool* pool, float grad_scale) const {
  const int64_t n = blocks_.num_elements(), bs = blocks_.block_size(), count = blocks_.count();
  const float decay = decay_factor(step_lr), lr = static_cast<float>(step_lr);
  sent.indices.resize(static_cast<size_t>(count * topk_));
  sent.values.resize(static_cast<size_t>(count * topk_));
  split_work(pool, n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i++) {
      arrays.params[i] = arrays.params[i] * decay;
      arrays.delta[i] = std::fma(beta_, arrays.delta[i], lr * (grad_scale * arrays.grad[i]));
    }
  });
  split_work(pool, count, [&](int64_t first, int64_t last) {
    std::vector<float> z(static_cast<size_t>(bs)), kept(static_cast<size_t>(bs));
    std::vector<int32_t> order(static_cast<size_t>(bs));
    for (int64_t b = first; b < last; b++) {
      blocks_.forward(arrays.delta, b, z.data());
      std::iota(order.begin(), order.end(), 0);
      // Largest |Z| first; equal magnitudes: the lower index first (every rank, every
      // device).
      std::partial_sort(order.begin(), order.begin() + topk_, order.end(),
                        [&](int32_t x, int32_t y) {
                          const float ax = std::fabs(z[x]), ay = std::fabs(z[y]);
                          return ax > ay || (ax == ay && x < y);
                        });
      std::fill(kept.begin(), kept.end(), 0.0f);
      for (int64_t j = 0; j < topk_; j++) {
        const int32_t i = order[j];
        sent.indices[b * topk_ + j] = i;
        sent.values[b * topk_ + j] = z[i];
        kept[i] = z[i];
      }
      blocks_.inverse_add(kept.data(), b, -1.0f, arrays.delta);  // error feedback
    }
  });
}

void DemoTensor::apply(const std::vector<const DemoMessage*>& by_rank, double step_lr,
                       float* params, float* u, ThreadPool* pool) const {
  const auto lr = static_cast<float>(step_lr);
  const int64_t bs = blocks_.block_size(), count = blocks_.count();
  std::vector<float> decoded(u == nullptr ? blocks_.num_elements() : 0);
  float* out = u != nullptr ? u : decoded.data();
  split_work(pool, count, [&](int64_t first, int64_t last) {
    std::vector<float> q(static_cast<size_t>(bs));
    std::vector<int32_t> senders(static_cast<size_t>(bs));
    for (int64_t b = first; b < last; b++) {
      std::fill(q.begin(), q.end(), 0.0f);
      std::fill(senders.begin(), senders.end(), 0);
      for (const DemoMessage* message : by_rank) {
        for (int64_t j = 0; j < topk_; j++) {
          const int32_t i = message->indices[b * topk_ + j];
          TANDEM_CHECK(i >= 0 && i < bs, "DeMo: ", name_, ": a rank sent coefficient ", i,
                       " of a block of ", bs);
          q[i] = q[i] + message->values[b * topk_ + j];
          senders[i]++;
        }
      }
      for (int64_t i = 0; i < bs; i++)
        if (senders[i] > 1) q[i] = q[i] / static_cast<float>(senders[i]);
      blocks_.inverse(q.data(), b, out);
    }
  });
  split_work(pool, blocks_.num_elements(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i++) {
      const float s = out[i] > 0.0f ? 1.0f : out[i] < 0.0f ? -1.0f : 0.0f;
      params[i] = params[i] - lr * s;
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
