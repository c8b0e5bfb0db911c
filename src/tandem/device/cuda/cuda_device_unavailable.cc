// The `cuda` device in a build without the CUDA toolkit: it reports why it is absent.
#include "tandem/device/cuda/cuda_device.h"

#ifndef TANDEM_HAVE_CUDA

#include "tandem/core/error.h"

namespace tandem {

int cuda_device_count(std::string* why) {
  if (why != nullptr) *why = "tandem was built without CUDA (no nvcc found by CMake)";
  return 0;
}

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions&) {
  fail(
      "cannot use a CUDA GPU: tandem was built without CUDA; install the CUDA toolkit (nvcc) "
      "and rebuild (without a GPU, tandem runs on the cpu device: device.type = \"cpu\")");
}

int cuda_device_index(Device& device) {
  fail("device '", device.name(), "' is not a CUDA device: tandem was built without CUDA");
}

void* cuda_stream_handle(Stream& stream) {
  fail("stream '", stream.name(), "' is not a CUDA stream: tandem was built without CUDA");
}

}  // namespace tandem

#endif  // TANDEM_HAVE_CUDA
