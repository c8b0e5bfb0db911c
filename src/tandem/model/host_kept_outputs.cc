#include "tandem/model/host_kept_outputs.h"

#include "tandem/core/error.h"

namespace tandem {

HostKeptOutputs::HostKeptOutputs(ComputeBackend& backend, size_t outputs, size_t row_bytes)
    : backend_(backend),
      device_(backend.device()),
      row_bytes_(row_bytes),
      host_(device_.allocate(MemorySpace::kPinnedHost, outputs * row_bytes)),
      copies_(device_.create_stream("kept outputs")),
      kernels_done_(device_.create_event()) {
  for (int row = 0; row < 2; row++) {
    stored_[row] = device_.create_event();
    fetched_[row] = device_.create_event();
  }
}

void HostKeptOutputs::kernels_wait_for(Event& event) {
  if (backend_.queues_kernels())
    device_.wait(backend_.stream(), event);
  else
    event.synchronize();
}

void HostKeptOutputs::wait_for_kernels(Stream& stream) {
  device_.record(*kernels_done_, backend_.stream());
  device_.wait(stream, *kernels_done_);
}

void HostKeptOutputs::before_writing(int segment) {
  const int row = segment % 2;
  if (!store_pending_[row]) return;
  kernels_wait_for(*stored_[row]);
  store_pending_[row] = false;
}

void HostKeptOutputs::store(int segment, const void* row_data) {
  const int row = segment % 2;
  wait_for_kernels(*copies_);
  char* host = host_.as<char>() + static_cast<size_t>(segment) * row_bytes_;
  device_.copy_async(host, row_data, row_bytes_, *copies_, "store kept output");
  device_.record(*stored_[row], *copies_);
  store_pending_[row] = true;
  holds_[row] = segment;
}

void HostKeptOutputs::fetch(int segment, void* row_data) {
  const int row = segment % 2;
  TANDEM_CHECK(holds_[row] != segment, "kept output ", segment, " is already in its row");
  wait_for_kernels(*copies_);
  const char* host = host_.as<const char>() + static_cast<size_t>(segment) * row_bytes_;
  device_.copy_async(row_data, host, row_bytes_, *copies_, "fetch kept output");
  device_.record(*fetched_[row], *copies_);
  fetch_pending_[row] = true;
  holds_[row] = segment;
}

void HostKeptOutputs::before_reading(int segment) {
  const int row = segment % 2;
  TANDEM_CHECK(holds_[row] == segment, "kept output ", segment,
               " was neither stored from nor fetched into its row");
  if (!fetch_pending_[row]) return;
  kernels_wait_for(*fetched_[row]);
  fetch_pending_[row] = false;
}

}  // namespace tandem
