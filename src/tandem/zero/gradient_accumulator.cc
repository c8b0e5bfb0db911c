#include "tandem/zero/gradient_accumulator.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "tandem/core/error.h"

namespace tandem {

size_t GradientAccumulator::buffers_needed(int micro_batches) {
  // The stack holds one partial per set bit of the number of micro-batches folded so
  // far; before the last micro-batch that is at most popcount(i) for i < micro_batches.
  int depth = 0;
  for (unsigned i = 1; i < static_cast<unsigned>(micro_batches); i++)
    depth = std::max(depth, std::popcount(i));
  return static_cast<size_t>(depth);
}

GradientAccumulator::GradientAccumulator(ComputeBackend& backend, StorageDType dtype, size_t n,
                                         int micro_batches)
    : backend_(backend), dtype_(dtype), n_(n), micro_batches_(micro_batches) {
  TANDEM_CHECK(micro_batches >= 1, "gradient accumulation needs at least 1 micro-batch, got ",
               micro_batches);
  for (size_t i = 0; i < buffers_needed(micro_batches); i++) {
    buffers_.push_back(backend_.allocate(n_ * storage_dtype_bytes(dtype_)));
    free_.push_back(buffers_.size() - 1);
  }
}

size_t GradientAccumulator::allocated_bytes() const {
  return buffers_.size() * n_ * storage_dtype_bytes(dtype_);
}

char* GradientAccumulator::at(const void* base, size_t index) const {
  return const_cast<char*>(static_cast<const char*>(base)) + index * storage_dtype_bytes(dtype_);
}

void GradientAccumulator::add_into(void* dst, const void* a, const void* b, size_t begin,
                                   size_t end) {
  if (begin >= end) return;
  if (dtype_ == StorageDType::kBF16) {
    backend_.kernels<Bf16>().residual_forward(
        reinterpret_cast<Bf16*>(at(dst, begin)), reinterpret_cast<const Bf16*>(at(a, begin)),
        reinterpret_cast<const Bf16*>(at(b, begin)), end - begin);
  } else {
    backend_.kernels<float>().residual_forward(
        reinterpret_cast<float*>(at(dst, begin)), reinterpret_cast<const float*>(at(a, begin)),
        reinterpret_cast<const float*>(at(b, begin)), end - begin);
  }
}

void GradientAccumulator::add(const void* grads) {
  TANDEM_CHECK(micro_batches_ > 1, "GradientAccumulator::add with one micro-batch per step");
  // A level-0 partial meeting a level-0 top is added into the top's buffer, which then
  // carries on up; only a partial that merged with nothing is copied onto the stack.
  int level = 0;
  const void* current = grads;
  size_t current_buffer = SIZE_MAX;
  while (!stack_.empty() && stack_.back().level == level) {
    const Partial top = stack_.back();
    stack_.pop_back();
    void* dst = buffers_[top.buffer].as<void>();
    add_into(dst, dst, current, 0, n_);
    if (current_buffer != SIZE_MAX) free_.push_back(current_buffer);
    current = dst;
    current_buffer = top.buffer;
    level++;
  }
  if (current_buffer == SIZE_MAX) {
    TANDEM_CHECK(!free_.empty(), "GradientAccumulator: more micro-batches than the ",
                 micro_batches_, " it was made for");
    current_buffer = free_.back();
    free_.pop_back();
    backend_.copy(buffers_[current_buffer].as<void>(), grads, n_ * storage_dtype_bytes(dtype_));
  }
  stack_.push_back({current_buffer, level});
}

void GradientAccumulator::finish(void* grads, size_t begin, size_t end) {
  TANDEM_CHECK(begin <= end && end <= n_, "GradientAccumulator::finish: range [", begin, ", ", end,
               ") is outside the ", n_, " gradients");
  for (auto it = stack_.rbegin(); it != stack_.rend(); ++it)
    add_into(grads, buffers_[it->buffer].as<void>(), grads, begin, end);
}

void GradientAccumulator::start_step() {
  for (const Partial& p : stack_) free_.push_back(p.buffer);
  stack_.clear();
}

}  // namespace tandem
