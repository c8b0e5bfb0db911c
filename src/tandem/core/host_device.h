// Marks functions that run on the host and, when compiled by nvcc, on the GPU too:
// one definition of the numerics (16-bit rounding, the AdamW update) for both.
#pragma once

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif
