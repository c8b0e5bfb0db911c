#include "tandem/optim/demo/demo_device_kernel.h"

namespace tandem {

DeviceKernel demo_compress_kernel(const DemoCudaBlocks& blocks, const DemoCudaCompress& args) {
  DeviceKernel kernel;
  kernel.name = "demo compress";
  kernel.work_items = static_cast<size_t>(blocks.num_elements());
#ifdef TANDEM_HAVE_CUDA
  kernel.on_cuda = [blocks, args](void* stream) {
    launch_demo_compress_cuda(blocks, args, stream);
  };
#endif
  return kernel;
}

DeviceKernel demo_apply_kernel(const DemoCudaBlocks& blocks, const DemoCudaApply& args) {
  DeviceKernel kernel;
  kernel.name = "demo apply";
  kernel.work_items = static_cast<size_t>(blocks.num_elements());
#ifdef TANDEM_HAVE_CUDA
  kernel.on_cuda = [blocks, args](void* stream) { launch_demo_apply_cuda(blocks, args, stream); };
#endif
  return kernel;
}

}  // namespace tandem
