// measure_memcpy_peak in a build without the CUDA toolkit: it says why it is absent.
#include "tandem/bench/cuda/memcpy_peak.h"

#ifndef TANDEM_HAVE_CUDA

#include "tandem/core/error.h"

namespace tandem {

MemcpyPeak measure_memcpy_peak(Device&, size_t, int) {
  fail(
      "cannot measure cudaMemcpyAsync: tandem was built without CUDA; install the CUDA "
      "toolkit (nvcc) and rebuild");
}

}  // namespace tandem

#endif  // TANDEM_HAVE_CUDA
