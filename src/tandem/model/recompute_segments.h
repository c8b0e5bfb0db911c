// Activation checkpointing (ModelOwnBuffers::recompute_interval) as a family lays out its
// per-layer activations. With interval k the L layers form segments of k (the last may be
// shorter); forward keeps each segment's output (the next one's input) and backward, last
// segment first, runs the segment's layers forward again from its input into k slots of
// activations, then backward through them. Without recompute (k = 0) every layer has a
// slot of its own and backward walks one segment of all L layers.
//
// A layer's output is the next layer's input: a segment's last layer writes it to the kept
// outputs, the others to their slot's output (k - 1 of them), so that every layer reads its
// input from a buffer other than its own slot.
#pragma once

#include <algorithm>
#include <cstddef>

namespace tandem {

struct RecomputeSegments {
  int layers = 0;    // L
  int interval = 0;  // k; 0: every layer's activations kept
  // activation_checkpointing.cpu_checkpointing: the kept outputs live in pinned host memory
  // (host_kept_outputs.h) and pass through two device rows, the one a segment writes and the
  // one it reads.
  bool kept_on_host = false;

  bool recomputes() const { return interval > 0; }
  // Slots of the stacked per-layer activations: L, or min(k, L).
  size_t slots() const {
    return recomputes() ? std::min<size_t>(interval, layers) : static_cast<size_t>(layers);
  }
  // Layer outputs in the slots (all L without recompute; min(k, L) - 1 with).
  size_t output_slots() const {
    return recomputes() ? std::max<size_t>(slots(), 1) - 1 : static_cast<size_t>(layers);
  }
  // Layer outputs kept between forward and backward: ceil(L / k); none without recompute.
  size_t kept_outputs() const {
    return recomputes() ? static_cast<size_t>((layers + interval - 1) / interval) : 0;
  }
  // Device rows that hold them: all, or two with kept_on_host; kept output s is in row
  // kept_row(s).
  size_t kept_rows() const {
    return kept_on_host ? std::min<size_t>(kept_outputs(), 2) : kept_outputs();
  }
  size_t kept_row(int segment) const {
    return static_cast<size_t>(kept_on_host ? segment % 2 : segment);
  }
  int segment_of(int l) const { return recomputes() ? l / interval : 0; }
  bool begins_segment(int l) const { return recomputes() && l % interval == 0; }
  size_t slot(int l) const { return static_cast<size_t>(recomputes() ? l % interval : l); }
  // Whether layer l writes its output to the kept outputs (index l / k).
  bool ends_segment(int l) const {
    return recomputes() && (l % interval == interval - 1 || l == layers - 1);
  }
  // Where layer l writes its output, `rows` elements: its segment's row of `kept`, or its
  // slot's of `outputs`.
  template <typename Elem>
  Elem* output_of(int l, Elem* outputs, Elem* kept, size_t rows) const {
    return ends_segment(l) ? kept + kept_row(segment_of(l)) * rows : outputs + slot(l) * rows;
  }
  // The first layer of the segment that ends just before layer `end`.
  int segment_begin(int end) const {
    const int k = recomputes() ? interval : std::max(layers, 1);
    return (end - 1) / k * k;
  }
};

}  // namespace tandem
