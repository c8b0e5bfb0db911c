#include "tandem/optim/adamw/adamw_device_kernel.h"

#include <utility>
#include <vector>

#include "tandem/optim/adamw/adamw_cuda.h"
#include "tandem/optim/adamw/adamw_simd.h"

namespace tandem {

DeviceKernel adamw_device_kernel(const AdamWArrays& arrays, std::span<const UpdateSegment> segments,
                                 const AdamWStepScalars& with_decay,
                                 const AdamWStepScalars& without_decay, SimdTarget target) {
  std::vector<UpdateSegment> ranges(segments.begin(), segments.end());
  DeviceKernel kernel;
  kernel.name = "adamw";
  for (const UpdateSegment& s : ranges) kernel.work_items += s.end - s.begin;
  kernel.on_host = [arrays, ranges, with_decay, without_decay, target] {
    for (const UpdateSegment& s : ranges)
      adamw_kernel(target, arrays.slice(s.begin), s.end - s.begin,
                   s.weight_decay ? with_decay : without_decay);
  };
#ifdef TANDEM_HAVE_CUDA
  kernel.on_cuda = [arrays, ranges = std::move(ranges), with_decay,
                    without_decay](void* cuda_stream) {
    launch_adamw_cuda(arrays, ranges.data(), ranges.size(), with_decay, without_decay, cuda_stream);
  };
#endif
  return kernel;
}

DeviceKernel adamw_device_kernel(const AdamWArrays& arrays, size_t n,
                                 const AdamWStepScalars& scalars, SimdTarget target) {
  const UpdateSegment all{0, n, true};
  return adamw_device_kernel(arrays, std::span<const UpdateSegment>(&all, 1), scalars, scalars,
                             target);
}

}  // namespace tandem
