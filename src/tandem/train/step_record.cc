#include "tandem/train/step_record.h"

#include <utility>
#include <vector>

namespace tandem {

namespace {

using R = const StepRecord&;
using json = nlohmann::json;

constexpr StepFigure kFigures[] = {
    {"step", [](R r) -> json { return r.step; }, false, false},
    {"loss", [](R r) -> json { return r.loss; }, false, false},
    {"lr", [](R r) -> json { return r.lr; }, false, false},
    {"grad_norm", [](R r) -> json { return r.grad_norm; }, false, false},
    {"tokens_per_s", [](R r) -> json { return r.tokens_per_s; }, false, false},
    {"ms", [](R r) -> json { return r.ms; }, true, false},
    {"forward_ms", [](R r) -> json { return r.forward_ms; }, true, false},
    {"backward_ms", [](R r) -> json { return r.backward_ms; }, true, false},
    {"update_ms", [](R r) -> json { return r.update.ms; }, true, false},
    {"update_hidden_ms", [](R r) -> json { return r.update_hidden_ms; }, true, false},
    {"update_wait_ms", [](R r) -> json { return r.update_wait_ms; }, true, false},
    {"h2d_bytes", [](R r) -> json { return r.update.h2d_bytes; }, true, false},
    {"d2h_bytes", [](R r) -> json { return r.update.d2h_bytes; }, true, false},
    {"early_gradient_subgroups", [](R r) -> json { return r.update.early_gradient_subgroups; },
     false, false},
    {"comm_bytes_sent", [](R r) -> json { return r.comm_bytes_sent; }, true, false},
    {"comm_bytes_received", [](R r) -> json { return r.comm_bytes_received; }, true, false},
    {"collective_ms", [](R r) -> json { return r.collective_ms; }, true, true},
    {"collective_wait_ms", [](R r) -> json { return r.collective_wait_ms; }, true, true},
    // Only with a loss mask (null: not written).
    {"counted_targets",
     [](R r) -> json { return r.counted_targets >= 0 ? json(r.counted_targets) : json(); }, false,
     false},
    {"replicas_identical", [](R r) -> json { return r.replicas_checked ? json(true) : json(); },
     false, false},
    // Only with several ranks.
    {"ring_allreduce_bytes",
     [](R r) -> json { return r.ring_allreduce_bytes > 0 ? json(r.ring_allreduce_bytes) : json(); },
     false, false},
};

}  // namespace

std::span<const StepFigure> step_figures() { return kFigures; }

json step_metrics(const StepRecord& record, bool overlapped_collectives,
                  const std::optional<json>& ranks) {
  json out = json::object();
  for (const StepFigure& f : kFigures) {
    if (f.overlap_only && !overlapped_collectives) continue;
    if (json value = f.value(record); !value.is_null()) out[std::string(f.key)] = std::move(value);
  }
  if (ranks) out["ranks"] = *ranks;
  return out;
}

std::vector<double> per_rank_values(const StepRecord& record) {
  std::vector<double> values;
  for (const StepFigure& f : kFigures)
    if (f.per_rank) values.push_back(f.value(record).get<double>());
  return values;
}

json differing_figures(std::span<const double> all, int world_size) {
  const size_t count = all.size() / static_cast<size_t>(world_size);  // figures per rank
  json ranks = json::object();
  size_t k = 0;  // the figure's place among the per-rank ones
  for (const StepFigure& f : kFigures) {
    if (!f.per_rank) continue;
    json values = json::array();
    bool differ = false;
    for (int r = 0; r < world_size; r++) {
      const double v = all[r * count + k];
      differ = differ || v != all[k];
      values.push_back(v);
    }
    if (differ) ranks[std::string(f.key)] = values;
    k++;
  }
  return ranks;
}

}  // namespace tandem
