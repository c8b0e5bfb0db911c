// The model interface the trainer, the update engine, data parallelism and checkpoints are
// written against: a causal language model whose parameters live in one flat buffer
// described by a ParamLayout (names, shapes, blocks), with a forward pass, a backward pass
// that announces each block's gradients as soon as they are final, and its memory taken
// block by block through a BlockMemory (ZeRO stages 2 and 3).
//
// A family (GPT-2: model/gpt.h, Llama: model/llama.h) derives from Model and writes only
// its forward and backward passes and its initialisation; everything else (buffers, host
// copies, token checks, the loss) is here. docs/models.md is the recipe for adding one.
//
// Parameters, gradients and activations are stored as fp32 or bf16 (mixed precision: fp32
// arithmetic everywhere, one rounding per stored result); normalisation statistics,
// attention log-sum-exps and losses stay fp32. With bf16 the parameters here are the
// working copy: the fp32 master weights live in the optimizer (offload/update_engine).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tandem/compute/compute_backend.h"
#include "tandem/core/thread_pool.h"
#include "tandem/data/loss_mask.h"
#include "tandem/model/block_memory.h"
#include "tandem/model/model_config.h"
#include "tandem/model/param_layout.h"
#include "tandem/model/param_range.h"

namespace tandem {

// The flat buffers a model allocates for itself. Without them (ZeRO stages 2 and 3) a
// BlockMemory must be given (Model::set_block_memory) before forward or backward.
struct ModelOwnBuffers {
  bool params = true;
  // Elements of the parameter buffer when more than the parameters (ZeRO gathers the
  // ranks' equal partitions of the padded flat space into it in place); the padding is
  // zero and nothing reads it.
  size_t params_capacity = 0;
  bool grads = true;
  // Activation checkpointing: keep the input of every k-th layer and recompute the layers'
  // activations inside backward, one segment of k layers at a time (the same kernels on
  // the same inputs: the same bits); 0 keeps every layer's activations. Activations then
  // take k layers' worth plus L / k inputs instead of L layers' worth.
  int recompute_interval = 0;
  // activation_checkpointing.cpu_checkpointing: those kept inputs in pinned host memory,
  // copied back ahead of their segment's backward (host_kept_outputs.h).
  bool recompute_kept_on_host = false;
};

class Model {
 public:
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  // The model's blocks in flat order (layout().blocks()): the embeddings, each layer, the
  // head. Backward completes them from the last to the first (BlockMemory::release_grads,
  // GradientsReady).
  const std::vector<ParamRange>& blocks() const { return layout_.blocks(); }
  ComputeBackend& backend() const { return backend_; }
  int max_batch() const { return max_batch_; }
  int max_seq_len() const { return max_seq_len_; }
  StorageDType dtype() const { return dtype_; }
  // Everything this model allocated from its backend.
  size_t allocated_bytes() const { return allocated_bytes_; }

  // Where forward and backward find parameters and put gradients from now on; null: the
  // model's own buffers (which must then have been allocated).
  void set_block_memory(BlockMemory* memory);
  // Called with a block's range before every read of its parameters, in the order the
  // passes read them (forward: the blocks in flat order), and returns once the reads may be
  // queued: the update engine, still updating the later blocks, waits there for this one's
  // (UpdateEngine::wait_for_parameters). Empty: the parameters are always ready.
  using ParametersNeeded = std::function<void(ParamRange block)>;
  void set_parameters_needed(ParametersNeeded needed) { parameters_needed_ = std::move(needed); }

  // Flat buffers of layout().num_elements() elements of dtype() in backend memory; null
  // when not allocated (ModelOwnBuffers).
  void* params() { return params_.as<void>(); }
  const void* params() const { return params_.as<void>(); }
  void* grads() { return grads_.as<void>(); }
  const void* grads() const { return grads_.as<void>(); }
  // The same, typed; Elem must match dtype() (float for kF32, Bf16 for kBF16).
  template <typename Elem>
  Elem* params_as() {
    check_elem<Elem>();
    return params_.as<Elem>();
  }
  template <typename Elem>
  Elem* grads_as() {
    check_elem<Elem>();
    return grads_.as<Elem>();
  }
  // sum of grads^2 in double, in the backend's fixed order (for the gradient norm).
  double grad_sum_of_squares();

  // Host copies are fp32 whatever dtype() is: set_params rounds, *_to_host widen.
  // The family's initialisation from a seed, written to the model's parameters.
  void init_weights(uint64_t seed) { set_params(initial_params(seed)); }
  // The same weights in fp32 on the host, without touching the model's (the fp32 master
  // copy when the model stores bf16).
  std::vector<float> initial_params(uint64_t seed) const;
  // Those of [range.begin, range.end) alone, into out[0, range.size()): the values the
  // whole would have there. A tensor's normals come in chunks of kInitChunk elements, each
  // from a stream of its own (seed, tensor, chunk), so any range is made without the rest,
  // in parallel on `pool`, with the same values for any thread count: a model whose weights
  // fill host memory is initialised piece by piece (UpdateEngine::load_state).
  static constexpr size_t kInitChunk = size_t{1} << 16;
  void initial_params(uint64_t seed, ParamRange range, float* out, ThreadPool& pool) const;
  // How a family starts one of its tensors.
  struct TensorInit {
    enum class Kind { kZeros, kOnes, kNormal } kind = Kind::kZeros;
    float std = 0;  // kNormal: N(0, std^2)
  };
  virtual TensorInit tensor_init(const ParamView& view) const = 0;
  void set_params(const std::vector<float>& host_params);
  std::vector<float> params_to_host() const;
  std::vector<float> grads_to_host() const;

  // Forward pass over host tokens[B,T] (B <= max_batch, T <= max_seq_len). With targets
  // (host, [B,T]) returns the mean cross-entropy loss over the counted targets (those not
  // kIgnoredTarget: PyTorch's ignore_index) and keeps what backward needs; 0 when no
  // target counts (backward then adds nothing; counted_targets() says so). Without targets,
  // computes logits only and returns NaN.
  float forward(const int32_t* tokens, const int32_t* targets, int B, int T);
  // Targets the last forward pass counted (B * T unless some were kIgnoredTarget).
  int64_t counted_targets() const { return counted_targets_; }
  // Called during backward with a block's range [begin, end) of the flat gradient buffer
  // as soon as the kernels that finish it are queued on backend().stream() (after
  // BlockMemory::release_grads): the head first, then each layer from the last to the
  // first, the embeddings last. The host does not wait for them: a consumer orders its
  // reads after them with an event on that stream, as the update engine does
  // (DeviceBuffers::producer) to offload those gradients while the rest of backward runs.
  using GradientsReady = std::function<void(size_t begin, size_t end)>;
  // Adds d(loss_scale * mean loss)/d(params) to the gradients; needs the forward pass just
  // before it to have had targets. loss_scale = 1/accumulation_steps averages
  // micro-batches. `ready` (optional) is told as ranges of gradients become final.
  void backward(float loss_scale = 1.0f, const GradientsReady& ready = {});
  void zero_grads();

  // Logits of the last forward pass, copied to the host: [B, T, V].
  std::vector<float> logits_to_host() const;

 protected:
  // Checks the sizes, and allocates the flat buffers `own` asks for and the logits.
  Model(const ModelConfig& config, ComputeBackend& backend, int max_batch, int max_seq_len,
        StorageDType dtype, ParamLayout layout, ModelOwnBuffers own);

  // The passes of a family over the B x T batch forward() uploaded (tokens(), targets()).
  virtual float forward_pass(int B, int T, bool with_targets) = 0;
  virtual void backward_pass(int B, int T, float loss_scale, const GradientsReady& ready) = 0;

  // Backend memory counted in allocated_bytes(): bytes, dtype() elements, fp32 elements.
  Buffer allocate(size_t bytes);
  Buffer allocate_elems(size_t n) { return allocate(n * storage_dtype_bytes(dtype_)); }
  Buffer allocate_floats(size_t n) { return allocate(n * sizeof(float)); }

  // A block's parameters or gradients through the current BlockMemory, typed; the
  // parameters once the ParametersNeeded callback has returned.
  template <typename Elem>
  const Elem* acquire_params_as(int block) {
    return static_cast<const Elem*>(acquire_params(block));
  }
  template <typename Elem>
  Elem* acquire_grads_as(int block) {
    return static_cast<Elem*>(memory_->acquire_grads(block));
  }
  BlockMemory& memory() { return *memory_; }
  // A block's gradients are complete (their kernels queued): its memory may reduce them
  // (release_grads), then `ready` is told their range.
  void finish_grads(int block, const GradientsReady& ready);
  // A block's offset of the tensor `name` (from its block's start): the passes add it to
  // the pointer acquire_*_as returns.
  size_t offset_in_block(const std::string& name, int block) const;

  // The last forward pass's batch, in backend memory ([B*T] int32 each).
  const int32_t* tokens() const { return tokens_.as<int32_t>(); }
  const int32_t* targets() const { return targets_.as<int32_t>(); }
  // logits [BT, V] (dtype() elements) and the scratch for their gradient, shared by the
  // families: every one ends in an LM head over the vocabulary.
  template <typename Elem>
  Elem* logits() const {
    return logits_.as<Elem>();
  }
  template <typename Elem>
  Elem* dlogits() const {
    return dlogits_.as<Elem>();
  }
  // The mean cross-entropy of logits() against targets() over the counted of N positions.
  template <typename Elem>
  float mean_loss(int N);
  // dloss for cross_entropy_backward: loss_scale / counted targets (0 when none counts).
  float loss_gradient_scale(float loss_scale) const;
  // Bytes the base class allocates for batches of BT tokens besides the flat buffers
  // (token ids, logits and their gradient, losses), for the families' activation_bytes.
  static size_t head_bytes(const ModelConfig& config, size_t BT, StorageDType dtype);

 private:
  // The model's own buffers as a BlockMemory (the default).
  class OwnBlockMemory final : public BlockMemory {
   public:
    explicit OwnBlockMemory(Model& model) : model_(model) {}
    const void* acquire_params(int block) override;
    void release_params(int) override {}
    void* acquire_grads(int block) override;
    void release_grads(int) override {}

   private:
    Model& model_;
  };

  const void* acquire_params(int block);
  template <typename Elem>
  void check_elem() const;
  void check_own(const Buffer& buffer, const char* what) const;
  // Host fp32 <-> backend dtype() copies of n elements.
  void upload(void* dst, const float* host, size_t n);
  std::vector<float> download(const void* src, size_t n) const;

  ModelConfig config_;
  ComputeBackend& backend_;
  int max_batch_;
  int max_seq_len_;
  StorageDType dtype_;
  ParamLayout layout_;
  size_t allocated_bytes_ = 0;
  Buffer params_;
  Buffer grads_;
  OwnBlockMemory own_memory_{*this};
  BlockMemory* memory_ = &own_memory_;
  ParametersNeeded parameters_needed_;
  Buffer tokens_, targets_;  // [BT] int32
  Buffer logits_, dlogits_;  // [BT, V]
  Buffer losses_;            // [BT] fp32
  int last_B_ = 0, last_T_ = 0;
  bool have_targets_ = false;
  int64_t counted_targets_ = 0;
};

}  // namespace tandem
