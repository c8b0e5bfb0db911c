// Where a model reads its working parameters and writes its gradients, one block at a time
// (a block: a contiguous range of the flat parameter space, such as one transformer layer;
// Model::blocks()). Without one, a model uses flat buffers of all its parameters and
// gradients; ZeRO stages 2 and 3 (zero/) give one whose gradients are reduced to their
// owners as soon as a block's are complete, and whose parameters are gathered from the
// ranks that own them just before a block is used.
//
// The model brackets every use of a block with acquire and release, in an order that
// depends only on the model (so it is the same on every rank, and an implementation may
// run collectives inside these calls). A release means that the kernels using the block
// are queued on the backend's stream, not that they are done. At most two blocks'
// parameters, and at most two blocks' gradients, are acquired at any time.
#pragma once

namespace tandem {

class BlockMemory {
 public:
  virtual ~BlockMemory() = default;
  // Block `block`'s working parameters: its size elements of the model's storage type in
  // backend memory, valid until release_params(block).
  virtual const void* acquire_params(int block) = 0;
  virtual void release_params(int block) = 0;
  // Where backward adds block `block`'s gradients of one micro-batch: its size elements,
  // zero at the first acquire of a backward pass, valid until release_grads(block).
  virtual void* acquire_grads(int block) = 0;
  // The block's gradients of this backward pass are complete (their kernels queued).
  virtual void release_grads(int block) = 0;
};

}  // namespace tandem
