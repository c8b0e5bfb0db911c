#include "tandem/model/model.h"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "tandem/core/error.h"
#include "tandem/core/rng.h"

namespace tandem {

Model::Model(const ModelConfig& config, ComputeBackend& backend, int max_batch, int max_seq_len,
             StorageDType dtype, ParamLayout layout, ModelOwnBuffers own)
    : config_(config),
      backend_(backend),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len),
      dtype_(dtype),
      layout_(std::move(layout)) {
  config_.validate();
  TANDEM_CHECK(max_batch >= 1, "batch size must be at least 1, got ", max_batch);
  TANDEM_CHECK(max_seq_len >= 1 && max_seq_len <= config.context_length, "sequence length ",
               max_seq_len, " must be in 1..", config.context_length, " (model.context_length)");
  const std::vector<ParamRange>& blocks = layout_.blocks();
  for (size_t i = 0; i < blocks.size(); i++)
    TANDEM_CHECK(blocks[i].begin == (i == 0 ? 0 : blocks[i - 1].end) && blocks[i].size() > 0,
                 "a model's blocks must be contiguous, non-empty and in layout order (block ", i,
                 ")");
  TANDEM_CHECK(!blocks.empty() && blocks.back().end == layout_.num_elements(),
               "a model's blocks must cover its layout");
  const size_t P = layout_.num_elements();
  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  const size_t V = config_.vocab_size;
  if (own.params) params_ = allocate_elems(std::max(P, own.params_capacity));
  if (own.grads) grads_ = allocate_elems(P);
  tokens_ = allocate(BT * sizeof(int32_t));
  targets_ = allocate(BT * sizeof(int32_t));
  logits_ = allocate_elems(BT * V);
  dlogits_ = allocate_elems(BT * V);
  losses_ = allocate_floats(BT);
}

size_t Model::head_bytes(const ModelConfig& config, size_t BT, StorageDType dtype) {
  return 2 * BT * sizeof(int32_t) + 2 * BT * config.vocab_size * storage_dtype_bytes(dtype) +
         BT * sizeof(float);
}

Buffer Model::allocate(size_t bytes) {
  allocated_bytes_ += bytes;
  return backend_.allocate(bytes);
}

size_t Model::offset_in_block(const std::string& name, int block) const {
  const ParamView& view = layout_.at(name);
  const ParamRange& range = layout_.blocks()[block];
  TANDEM_CHECK(view.offset >= range.begin && view.offset + view.numel <= range.end, "tensor ", name,
               " is not in block ", block, " of the layout");
  return view.offset - range.begin;
}

template <typename Elem>
void Model::check_elem() const {
  constexpr StorageDType wanted =
      std::is_same_v<Elem, Bf16> ? StorageDType::kBF16 : StorageDType::kF32;
  TANDEM_CHECK(wanted == dtype_, "the model stores ", storage_dtype_name(dtype_), ", not ",
               storage_dtype_name(wanted));
}
template void Model::check_elem<float>() const;
template void Model::check_elem<Bf16>() const;

void Model::check_own(const Buffer& buffer, const char* what) const {
  TANDEM_CHECK(buffer.as<void>() != nullptr, "the model's ", what,
               " live in its BlockMemory (ZeRO stage 2 or 3 partitions them), not in a flat "
               "buffer of its own");
}

void Model::set_block_memory(BlockMemory* memory) {
  if (memory == nullptr) {
    check_own(params_, "parameters");
    check_own(grads_, "gradients");
  }
  memory_ = memory != nullptr ? memory : &own_memory_;
}

const void* Model::acquire_params(int block) {
  if (parameters_needed_) parameters_needed_(blocks()[block]);
  return memory_->acquire_params(block);
}

const void* Model::OwnBlockMemory::acquire_params(int block) {
  model_.check_own(model_.params_, "parameters");
  return model_.params_.as<char>() +
         model_.blocks()[block].begin * storage_dtype_bytes(model_.dtype_);
}

void* Model::OwnBlockMemory::acquire_grads(int block) {
  model_.check_own(model_.grads_, "gradients");
  return model_.grads_.as<char>() +
         model_.blocks()[block].begin * storage_dtype_bytes(model_.dtype_);
}

void Model::upload(void* dst, const float* host, size_t n) {
  if (dtype_ == StorageDType::kF32) {
    backend_.copy_from_host(dst, host, n * sizeof(float));
    return;
  }
  std::vector<Bf16> rounded(n);
  for (size_t i = 0; i < n; i++) rounded[i] = from_float<Bf16>(host[i]);
  backend_.copy_from_host(dst, rounded.data(), n * sizeof(Bf16));
}

std::vector<float> Model::download(const void* src, size_t n) const {
  std::vector<float> host(n);
  if (dtype_ == StorageDType::kF32) {
    backend_.copy_to_host(host.data(), src, n * sizeof(float));
    return host;
  }
  std::vector<Bf16> stored(n);
  backend_.copy_to_host(stored.data(), src, n * sizeof(Bf16));
  for (size_t i = 0; i < n; i++) host[i] = to_float(stored[i]);
  return host;
}

std::vector<float> Model::initial_params(uint64_t seed) const {
  std::vector<float> params(layout().num_elements());
  ThreadPool pool(0, /*pin=*/false);
  initial_params(seed, ParamRange{0, params.size()}, params.data(), pool);
  return params;
}

void Model::initial_params(uint64_t seed, ParamRange range, float* out, ThreadPool& pool) const {
  // The chunks of normals that overlap the range, as (tensor, chunk) pairs.
  struct Chunk {
    size_t tensor, index;
    float std;
  };
  const std::vector<ParamView>& views = layout().views();
  std::vector<Chunk> chunks;
  for (size_t t = 0; t < views.size(); t++) {
    const ParamView& view = views[t];
    const size_t begin = std::max(range.begin, view.offset);
    const size_t end = std::min(range.end, view.offset + view.numel);
    if (begin >= end) continue;
    const TensorInit init = tensor_init(view);
    if (init.kind != TensorInit::Kind::kNormal) {
      std::fill(out + (begin - range.begin), out + (end - range.begin),
                init.kind == TensorInit::Kind::kOnes ? 1.0f : 0.0f);
      continue;
    }
    for (size_t c = (begin - view.offset) / kInitChunk; c * kInitChunk < end - view.offset; c++)
      chunks.push_back({t, c, init.std});
  }
  // A chunk's stream: SplitMix64 expands (seed, tensor, chunk) into unrelated states.
  const uint64_t seed_key = Rng(seed).next_u64();
  pool.parallel_for(chunks.size(), 1, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; i++) {
      const ParamView& view = views[chunks[i].tensor];
      Rng rng(seed_key ^ (static_cast<uint64_t>(chunks[i].tensor) << 40) ^ chunks[i].index);
      const size_t first = view.offset + chunks[i].index * kInitChunk;
      const size_t last = std::min(first + kInitChunk, view.offset + view.numel);
      for (size_t at = first; at < std::min(last, range.end); at++) {
        const float value = chunks[i].std * rng.normal();
        if (at >= range.begin) out[at - range.begin] = value;
      }
    }
  });
}

void Model::set_params(const std::vector<float>& host_params) {
  check_own(params_, "parameters");
  TANDEM_CHECK(host_params.size() == layout_.num_elements(), "parameter count mismatch: got ",
               host_params.size(), ", model has ", layout_.num_elements());
  upload(params(), host_params.data(), host_params.size());
}

std::vector<float> Model::params_to_host() const {
  check_own(params_, "parameters");
  return download(params(), layout_.num_elements());
}

std::vector<float> Model::grads_to_host() const {
  check_own(grads_, "gradients");
  return download(grads(), layout_.num_elements());
}

std::vector<float> Model::logits_to_host() const {
  return download(logits_.as<void>(), static_cast<size_t>(last_B_) * last_T_ * config_.vocab_size);
}

void Model::zero_grads() {
  if (grads_.as<void>() == nullptr) return;  // a BlockMemory's gradients start at zero
  backend_.fill_zero(grads(), layout_.num_elements() * storage_dtype_bytes(dtype_));
}

void Model::finish_grads(int block, const GradientsReady& ready) {
  memory_->release_grads(block);
  if (ready) ready(blocks()[block].begin, blocks()[block].end);
}

double Model::grad_sum_of_squares() {
  check_own(grads_, "gradients");
  const size_t n = layout_.num_elements();
  return dtype_ == StorageDType::kBF16
             ? backend_.kernels<Bf16>().sum_of_squares(grads_.as<Bf16>(), n)
             : backend_.kernels<float>().sum_of_squares(grads_.as<float>(), n);
}

float Model::forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  TANDEM_CHECK(B >= 1 && B <= max_batch_ && T >= 1 && T <= max_seq_len_, "forward: batch ", B,
               " x ", T, " exceeds the allocated ", max_batch_, " x ", max_seq_len_);
  const int V = config_.vocab_size;
  const int N = B * T;
  counted_targets_ = 0;
  for (int i = 0; i < N; i++) {
    TANDEM_CHECK(tokens[i] >= 0 && tokens[i] < V, "token id ", tokens[i], " at position ", i,
                 " is outside the vocabulary [0, ", V, ")");
    if (targets == nullptr || targets[i] == kIgnoredTarget) continue;
    TANDEM_CHECK(targets[i] >= 0 && targets[i] < V, "target id ", targets[i], " at position ", i,
                 " is outside the vocabulary [0, ", V, ") and is not ", kIgnoredTarget,
                 " (not counted)");
    counted_targets_++;
  }
  backend_.copy_from_host(tokens_.as<int32_t>(), tokens, N * sizeof(int32_t));
  if (targets != nullptr)
    backend_.copy_from_host(targets_.as<int32_t>(), targets, N * sizeof(int32_t));
  last_B_ = B;
  last_T_ = T;
  have_targets_ = targets != nullptr;
  return forward_pass(B, T, have_targets_);
}

template <typename Elem>
float Model::mean_loss(int N) {
  backend_.kernels<Elem>().cross_entropy_forward(losses_.as<float>(), logits<Elem>(), targets(), N,
                                                 config_.vocab_size);
  std::vector<float> losses(N);
  backend_.copy_to_host(losses.data(), losses_.as<float>(), N * sizeof(float));
  double sum = 0.0;
  for (float loss : losses) sum += loss;  // a position not counted adds 0
  return counted_targets_ == 0 ? 0.0f : static_cast<float>(sum / counted_targets_);
}

float Model::loss_gradient_scale(float loss_scale) const {
  return counted_targets_ == 0 ? 0.0f : loss_scale / static_cast<float>(counted_targets_);
}
template float Model::mean_loss<float>(int);
template float Model::mean_loss<Bf16>(int);

void Model::backward(float loss_scale, const GradientsReady& ready) {
  TANDEM_CHECK(have_targets_, "backward needs a forward pass with targets just before it");
  backward_pass(last_B_, last_T_, loss_scale, ready);
}

}  // namespace tandem
