// The host-only device backend (make_cpu_device in device.h) and what it offers beyond
// the Device interface.
//
// Lifetimes: the device must outlive every allocation, stream and event made from it.
// Streams drain their queues when destroyed, so destroying a stream waits for its work
// (including waits on events recorded on other streams, which therefore must still be
// alive or already destroyed, never destroyed concurrently).
//
// Asynchrony: copy_async and launch_async only queue work. Every pointer they are given
// (and every array a kernel uses) must stay valid and must not be written by anyone else
// until the stream has run the task; synchronize the stream or an event recorded after it
// first. A kernel's host variant runs on the stream's worker thread.
#pragma once

#include <functional>

#include "tandem/device/device.h"

namespace tandem {

// Queues a host function on a stream made by a CPU device (like cudaLaunchHostFunc):
// it runs in order with the stream's other work, on the stream's thread. If it throws,
// the stream fails as if a copy had failed. For tests and host-side pipeline steps.
// Throws tandem::Error if `stream` is not a CPU stream.
void launch_host_task(Stream& stream, std::function<void()> task);

}  // namespace tandem
