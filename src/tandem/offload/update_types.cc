#include "tandem/offload/update_types.h"

#include "tandem/model/param_layout.h"

namespace tandem {

std::vector<UpdateSegment> decay_segments(const ParamLayout& layout) {
  std::vector<UpdateSegment> segments;
  for (const ParamView& view : layout.views()) {
    if (!segments.empty() && segments.back().weight_decay == view.weight_decay &&
        segments.back().end == view.offset) {
      segments.back().end = view.offset + view.numel;
    } else {
      segments.push_back({view.offset, view.offset + view.numel, view.weight_decay});
    }
  }
  return segments;
}

}  // namespace tandem
