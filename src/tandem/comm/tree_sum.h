// The one order in which tandem adds the contributions of several ranks (or micro-batches):
// a fixed pairwise tree. Every Communicator backend sums through tree_sum, so that the bits
// of a sum never depend on the backend, on a library's reduction algorithm or on timing.
//
// The tree over values x_0 .. x_{count-1}: repeat until one value is left: neighbours
// (2j, 2j+1) are added, left + right, and when the count is odd the last value moves up a
// level unchanged.
//
//   3: (x0 + x1) + x2                       4: (x0 + x1) + (x2 + x3)
//   5: ((x0 + x1) + (x2 + x3)) + x4         6: ((x0 + x1) + (x2 + x3)) + (x4 + x5)
//   7: ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + x6)
//
// Why a tree rather than rank order ((x0 + x1) + x2) + ...:
//
// - It survives a change of world size. Let every rank sum its A micro-batches by this
//   tree, A a power of two, and the ranks' results be summed by this tree again: that is
//   the tree over all N * A micro-batches in rank-major order: at each of that tree's first
//   log2(A) levels every rank's block holds an even number of values (A, A / 2, ..., 2), so
//   no pair straddles two blocks and no value moves up unpaired; after them each block is
//   one value, its rank's tree sum, and the rest is the tree over N. N ranks of A micro-batches
//   and N' ranks of A' (both powers of two) with N * A = N' * A' therefore give the same
//   bits, which lets a run resume on a different world size bit for bit. Rank order has
//   no such property: ((a0 + a1) + (b0 + b1)) is not ((a0 + a1) + b0) + b1.
// - It can be computed streaming, with log2(count) partial sums instead of all the values
//   (a rank accumulating micro-batch gradients as they come). Keep a stack of partial sums
//   with their levels, as a binary counter does: a new leaf has level 0; while the top of
//   the stack has the same level as the new value, pop it and make the new value
//   top + new at one level higher; then push. At the end, take the last value pushed as
//   current and add the rest of the stack from the top down: current = stack[i] + current.
//   This gives exactly the bits of the tree above (tested for every count up to 40).
// - Its rounding error grows with log2(count), not with count.
#pragma once

#include <cstddef>

#include "tandem/core/half.h"

namespace tandem {

// out[i] = tree sum of parts[0][i], parts[1][i], ..., parts[count - 1][i], for i < n.
// count >= 1 (count 1 copies). `out` may be any one of the parts[k] itself (the same
// pointer: in-place in parts[0], say); it must not partly overlap any of them otherwise.
void tree_sum(const float* const* parts, int count, size_t n, float* out);

// The same tree over bf16 values, each addition done in fp32 and rounded to bf16 (nearest
// even), exactly as the bf16 compute backends add two bf16 tensors: bf16 gradients summed
// over ranks then round the way the micro-batches of one rank do (GradientAccumulator).
void tree_sum(const Bf16* const* parts, int count, size_t n, Bf16* out);

// The tree sum of values[0 .. count - 1] (count >= 1): tree_sum on one element each.
float tree_sum_scalar(const float* values, int count);

}  // namespace tandem
