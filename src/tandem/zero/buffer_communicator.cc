#include "tandem/zero/buffer_communicator.h"

#include "tandem/comm/nccl_communicator.h"
#include "tandem/comm/one_rank_device_communicator.h"

namespace tandem {

std::unique_ptr<Communicator> make_nccl_buffer_communicator(Communicator& host,
                                                            const Communicator* given,
                                                            BufferCommunicatorChoice choice) {
  if (given != nullptr || !choice.cuda_device || host.world_size() == 1) return nullptr;
  return make_nccl_communicator(host);
}

BufferCommunicator::BufferCommunicator(Communicator& host, Communicator* given, Communicator* nccl,
                                       BufferCommunicatorChoice choice, Device& device)
    : chosen_(choose(host, given, nccl, choice, device, owned_)) {}

Communicator& BufferCommunicator::choose(Communicator& host, Communicator* given,
                                         Communicator* nccl, BufferCommunicatorChoice choice,
                                         Device& device, std::unique_ptr<Communicator>& owned) {
  if (given != nullptr) return *given;
  if (nccl != nullptr) return *nccl;
  if (choice.cuda_device && host.world_size() == 1) {
    owned = make_one_rank_device_communicator(device);
    return *owned;
  }
  if (host.world_size() > 1 && choice.overlapped_reduction) {
    owned = host.duplicate();
    return *owned;
  }
  return host;
}

}  // namespace tandem
