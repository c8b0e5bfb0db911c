// make_cuda_backend in a build without the CUDA toolkit: it says why it is absent.
#include "tandem/compute/compute_backend.h"

#ifndef TANDEM_HAVE_CUDA

#include "tandem/core/error.h"

namespace tandem {

namespace {

[[noreturn]] void no_cuda() {
  fail(
      "cannot use a CUDA GPU: tandem was built without CUDA; install the CUDA toolkit (nvcc) "
      "and rebuild (without a GPU, tandem runs on the cpu device: device.type = \"cpu\")");
}

}  // namespace

std::unique_ptr<ComputeBackend> make_cuda_backend(Device&) { no_cuda(); }
std::unique_ptr<ComputeBackend> make_cuda_backend(int) { no_cuda(); }

}  // namespace tandem

#endif  // TANDEM_HAVE_CUDA
