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
    : chosen_(&host) {
  if (given != nullptr) {
    chosen_ = given;
  } else if (nccl != nullptr) {
    chosen_ = nccl;
  } else if (choice.cuda_device && host.world_size() == 1) {
    owned_ = make_one_rank_device_communicator(device);
  } else if (host.world_size() > 1 && choice.overlapped_reduction) {
    owned_ = host.duplicate();
  }
  if (owned_) chosen_ = owned_.get();
}

}  // namespace tandem
