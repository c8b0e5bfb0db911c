// What the machine has: its physical memory, for plans that must fit in it.
#pragma once

#include <cstddef>

namespace tandem {

// Physical memory in bytes (sysconf), or the cgroup's memory limit when a container sets a
// lower one (cgroup v2 memory.max); 0 when neither can be read.
size_t host_memory_bytes();

}  // namespace tandem
