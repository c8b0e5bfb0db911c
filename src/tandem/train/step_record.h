// What one training step took: the record the trainer fills, --metrics writes and
// TrainResult keeps. Each figure is declared once, in step_figures(): its metrics key, its
// value, and whether ranks may differ in it; the metrics record and the per-rank figures
// are both made from that table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>

#include "tandem/offload/update_types.h"

namespace tandem {

struct StepRecord {
  int64_t step = 0;
  float loss = 0;
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double tokens_per_s = 0;
  // forward_ms includes waiting for the previous step's update (overlap_forward).
  double ms = 0, forward_ms = 0, backward_ms = 0;
  // The update engine's report, as it gave it: update.ms is the update's time before the
  // next forward could start; its bytes each way; the subgroups whose gradients started
  // moving to the host during backward.
  UpdateStepStats update;
  // Of the previous step's update (offload_optimizer.overlap_forward), the milliseconds that
  // ran on behind this step's start (data loading, forward), hidden from the step time, and
  // those this step waited for (in forward_ms). The previous update took its update_ms plus
  // these two.
  double update_hidden_ms = 0, update_wait_ms = 0;
  // Bytes this rank sent and received through the communicator in the step (data
  // parallelism: gradient reduction and parameter gathers).
  size_t comm_bytes_sent = 0, comm_bytes_received = 0;
  // Milliseconds the collectives on the model's buffers ran on their own thread
  // (overlap_comm), and of them those the training thread waited for: the rest overlapped
  // compute. Both 0 without overlap.
  double collective_ms = 0, collective_wait_ms = 0;
  // With a loss mask, the targets it counts in the step (every rank's when gradients are
  // reduced); -1 without one.
  int64_t counted_targets = -1;
  // With several ranks: what each would send (and receive) in a ring all-reduce of the
  // fp32 gradients, 2 (N - 1) / N x 4 bytes per parameter, the yardstick beside
  // comm_bytes_sent; 0 with one rank (not written).
  size_t ring_allreduce_bytes = 0;
  // An optimizer that keeps replicas (DeMo) proved them identical after this step's update
  // (written as "replicas_identical": true; not written otherwise).
  bool replicas_checked = false;
};

struct StepFigure {
  std::string_view key;                        // in --metrics
  nlohmann::json (*value)(const StepRecord&);  // as --metrics writes it
  bool per_rank;      // may differ between ranks (times, bytes): gathered per rank
  bool overlap_only;  // written only when collectives overlap compute (overlap_comm)
};
std::span<const StepFigure> step_figures();

// The --metrics record of a step: every figure (those of overlap only with
// `overlapped_collectives`), and with several ranks "ranks", the figures that differ between
// them (differing_figures).
nlohmann::json step_metrics(const StepRecord& record, bool overlapped_collectives,
                            const std::optional<nlohmann::json>& ranks = std::nullopt);

// This rank's per-rank figures, in step_figures() order, as numbers to gather.
std::vector<double> per_rank_values(const StepRecord& record);
// From every rank's per_rank_values (rank-major), the figures that differ between ranks:
// key -> one value per rank.
nlohmann::json differing_figures(std::span<const double> all, int world_size);

}  // namespace tandem
