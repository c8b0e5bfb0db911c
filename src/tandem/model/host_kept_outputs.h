// activation_checkpointing.cpu_checkpointing: the outputs a recomputing model keeps between
// forward and backward (recompute_segments.h), one per segment, held in pinned host memory
// instead of device memory. Each passes through one of two device rows: forward writes
// segment s's output into row s % 2 and copies it to the host behind the kernels, on a stream
// of its own; backward copies output s - 2 back into that row as soon as segment s has been
// recomputed (nothing reads it after), so that it is there, its copy overlapped with segment
// s's backward, when segment s - 1 is recomputed from it. Every dependency between the copies
// and the kernels is an event: the model's stream waits for a copy (a GPU), or the host does
// (the CPU backend, whose kernels run as they are called).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "tandem/compute/compute_backend.h"
#include "tandem/device/device.h"
#include "tandem/model/recompute_segments.h"

namespace tandem {

class HostKeptOutputs {
 public:
  // `outputs` segment outputs of `row_bytes` each.
  HostKeptOutputs(ComputeBackend& backend, size_t outputs, size_t row_bytes);

  // Forward: segment s is about to write its row, which held output s - 2 on its way to the
  // host.
  void before_writing(int segment);
  // Forward: segment s's output is queued into `row`: copied to the host behind it.
  void store(int segment, const void* row);
  // Backward: output `segment` back into `row`, behind the kernels queued so far (the last
  // that read or wrote the row).
  void fetch(int segment, void* row);
  // Backward: the kernels queued from now on may read output `segment`'s row.
  void before_reading(int segment);

  size_t host_bytes() const { return host_.bytes(); }

 private:
  // The model's later kernels start once `event` is reached.
  void kernels_wait_for(Event& event);
  // `stream` waits for the kernels queued so far.
  void wait_for_kernels(Stream& stream);

  ComputeBackend& backend_;
  Device& device_;
  size_t row_bytes_;
  DeviceAllocation host_;  // pinned: [outputs, row_bytes]
  std::unique_ptr<Stream> copies_;
  std::unique_ptr<Event> kernels_done_;
  // Per device row: the last store from it and the last fetch into it (and whether the
  // kernels have yet to wait for them), and the output it holds.
  std::unique_ptr<Event> stored_[2], fetched_[2];
  bool store_pending_[2] = {false, false};
  bool fetch_pending_[2] = {false, false};
  int holds_[2] = {-1, -1};
};

// A family's forward through its layers: run(l) runs layer l, output_of(l) is where it wrote
// its output. With `host` (cpu_checkpointing), each segment's output is stored behind it.
template <typename RunLayer, typename OutputOf>
void forward_layers(const RecomputeSegments& segments, HostKeptOutputs* host, RunLayer run,
                    OutputOf output_of) {
  for (int l = 0; l < segments.layers; l++) {
    if (host && segments.begins_segment(l)) host->before_writing(segments.segment_of(l));
    run(l);
    if (host && segments.ends_segment(l)) host->store(segments.segment_of(l), output_of(l));
  }
}

// Backward's rerun of one segment, layers [begin, end), from its kept input: the same kernels
// on the same inputs, so the same bits. With `host`, the input is waited for, and the output
// two segments back is fetched into the row this segment has just rewritten (its own output,
// which its backward does not read) while that backward runs.
template <typename RunLayer, typename OutputOf>
void recompute_layers(const RecomputeSegments& segments, HostKeptOutputs* host, int begin, int end,
                      RunLayer run, OutputOf output_of) {
  const int s = segments.segment_of(begin);
  if (host) {
    host->before_writing(s);
    if (s > 0) host->before_reading(s - 1);
  }
  for (int l = begin; l < end; l++) run(l);
  if (host && s >= 2) host->fetch(s - 2, output_of(begin - segments.interval - 1));
}

// A family's backward through its layers, segment by segment, last first: with recompute, the
// segment's layers run forward again from its kept input (the same bits), then backward(l),
// last layer first.
template <typename RunLayer, typename OutputOf, typename BackwardLayer>
void backward_layers(const RecomputeSegments& segments, HostKeptOutputs* host, RunLayer run,
                     OutputOf output_of, BackwardLayer backward) {
  for (int end = segments.layers; end > 0;) {
    const int begin = segments.segment_begin(end);
    if (segments.recomputes()) recompute_layers(segments, host, begin, end, run, output_of);
    for (int l = end - 1; l >= begin; l--) backward(l);
    end = begin;
  }
}

// The two walks over a family's layer stack. `Family` befriends them and has segments_,
// host_kept_, forward_layer<Elem>(l, B, T), backward_layer<Elem>(l, B, T, ready) and
// layer_acts<Elem>(l), whose residual3 is layer l's output: one call per walk in each family.
template <typename Elem, typename Family>
void forward_layer_stack(Family& family, int B, int T) {
  forward_layers(
      family.segments_, family.host_kept_.get(),
      [&](int l) { family.template forward_layer<Elem>(l, B, T); },
      [&](int l) { return family.template layer_acts<Elem>(l).residual3; });
}

template <typename Elem, typename Family, typename Ready>
void backward_layer_stack(Family& family, int B, int T, const Ready& ready) {
  backward_layers(
      family.segments_, family.host_kept_.get(),
      [&](int l) { family.template forward_layer<Elem>(l, B, T); },
      [&](int l) { return family.template layer_acts<Elem>(l).residual3; },
      [&](int l) { family.template backward_layer<Elem>(l, B, T, ready); });
}

}  // namespace tandem
