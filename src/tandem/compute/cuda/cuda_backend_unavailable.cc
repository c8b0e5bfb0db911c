// make_cuda_backend in a build without the CUDA toolkit: it says why it is absent.
#include "tandem/compute/compute_backend.h"

#ifndef TANDEM_HAVE_CUDA

#include "tandem/core/error.h"

namespace tandem {

std::unique_ptr<ComputeBackend> make_cuda_backend(int) {
  fail(
      "cannot use a CUDA GPU: tandem was built without CUDA; install the CUDA toolkit (nvcc) "
      "and rebuild (without a GPU, tandem runs on the cpu device: device.type = \"cpu\")");
}

}  // namespace tandem

#endif  // TANDEM_HAVE_CUDA
