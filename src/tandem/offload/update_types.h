// What an update reads and writes, as the update engine and every rule (update_rule.h)
// see it: the gradients' element type, the working copy's, and a subgroup's ranges with
// and without weight decay. The rules (optim/) build on these; nothing here knows a rule.
#pragma once

#include <cstddef>
#include <vector>

#include "tandem/core/enum_names.h"

namespace tandem {

// Declared only: CUDA sources (C++17) include this header, model/ headers need C++20.
class ParamLayout;

enum class GradDType { kF32, kBF16 };
inline constexpr EnumName<GradDType> kGradDTypeNames[] = {{GradDType::kF32, "fp32"},
                                                          {GradDType::kBF16, "bf16"}};
// The working copy of the parameters (what forward and backward read), written in the
// same pass as the update: 16-bit for mixed precision. (kF32: the copy is the fp32
// params themselves; the kernels write no extra copy, the update engine copies them.)
enum class WorkingDType { kNone, kBF16, kF16, kF32 };
inline constexpr EnumName<WorkingDType> kWorkingDTypeNames[] = {{WorkingDType::kNone, "none"},
                                                                {WorkingDType::kBF16, "bf16"},
                                                                {WorkingDType::kF16, "fp16"},
                                                                {WorkingDType::kF32, "fp32"}};

// A range of the flat parameter space (or of a subgroup's arrays) updated with or without
// weight decay.
struct UpdateSegment {
  size_t begin = 0, end = 0;
  bool weight_decay = false;
};

// The layout's tensors as segments, neighbours with the same decay flag merged.
std::vector<UpdateSegment> decay_segments(const ParamLayout& layout);

// What one update did, as UpdateEngine::step reports it (train/step_record.h writes it).
struct UpdateStepStats {
  double ms = 0;
  size_t h2d_bytes = 0;  // host-to-device bytes queued this step (backward included)
  size_t d2h_bytes = 0;  // device-to-host bytes queued this step (backward included)
  // CPU-updated subgroups whose gradients started moving to the host during backward.
  size_t early_gradient_subgroups = 0;
  // Milliseconds the step waited for a lazy snapshot's copies (begin_capture) before it
  // could change a subgroup's state: the checkpoint's stall inside the update.
  double capture_wait_ms = 0;
};

}  // namespace tandem
