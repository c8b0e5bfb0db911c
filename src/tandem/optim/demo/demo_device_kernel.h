// DeMo's CUDA kernels (demo_cuda.h) as DeviceKernels a device stream runs: what DeMo's
// update rule queues for a subgroup in GPU memory. Compiled in every build; the kernels
// carry a CUDA variant only where the CUDA backend is built (TANDEM_HAVE_CUDA), and no host
// variant (the host-only device runs DemoTensor's CPU code, demo_rule.h). The arrays must
// stay valid until the stream has run the kernel.
#pragma once

#include "tandem/device/device.h"
#include "tandem/optim/demo/demo_cuda.h"

namespace tandem {

DeviceKernel demo_compress_kernel(const DemoCudaBlocks& blocks, const DemoCudaCompress& args);
DeviceKernel demo_apply_kernel(const DemoCudaBlocks& blocks, const DemoCudaApply& args);

}  // namespace tandem
