// The communicator that carries a run's model buffers (gradients, working parameters),
// chosen in one place:
//   - the caller's, when it gives one (tests that run ranks as threads);
//   - NCCL over the host communicator, with several ranks on the cuda device (it picks
//     this rank's GPU, which the device must then use);
//   - the one-rank device communicator, for one rank on the cuda device (the host
//     backends would read device memory on the host);
//   - a duplicate of the host communicator, when gradients are reduced while backward
//     runs on the cpu device (the training thread keeps the host one for its own
//     exchanges);
//   - else the host communicator itself.
// Two steps, because NCCL picks the GPU before the device exists, and the one-rank
// device communicator holds a stream of the device, so it must go before the device
// does: make_nccl_buffer_communicator, then the device on its GPU, then a
// BufferCommunicator (declared after the device).
#pragma once

#include <memory>

#include "tandem/comm/communicator.h"
#include "tandem/device/device.h"

namespace tandem {

struct BufferCommunicatorChoice {
  bool cuda_device = false;           // the model's buffers are in GPU memory
  bool overlapped_reduction = false;  // gradients are reduced while backward runs
};

// NCCL over `host` where the choice above takes it (no `given`, several ranks, the cuda
// device), else null. Its GPU: nccl_communicator_device (comm/nccl_communicator.h).
std::unique_ptr<Communicator> make_nccl_buffer_communicator(Communicator& host,
                                                            const Communicator* given,
                                                            BufferCommunicatorChoice choice);

class BufferCommunicator {
 public:
  // `host`, `given` and `nccl` (each optional but host) must outlive this object, and so
  // must `device`.
  BufferCommunicator(Communicator& host, Communicator* given, Communicator* nccl,
                     BufferCommunicatorChoice choice, Device& device);
  BufferCommunicator(const BufferCommunicator&) = delete;
  BufferCommunicator& operator=(const BufferCommunicator&) = delete;

  Communicator& get() const { return *chosen_; }

 private:
  std::unique_ptr<Communicator> owned_;  // the one-rank device communicator or a duplicate
  Communicator* chosen_;
};

}  // namespace tandem
