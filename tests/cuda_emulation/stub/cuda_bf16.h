// Stands in for the CUDA toolkit's cuda_bf16.h in emulated builds (see ../README.md). The
// emulated kernels store bf16 as tandem::Bf16; the one intrinsic that used __nv_bfloat162
// (__floats2bfloat162_rn, in pack_bf16x2) is replaced with the hardware primitives.
#pragma once

#include "../simt_emulator.h"
