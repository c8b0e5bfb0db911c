#include "tandem/offload/update_engine.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/half.h"
#include "tandem/core/timer.h"
#include "tandem/offload/snapshot_pool.h"

namespace tandem {

struct UpdateEngine::SubgroupState {
  size_t index = 0;
  Subgroup range;
  // The rule's state arrays (AdamW: [params | m | v]), state_floats x S floats: pinned
  // host for host and staged subgroups, device memory for resident ones.
  float* state = nullptr;
  void* host_grads = nullptr;           // pinned host, host subgroups only
  uint16_t* host_working = nullptr;     // pinned host 16-bit working copy, host subgroups only
  std::vector<UpdateSegment> segments;  // weight-decay ranges, relative to range.begin
  std::unique_ptr<Event> grads_on_host;
  size_t grads_final = 0;           // gradients of this step known final (host subgroups)
  bool grads_sent = false;          // their copy to the host is queued
  std::unique_ptr<Event> captured;  // recorded after its snapshot copies (begin_capture)
  bool capture_pending = false;     // those copies are not yet known to have landed
  // Under capture_mutex_: the copies are queued (at once, or by a streamed capture's
  // thread), and `captured` recorded behind them (not when the capture stopped early).
  bool capture_queued = false;
  bool capture_recorded = false;
  // Reached once this step's working parameters are written (the next forward waits for it);
  // working_marked, under update_mutex_: it is recorded.
  std::unique_ptr<Event> working_final;
  bool working_marked = false;

  size_t size() const { return range.size(); }
  float* params() const { return state; }
  float* array(size_t k) const { return state + k * size(); }
};

namespace {

// The decay segments of the layout that fall inside [begin, end), relative to begin.
std::vector<UpdateSegment> segments_within(const std::vector<UpdateSegment>& all, size_t begin,
                                           size_t end) {
  std::vector<UpdateSegment> out;
  for (const UpdateSegment& s : all) {
    const size_t b = std::max(s.begin, begin), e = std::min(s.end, end);
    if (b < e) out.push_back({b - begin, e - begin, s.weight_decay});
  }
  return out;
}

bool is_16_bit(WorkingDType dtype) {
  return dtype == WorkingDType::kBF16 || dtype == WorkingDType::kF16;
}

std::string gib(size_t bytes) { return cat(static_cast<double>(bytes) / (1 << 30), " GiB"); }

}  // namespace

UpdateEngine::UpdateEngine(Device& device, const ParamLayout& layout, OffloadPlan plan,
                           std::unique_ptr<UpdateRule> rule, DeviceBuffers buffers)
    : device_(device),
      plan_(std::move(plan)),
      rule_(std::move(rule)),
      state_floats_(rule_ ? rule_->state_floats() : 0),
      buffers_(buffers) {
  TANDEM_CHECK(rule_ != nullptr && state_floats_ >= 1,
               "the update engine needs an update rule with the fp32 params among its state");
  TANDEM_CHECK(plan_.num_params == layout.num_elements(), "offload plan covers ", plan_.num_params,
               " parameters, the model has ", layout.num_elements());
  if (!buffers_.working_range) buffers_.working_range = ParamRange{0, plan_.num_params};
  const ParamRange part = plan_.partition, held = *buffers_.working_range;
  TANDEM_CHECK(held.begin <= part.begin && part.end <= held.end && held.end <= plan_.num_params,
               "the working parameters [", held.begin, ", ", held.end,
               ") must cover the plan's partition [", part.begin, ", ", part.end, ")");
  TANDEM_CHECK(buffers_.grads_begin <= part.begin, "the gradients start at ", buffers_.grads_begin,
               ", after the plan's partition [", part.begin, ", ", part.end, ")");
  const std::vector<UpdateSegment> layout_segments = decay_segments(layout);

  size_t host_state_floats = 0, host_grad_floats = 0, device_state_floats = 0;
  for (const Subgroup& s : plan_.subgroups) {
    if (s.site == UpdateSite::kDeviceResident)
      device_state_floats += state_floats_ * s.size();
    else
      host_state_floats += state_floats_ * s.size();
    if (s.site == UpdateSite::kHost) host_grad_floats += s.size();
  }
  const size_t staged = plan_.count(UpdateSite::kDeviceStaged);
  const size_t slots = std::min<size_t>(plan_.settings.staging_buffers, staged);
  try {
    host_state_ = device_.allocate(MemorySpace::kPinnedHost, host_state_floats * sizeof(float));
    host_grads_ = device_.allocate(MemorySpace::kPinnedHost, host_grad_floats * grad_bytes());
    if (is_16_bit(buffers_.working_dtype))
      host_working_ = device_.allocate(MemorySpace::kPinnedHost, host_grad_floats * 2);
    device_state_ = device_.allocate(MemorySpace::kDevice, device_state_floats * sizeof(float));
    staging_ = device_.allocate(MemorySpace::kDevice,
                                slots * state_floats_ * plan_.max_subgroup_size * sizeof(float));
  } catch (const DeviceOutOfMemory& e) {
    const TierBytes needs =
        engine_memory_needs(plan_, working_bytes(), grad_bytes(), state_floats_ * sizeof(float));
    throw DeviceOutOfMemory(
        cat(e.what(), "; the '", update_schedule_name(plan_.settings.schedule), "' schedule needs ",
            gib(needs.device), " of device memory (including working params and gradients) and ",
            gib(needs.pinned_host),
            " of pinned host memory: raise device.memory_gb, or offload more (offload_optimizer."
            "schedule cpu or interleave, a lower offload_optimizer.ratio, fewer "
            "offload_optimizer.staging_buffers or a smaller zero_optimization.sub_group_size)"));
  }

  rule_->attach_device(device_, plan_);
  h2d_ = device_.create_stream("host-to-device");
  d2h_ = device_.create_stream("device-to-host");
  compute_ = device_.create_stream("device update");
  produced_ = device_.create_event();
  for (size_t i = 0; i < kReleaseEvents; i++) released_.push_back(device_.create_event());
  for (size_t i = 0; i < slots; i++) {
    slot_free_.push_back(device_.create_event());
    slot_loaded_.push_back(device_.create_event());
    slot_updated_.push_back(device_.create_event());
  }

  float* host_state = host_state_.as<float>();
  char* host_grads = host_grads_.as<char>();
  uint16_t* host_working = host_working_.as<uint16_t>();
  float* device_state = device_state_.as<float>();
  for (const Subgroup& s : plan_.subgroups) {
    auto sg = std::make_unique<SubgroupState>();
    sg->index = subgroups_.size();
    sg->range = s;
    sg->segments = segments_within(layout_segments, s.begin, s.end);
    if (s.site == UpdateSite::kDeviceResident) {
      sg->state = device_state;
      device_state += state_floats_ * s.size();
    } else {
      sg->state = host_state;
      host_state += state_floats_ * s.size();
    }
    if (s.site == UpdateSite::kHost) {
      sg->host_grads = host_grads;
      host_grads += s.size() * grad_bytes();
      if (host_working != nullptr) {
        sg->host_working = host_working;
        host_working += s.size();
      }
      sg->grads_on_host = device_.create_event();
    }
    sg->working_final = device_.create_event();
    subgroups_.push_back(std::move(sg));
  }
}

UpdateEngine::~UpdateEngine() {
  // An update in flight reports its failure to finish_update(), which nobody calls now.
  if (update_thread_.joinable()) update_thread_.join();
  // A streamed capture's owner ends it (finish_capture) while its pool still drains.
  if (capture_thread_.joinable()) capture_thread_.join();
  // Queued work must not outlive the buffers it uses.
  for (Stream* stream : {h2d_.get(), d2h_.get(), compute_.get(), capture_stream_.get()}) {
    try {
      if (stream != nullptr) stream->synchronize();
    } catch (const Error&) {
      // Already reported by the step that failed.
    }
  }
}

size_t UpdateEngine::working_bytes() const {
  return is_16_bit(buffers_.working_dtype) ? 2 : sizeof(float);
}

size_t UpdateEngine::grad_bytes() const {
  return buffers_.grad_dtype == GradDType::kF32 ? sizeof(float) : 2;
}

const void* UpdateEngine::grad_at(size_t index) const {
  return static_cast<const char*>(buffers_.grads) + (index - buffers_.grads_begin) * grad_bytes();
}

RuleArrays UpdateEngine::arrays(const SubgroupState& sg, float* state, const void* grads) const {
  RuleArrays a;
  a.state = state;
  a.size = sg.size();
  a.begin = sg.range.begin;
  a.grads = grads;
  a.grad_dtype = buffers_.grad_dtype;
  return a;
}

void* UpdateEngine::working_at(size_t index) const {
  return static_cast<char*>(buffers_.working_params) +
         (index - working_range().begin) * working_bytes();
}

void UpdateEngine::send_gradients(SubgroupState& sg) {
  const size_t bytes = sg.size() * grad_bytes();
  device_.copy_async(sg.host_grads, grad_at(sg.range.begin), bytes, *d2h_, label(sg, "gradients"));
  device_.record(*sg.grads_on_host, *d2h_);
  sg.grads_sent = true;
  pending_.d2h_bytes += bytes;
}

void UpdateEngine::wait_for_producer(std::initializer_list<Stream*> streams) {
  if (buffers_.producer == nullptr) return;
  device_.record(*produced_, *buffers_.producer);
  for (Stream* stream : streams) device_.wait(*stream, *produced_);
}

void UpdateEngine::release_to_producer(std::initializer_list<Stream*> streams) {
  if (buffers_.producer == nullptr) return;
  TANDEM_CHECK(streams.size() <= released_.size(), "release_to_producer: at most ",
               released_.size(), " streams");
  size_t i = 0;
  for (Stream* stream : streams) {
    device_.record(*released_[i], *stream);
    device_.wait(*buffers_.producer, *released_[i++]);
  }
}

void UpdateEngine::gradients_ready(size_t begin, size_t end) {
  finish_update();
  if (failed_) return;   // step() reports it
  bool ordered = false;  // d2h_ waits for the producer once per call, before any copy
  for (auto& sg : subgroups_) {
    if (sg->range.site != UpdateSite::kHost || sg->grads_sent) continue;
    const size_t b = std::max(begin, sg->range.begin), e = std::min(end, sg->range.end);
    if (b >= e) continue;
    sg->grads_final += e - b;
    if (sg->grads_final == sg->size()) {
      if (!ordered) wait_for_producer({d2h_.get()});
      ordered = true;
      send_gradients(*sg);
      pending_.early_gradient_subgroups++;
    }
  }
}

void UpdateEngine::set_tracer(TraceRecorder* tracer) {
  tracer_ = tracer;
  device_.set_tracer(tracer);
}

std::string UpdateEngine::label(const SubgroupState& sg, std::string_view what) const {
  if (tracer_ == nullptr || !tracer_->enabled()) return {};
  return cat("sg ", sg.index, " ", what);
}

void UpdateEngine::synchronize_all() {
  // Every stream is drained even if an earlier one failed, so that nothing still runs
  // when the error reaches the caller; the first failure is rethrown.
  std::exception_ptr first;
  for (Stream* stream : {d2h_.get(), compute_.get(), h2d_.get()}) {
    try {
      stream->synchronize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void UpdateEngine::load_state(std::span<const float* const> arrays, int64_t step) {
  finish_update();
  TANDEM_CHECK(arrays.size() == state_floats_, "load_state: ", arrays.size(),
               " state arrays for the ", rule_->name(), " rule, which keeps ", state_floats_);
  load_state([&](size_t k, ParamRange range,
                 float* out) { std::copy(arrays[k] + range.begin, arrays[k] + range.end, out); },
             step);
}

void UpdateEngine::load_state(const StateFill& fill, int64_t step) {
  const ParamRange held = working_range();
  std::vector<float> piece(std::min(kPieceFloats, std::max<size_t>(held.size(), 1)));
  load_state(
      [&](const StateSink& put, const StatePlace&) {
        // The params over all the working copy holds (which covers the plan's partition),
        // then the rule's other arrays, subgroup by subgroup.
        for (size_t begin = held.begin; begin < held.end; begin += piece.size()) {
          const ParamRange range{begin, std::min(begin + piece.size(), held.end)};
          fill(0, range, piece.data());
          put(0, range, piece.data());
        }
        for (size_t k = 1; k < state_floats_; k++)
          for (const auto& sg : subgroups_)
            for (size_t b = sg->range.begin; b < sg->range.end; b += piece.size()) {
              const ParamRange range{b, std::min(b + piece.size(), sg->range.end)};
              fill(k, range, piece.data());
              put(k, range, piece.data());
            }
      },
      step);
}

void UpdateEngine::load_state(const StateFeed& feed, int64_t step) {
  finish_update();
  TANDEM_CHECK(!failed_, "the update engine stopped after a failed step; resume from a checkpoint");
  finish_capture();
  const auto stream = device_.create_stream("load_state");
  // The working parameters may still be being zeroed on the model's stream (a new model's
  // buffers are), or read by the last forward.
  wait_for_producer({stream.get()});
  const ParamRange held = working_range();
  std::vector<uint16_t> piece16;
  std::optional<ThreadPool> convert_pool;  // made only for a 16-bit working copy
  size_t working_landed = 0;
  std::vector<size_t> landed(state_floats_, 0);
  // The subgroups tile the partition in flat order: the first one ending past `begin`.
  const auto first_past = [&](size_t begin) {
    return std::partition_point(
        subgroups_.begin(), subgroups_.end(),
        [&](const std::unique_ptr<SubgroupState>& sg) { return sg->range.end <= begin; });
  };
  const auto put = [&](size_t k, ParamRange range, const float* values) {
    TANDEM_CHECK(k < state_floats_, "load_state: state array ", k, " of the ", rule_->name(),
                 " rule, which keeps ", state_floats_);
    if (k == 0) {
      // The params: into the working copy (in its dtype) where it holds them...
      const size_t b = std::max(range.begin, held.begin), e = std::min(range.end, held.end);
      for (size_t at = b; at < e; at += kPieceFloats) {
        const size_t n = std::min(kPieceFloats, e - at);
        const float* from = values + (at - range.begin);
        const void* working = from;
        if (is_16_bit(buffers_.working_dtype)) {
          const bool bf16 = buffers_.working_dtype == WorkingDType::kBF16;
          stream->synchronize();  // piece16's last copy has left
          piece16.resize(n);
          if (!convert_pool) convert_pool.emplace(0, /*pin=*/false);
          convert_pool->parallel_for(n, 4096, [&](size_t begin, size_t end) {
            for (size_t i = begin; i < end; i++)
              piece16[i] = bf16 ? float_to_bf16(from[i]) : float_to_fp16(from[i]);
          });
          working = piece16.data();
        }
        device_.copy_async(working_at(at), working, n * working_bytes(), *stream);
        working_landed += n;
      }
    }
    // ... and every array into the subgroups it overlaps (but where it was read in place).
    for (auto it = first_past(range.begin);
         it != subgroups_.end() && (*it)->range.begin < range.end; ++it) {
      const SubgroupState& sg = **it;
      const size_t b = std::max(range.begin, sg.range.begin);
      const size_t e = std::min(range.end, sg.range.end);
      float* to = sg.array(k) + (b - sg.range.begin);
      const float* from = values + (b - range.begin);
      if (to != from) device_.copy_async(to, from, (e - b) * sizeof(float), *stream);
      landed[k] += e - b;
    }
    stream->synchronize();  // `values` is the caller's again
  };
  const auto place = [&](size_t k, ParamRange range) -> float* {
    TANDEM_CHECK(k < state_floats_, "load_state: state array ", k, " of the ", rule_->name(),
                 " rule, which keeps ", state_floats_);
    const auto it = first_past(range.begin);
    if (it == subgroups_.end() || (*it)->range.begin > range.begin || range.end > (*it)->range.end)
      return nullptr;
    const SubgroupState& sg = **it;
    const bool host_writable =
        sg.range.site != UpdateSite::kDeviceResident || device_.kind() == DeviceKind::kHostOnly;
    return host_writable ? sg.array(k) + (range.begin - sg.range.begin) : nullptr;
  };
  feed(put, place);
  size_t partition = 0;
  for (const auto& sg : subgroups_) partition += sg->size();
  TANDEM_CHECK(working_landed == held.size(), "load_state: ", working_landed,
               " working parameters were given, of the ", held.size(),
               " the engine holds (each must come once)");
  for (size_t k = 0; k < state_floats_; k++)
    TANDEM_CHECK(landed[k] == partition, "load_state: ", landed[k], " elements of state array ", k,
                 " were given, of the ", partition, " the engine holds (each must come once)");
  release_to_producer({stream.get()});
  stream->synchronize();
  step_ = step;
}

void UpdateEngine::read_state(std::span<float* const> arrays) {
  finish_update();
  TANDEM_CHECK(arrays.size() == state_floats_, "read_state: ", arrays.size(),
               " state arrays for the ", rule_->name(), " rule, which keeps ", state_floats_);
  // A stream of its own: this also works after a failed step left the engine's
  // streams in their error state (to inspect or save what is there).
  const auto stream = device_.create_stream("read_state");
  for (auto& sg : subgroups_) {
    const size_t b = sg->range.begin, bytes = sg->size() * sizeof(float);
    for (size_t k = 0; k < state_floats_; k++)
      device_.copy_async(arrays[k] + b, sg->array(k), bytes, *stream);
  }
  stream->synchronize();
}

void UpdateEngine::read_state(const StateSink& sink) {
  finish_update();
  const auto stream = device_.create_stream("read_state");
  std::vector<float> piece(kPieceFloats);
  for (size_t k = 0; k < state_floats_; k++) {
    for (auto& sg : subgroups_) {
      for (size_t b = sg->range.begin; b < sg->range.end; b += piece.size()) {
        const ParamRange range{b, std::min(b + piece.size(), sg->range.end)};
        device_.copy_async(piece.data(), sg->array(k) + (b - sg->range.begin),
                           range.size() * sizeof(float), *stream);
        stream->synchronize();
        sink(k, range, piece.data());
      }
    }
  }
}

const float* UpdateEngine::state_span(size_t k, ParamRange range, float* scratch) {
  finish_update();
  TANDEM_CHECK(k < state_floats_, "state_span: array ", k, " of the ", rule_->name(),
               " rule, which keeps ", state_floats_);
  // The subgroups tile the partition in flat order: the first one ending past range.begin.
  const auto first = std::partition_point(
      subgroups_.begin(), subgroups_.end(),
      [&](const std::unique_ptr<SubgroupState>& sg) { return sg->range.end <= range.begin; });
  TANDEM_CHECK(first != subgroups_.end() && (*first)->range.begin <= range.begin,
               "state_span: elements [", range.begin, ", ", range.end,
               ") are not in this engine's partition");
  const SubgroupState& sg = **first;
  const bool host_readable =
      sg.range.site != UpdateSite::kDeviceResident || device_.kind() == DeviceKind::kHostOnly;
  if (host_readable && range.end <= sg.range.end)
    return sg.array(k) + (range.begin - sg.range.begin);
  const auto stream = device_.create_stream("state_span");
  size_t copied = 0;
  for (auto it = first; it != subgroups_.end() && (*it)->range.begin < range.end; ++it) {
    const SubgroupState& piece = **it;
    const size_t b = std::max(range.begin, piece.range.begin);
    const size_t e = std::min(range.end, piece.range.end);
    device_.copy_async(scratch + (b - range.begin), piece.array(k) + (b - piece.range.begin),
                       (e - b) * sizeof(float), *stream);
    copied += e - b;
  }
  stream->synchronize();
  TANDEM_CHECK(copied == range.size(), "state_span: elements [", range.begin, ", ", range.end,
               ") run past this engine's partition");
  return scratch;
}

std::vector<UpdateEngine::SubgroupState*> UpdateEngine::update_order() const {
  std::vector<SubgroupState*> order;
  for (const auto& sg : subgroups_)
    if (sg->range.site != UpdateSite::kHost) order.push_back(sg.get());
  for (const auto& sg : subgroups_)
    if (sg->range.site == UpdateSite::kHost) order.push_back(sg.get());
  return order;
}

Event& UpdateEngine::begin_capture(std::span<float* const> arrays) {
  finish_update();
  TANDEM_CHECK(arrays.size() == state_floats_, "begin_capture: ", arrays.size(),
               " state arrays for the ", rule_->name(), " rule, which keeps ", state_floats_);
  TANDEM_CHECK(!capturing(), "begin_capture: the previous capture is not finished");
  TANDEM_CHECK(!failed_, "the update engine stopped after a failed step; resume from a checkpoint");
  capture_stream_ = device_.create_stream("snapshot");
  capture_error_ = nullptr;
  for (SubgroupState* sg : update_order()) {
    const size_t b = sg->range.begin, bytes = sg->size() * sizeof(float);
    for (size_t k = 0; k < state_floats_; k++)
      device_.copy_async(arrays[k] + b, sg->array(k), bytes, *capture_stream_,
                         label(*sg, "snapshot"));
    if (!sg->captured) sg->captured = device_.create_event();
    device_.record(*sg->captured, *capture_stream_);
    sg->capture_pending = true;
    mark_capture_queued(*sg, true);
  }
  if (!capture_landed_) capture_landed_ = device_.create_event();
  device_.record(*capture_landed_, *capture_stream_);
  return *capture_landed_;
}

void UpdateEngine::begin_streamed_capture(SnapshotPool& pool) {
  finish_update();
  TANDEM_CHECK(!capturing(), "begin_capture: the previous capture is not finished");
  TANDEM_CHECK(!failed_, "the update engine stopped after a failed step; resume from a checkpoint");
  TANDEM_CHECK(pool.slot_floats() >= state_floats_, "begin_streamed_capture: slots of ",
               pool.slot_floats(), " floats cannot hold one parameter's ", state_floats_,
               " state floats");
  capture_stream_ = device_.create_stream("snapshot");
  capture_error_ = nullptr;
  std::vector<SubgroupState*> order = update_order();
  for (SubgroupState* sg : order) {
    if (!sg->captured) sg->captured = device_.create_event();
    sg->capture_pending = true;
    std::lock_guard lock(capture_mutex_);
    sg->capture_queued = sg->capture_recorded = false;
  }
  capture_thread_ =
      std::thread([this, &pool, order = std::move(order)] { stream_capture(pool, order); });
}

void UpdateEngine::stream_capture(SnapshotPool& pool, const std::vector<SubgroupState*>& order) {
  const size_t piece = pool.slot_floats() / state_floats_;
  size_t next = 0;  // the first subgroup whose copies are not all queued
  try {
    bool abandoned = false;
    for (; next < order.size() && !abandoned; next++) {
      SubgroupState& sg = *order[next];
      for (size_t at = 0; at < sg.size(); at += piece) {
        const std::optional<size_t> slot = pool.acquire();
        if (!slot) {
          abandoned = true;  // the writer is gone: the snapshot will not be written
          break;
        }
        const size_t n = std::min(piece, sg.size() - at);
        float* data = pool.data(*slot);
        for (size_t k = 0; k < state_floats_; k++)
          device_.copy_async(data + k * n, sg.array(k) + at, n * sizeof(float), *capture_stream_,
                             label(sg, "snapshot"));
        device_.record(pool.copied(*slot), *capture_stream_);
        pool.fill(*slot, {sg.range.begin + at, sg.range.begin + at + n});
      }
      // Also after an abandoned piece: the step must not change the subgroup under a copy.
      device_.record(*sg.captured, *capture_stream_);
      mark_capture_queued(sg, true);
    }
  } catch (...) {
    capture_error_ = std::current_exception();
  }
  for (; next < order.size(); next++) mark_capture_queued(*order[next], false);
  pool.close();
}

void UpdateEngine::mark_capture_queued(SubgroupState& sg, bool recorded) {
  {
    std::lock_guard lock(capture_mutex_);
    sg.capture_queued = true;
    sg.capture_recorded = recorded;
  }
  capture_queued_.notify_all();
}

double UpdateEngine::finish_capture() {
  if (!capturing()) return 0.0;
  finish_update();
  Stopwatch watch;
  if (capture_thread_.joinable()) capture_thread_.join();
  // The stream ends with the capture whatever happens below.
  const std::unique_ptr<Stream> stream = std::move(capture_stream_);
  for (auto& sg : subgroups_) sg->capture_pending = false;
  stream->synchronize();
  if (capture_error_) std::rethrow_exception(std::exchange(capture_error_, nullptr));
  return watch.millis();
}

void UpdateEngine::wait_for_capture(SubgroupState& sg, UpdateStepStats& stats) {
  if (!sg.capture_pending) return;
  Stopwatch watch;
  bool recorded = false;
  {
    std::unique_lock lock(capture_mutex_);
    capture_queued_.wait(lock, [&] { return sg.capture_queued; });
    recorded = sg.capture_recorded;
  }
  if (recorded) sg.captured->synchronize();
  sg.capture_pending = false;
  stats.capture_wait_ms += watch.millis();
}

void UpdateEngine::enqueue_device_update(SubgroupState& sg, float* state, Phase phase) {
  RuleArrays arrays = this->arrays(sg, state, grad_at(sg.range.begin));
  if (phase == Phase::kPrepare) {
    device_.launch_async(rule_->device_prepare(arrays), *compute_, label(sg, "prepare"));
    return;
  }
  if (is_16_bit(buffers_.working_dtype)) {
    // The kernel writes the 16-bit working copy in place, in the same pass.
    arrays.params16 = working_at(sg.range.begin);
    arrays.params16_dtype = buffers_.working_dtype;
  }
  device_.launch_async(rule_->device_update(arrays, sg.segments), *compute_,
                       label(sg, rule_->name()));
  if (!is_16_bit(buffers_.working_dtype)) {
    // The model computes with the fp32 params themselves.
    device_.copy_async(working_at(sg.range.begin), state, sg.size() * sizeof(float), *compute_,
                       label(sg, "working params"));
  }
  mark_working_final(sg, *compute_);
}

void UpdateEngine::mark_working_final(SubgroupState& sg, Stream& stream) {
  device_.record(*sg.working_final, stream);
  {
    std::lock_guard lock(update_mutex_);
    sg.working_marked = true;
  }
  working_marked_.notify_all();
}

void UpdateEngine::enqueue_staged(SubgroupState& sg, size_t slot, Phase phase,
                                  UpdateStepStats& stats) {
  const size_t bytes = state_floats_ * sg.size() * sizeof(float);
  float* staging = staging_.as<float>() + slot * state_floats_ * plan_.max_subgroup_size;
  // Prefetch once the slot's previous subgroup has been written back.
  device_.wait(*h2d_, *slot_free_[slot]);
  device_.copy_async(staging, sg.state, bytes, *h2d_, label(sg, "prefetch"));
  device_.record(*slot_loaded_[slot], *h2d_);
  stats.h2d_bytes += bytes;
  // Update (or prepare) on the device.
  device_.wait(*compute_, *slot_loaded_[slot]);
  enqueue_device_update(sg, staging, phase);
  device_.record(*slot_updated_[slot], *compute_);
  // Write back in one copy: the subgroup's host state is replaced entirely or not at all.
  device_.wait(*d2h_, *slot_updated_[slot]);
  device_.copy_async(sg.state, staging, bytes, *d2h_, label(sg, "write-back"));
  device_.record(*slot_free_[slot], *d2h_);
  stats.d2h_bytes += bytes;
}

void UpdateEngine::enqueue_device_work(Phase phase, UpdateStepStats& stats) {
  size_t staged = 0;
  for (auto& sg : subgroups_) {
    // Resident subgroups change in place; staged ones when they are written back.
    if (sg->range.site != UpdateSite::kHost) wait_for_capture(*sg, stats);
    if (sg->range.site == UpdateSite::kDeviceResident) enqueue_device_update(*sg, sg->state, phase);
    if (sg->range.site == UpdateSite::kDeviceStaged)
      enqueue_staged(*sg, staged++ % slot_free_.size(), phase, stats);
  }
}

void UpdateEngine::run_host_work(Phase phase, UpdateStepStats& stats) {
  for (auto& sg : subgroups_) {
    if (sg->range.site != UpdateSite::kHost) continue;
    wait_for_capture(*sg, stats);
    sg->grads_on_host->synchronize();
    RuleArrays arrays = this->arrays(*sg, sg->state, sg->host_grads);
    if (phase == Phase::kPrepare) {
      TraceScope scope(tracer_, "cpu update", label(*sg, "prepare"));
      rule_->prepare_on_host(arrays);
      continue;
    }
    {
      TraceScope scope(tracer_, "cpu update", label(*sg, rule_->name()));
      if (sg->host_working != nullptr) {
        arrays.params16 = sg->host_working;
        arrays.params16_dtype = buffers_.working_dtype;
      }
      rule_->update_on_host(arrays, sg->segments);
    }
    // The new working parameters go back to the device behind the update.
    const size_t bytes = sg->size() * working_bytes();
    const void* source =
        sg->host_working != nullptr ? static_cast<const void*>(sg->host_working) : sg->params();
    device_.copy_async(working_at(sg->range.begin), source, bytes, *h2d_,
                       label(*sg, "working params"));
    mark_working_final(*sg, *h2d_);
  }
}

void UpdateEngine::skip_step() {
  finish_update();
  TANDEM_CHECK(!failed_, "the update engine stopped after a failed step; resume from a checkpoint");
  // Copies queued during backward may still read the model's gradients.
  wait_for_producer({d2h_.get(), compute_.get(), h2d_.get()});
  release_to_producer({d2h_.get(), compute_.get(), h2d_.get()});
  synchronize_all();
  for (auto& sg : subgroups_) {
    sg->grads_final = 0;
    sg->grads_sent = false;
  }
  pending_ = UpdateStepStats{};
  last_step_ = UpdateStepStats{};
}

UpdateStepStats UpdateEngine::step(double lr, float grad_scale) {
  finish_update();
  TANDEM_CHECK(!failed_, "the update engine stopped after a failed step; resume from a checkpoint");
  Stopwatch watch;
  const int64_t step = step_ + 1;
  rule_->begin_step(step, lr, grad_scale);
  // Everything queued for this step, including gradients sent during backward, is
  // counted in pending_ and handed over as the step's stats.
  UpdateStepStats& stats = pending_;
  try {
    {
      std::lock_guard lock(update_mutex_);
      for (auto& sg : subgroups_) sg->working_marked = false;
      update_done_ = false;
    }
    // Every stream reads gradients or writes working parameters that backward may
    // still be using.
    wait_for_producer({d2h_.get(), compute_.get(), h2d_.get()});
    // 1. Gradients of CPU-updated subgroups to pinned host memory, those not already
    //    on their way since backward.
    for (auto& sg : subgroups_) {
      if (sg->range.site == UpdateSite::kHost && !sg->grads_sent) send_gradients(*sg);
    }
    if (rule_->has_exchange()) {
      // A rule that needs the other ranks: every subgroup is prepared at its site (device
      // work first, overlapping the CPU's), then the ranks exchange, then every subgroup
      // is updated.
      enqueue_device_work(Phase::kPrepare, stats);
      run_host_work(Phase::kPrepare, stats);
      synchronize_all();
      rule_->exchange();
    }
    // 2. Device work, queued up front so that it overlaps the CPU updates below.
    enqueue_device_work(Phase::kUpdate, stats);
    stats.h2d_bytes += plan_.params_at(UpdateSite::kHost) * working_bytes();
  } catch (const Error& e) {
    fail_step(step, e);
  }
  // 3. CPU updates, each as soon as its gradients have arrived, and their working
  //    parameters back to the device.
  step_in_flight_ = step;
  update_in_flight_ = true;
  waits_.clear();
  in_flight_clock_.reset();  // before the thread that reads it starts
  if (plan_.settings.overlap_forward) {
    update_error_ = nullptr;
    update_thread_ = std::thread([this] {
      device_.use_on_this_thread();
      // Its capture waits need no count of their own: on a capturing step the checkpointer
      // joins the update (finish_capture) and counts the whole join as the checkpoint's stall.
      UpdateStepStats counted_by_the_join;
      finish_on_host(counted_by_the_join);
    });
  } else {
    finish_on_host(stats);
    finish_update();
  }
  stats.ms = watch.millis();
  last_step_ = std::exchange(pending_, UpdateStepStats{});
  return last_step_;
}

void UpdateEngine::finish_on_host(UpdateStepStats& stats) {
  try {
    run_host_work(Phase::kUpdate, stats);
    synchronize_all();
  } catch (...) {
    update_error_ = std::current_exception();
  }
  {
    std::lock_guard lock(update_mutex_);
    update_done_ = true;
    update_done_ms_ = in_flight_clock_.millis();
  }
  working_marked_.notify_all();
}

void UpdateEngine::wait_for_parameters(ParamRange range, Stream* reader) {
  if (!update_in_flight_) return;
  const double began = in_flight_clock_.millis();
  // The subgroups are in flat order; those of `range` are consecutive.
  for (auto& sg : subgroups_) {
    if (sg->range.end <= range.begin || sg->range.begin >= range.end) continue;
    bool marked = false;
    {
      std::unique_lock lock(update_mutex_);
      working_marked_.wait(lock, [&] { return sg->working_marked || update_done_; });
      marked = sg->working_marked;
    }
    if (!marked) {  // the update stopped before it
      waits_.emplace_back(began, in_flight_clock_.millis());
      finish_update();  // throws the step's failure
      return;
    }
    if (reader != nullptr) {
      device_.wait(*reader, *sg->working_final);
      continue;
    }
    try {
      sg->working_final->synchronize();
    } catch (const Error&) {
      finish_update();  // the update thread meets the same failure: reported as the step's
      throw;
    }
  }
  waits_.emplace_back(began, in_flight_clock_.millis());
}

UpdateEngine::OverlapTimes UpdateEngine::finish_update() {
  if (!update_in_flight_) return {};
  const double began = in_flight_clock_.millis();
  if (update_thread_.joinable()) update_thread_.join();
  waits_.emplace_back(began, in_flight_clock_.millis());
  update_in_flight_ = false;
  if (update_error_) {
    try {
      std::rethrow_exception(std::exchange(update_error_, nullptr));
    } catch (const Error& e) {
      fail_step(step_in_flight_, e);
    }
  }
  step_ = step_in_flight_;
  // The model's next kernels wait on the device for the new working parameters (and
  // for the gradient reads to finish), whatever the host does next.
  release_to_producer({d2h_.get(), compute_.get(), h2d_.get()});
  for (auto& sg : subgroups_) {
    sg->grads_final = 0;
    sg->grads_sent = false;
  }
  if (!plan_.settings.overlap_forward) return {};
  OverlapTimes times;
  for (const auto& [begin, end] : waits_)
    times.waited_ms += std::max(0.0, std::min(end, update_done_ms_) - begin);
  times.hidden_ms = std::max(0.0, update_done_ms_ - times.waited_ms);
  return times;
}

void UpdateEngine::fail_step(int64_t step, const Error& error) {
  failed_ = true;
  update_in_flight_ = false;
  try {
    synchronize_all();
  } catch (const Error&) {
    // The first failure is the one reported.
  }
  fail("optimizer step ", step, " failed: ", error.what(), ". Each subgroup now holds either step ",
       step - 1, " or step ", step,
       ", so the optimizer state is inconsistent and training cannot continue; resume from "
       "the last checkpoint");
}

std::vector<std::vector<float>> read_engine_state(UpdateEngine& engine, size_t num_params) {
  // Each array made once, not copied from a first. (Not on huge pages: this runs at every
  // synchronous save, and with THP's defrag "madvise" a fault on a fragmented host stalls
  // for compaction: measured 35-272 ms against a steady 75-85.)
  std::vector<std::vector<float>> state(engine.rule().state_floats());
  for (std::vector<float>& array : state) array.resize(num_params);
  std::vector<float*> arrays;
  for (std::vector<float>& array : state) arrays.push_back(array.data());
  engine.read_state(arrays);
  return state;
}

}  // namespace tandem
