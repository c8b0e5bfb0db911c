// Stands in for the CUDA toolkit's cuda_runtime.h in emulated builds (see ../README.md):
// the runtime types and device built-ins that emulated source uses come from the emulator.
#pragma once

#include "../simt_emulator.h"
