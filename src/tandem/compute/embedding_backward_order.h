// The summation order of the embedding backward (dwte), the same on every backend so that
// they agree bit for bit: the positions sorted by token (stably: a token's positions in
// increasing order) are cut into pieces at token changes and at every multiple of
// kEmbeddingBackwardPiece of the sorted index; each piece is summed from zero in position
// order, and a token's pieces are added to its row of dwte in order.
//
// Pieces let a GPU spread one long run of a token over many blocks: with byte-level data
// the space character repeats thousands of times per batch, and one block summing the
// whole run would serialize the kernel on it.
#pragma once

namespace tandem {

inline constexpr int kEmbeddingBackwardPiece = 32;

}  // namespace tandem
