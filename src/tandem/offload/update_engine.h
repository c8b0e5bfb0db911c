// The update engine: one optimizer step over the subgroups of an OffloadPlan, each
// updated at its site (host CPU, device-resident, or staged through the device), with
// copies and device work on streams overlapped with the CPU updates.
//
// The arithmetic is the update rule's (update_rule.h: AdamW, ...); every site computes
// the rule's exact operations, so the parameters and optimizer state after a step are
// bit-identical whatever the schedule.
//
// State layout: each offloaded subgroup keeps its state arrays ([params | m | v] for
// AdamW: state_floats() x S floats) in one contiguous pinned-host block, so prefetch and
// write-back are one copy each: a failed copy leaves a subgroup either entirely old or
// entirely new, never half-updated.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"
#include "tandem/core/timer.h"
#include "tandem/device/device.h"
#include "tandem/model/param_layout.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/offload/update_rule.h"

namespace tandem {

class SnapshotPool;

class UpdateEngine {
 public:
  // What the model computes with, in device memory: the working parameters (written by
  // every update, in `working_dtype`: fp32 for the fp32 compute backends, bf16 or fp16
  // for mixed precision) and the gradients (read by it, fp32 or bf16), both
  // [num_params].
  struct DeviceBuffers {
    void* working_params = nullptr;
    const void* grads = nullptr;
    WorkingDType working_dtype = WorkingDType::kF32;
    GradDType grad_dtype = GradDType::kF32;
    // The flat index of grads[0]: 0 for a buffer of all gradients, a partition's start
    // when the buffer holds only that partition's (ZeRO stages 2 and 3).
    size_t grads_begin = 0;
    // The flat range working_params holds, from its first element: all parameters when
    // unset; a partition at ZeRO stage 3. It covers the plan's partition.
    std::optional<ParamRange> working_range = std::nullopt;
    // The stream the model's kernels run on, when they run asynchronously (a GPU). Both
    // ways are ordered on the device, with events, never by the host: the engine's reads
    // of the gradients and its writes of the working parameters wait for the work queued
    // there so far (backward, or the zeroing of a new model's buffers), and the work
    // queued there after a step or load_state waits for all of the engine's (so the next
    // forward reads the new parameters and the next backward writes gradients the engine
    // has finished reading). Null: the model's work is done by the time it returns.
    Stream* producer = nullptr;
  };

  // Allocates everything the plan needs up front (so that no step can fail for lack
  // of memory); throws DeviceOutOfMemory naming the bytes per tier and the settings to
  // change when the device is too small.
  UpdateEngine(Device& device, const ParamLayout& layout, OffloadPlan plan,
               std::unique_ptr<UpdateRule> rule, DeviceBuffers buffers);
  ~UpdateEngine();
  UpdateEngine(const UpdateEngine&) = delete;
  UpdateEngine& operator=(const UpdateEngine&) = delete;

  const OffloadPlan& plan() const { return plan_; }
  const UpdateRule& rule() const { return *rule_; }
  int64_t step_count() const { return step_; }

  // Loads the rule's state arrays (host, flat layout order, as many as
  // rule().state_floats(), the fp32 params first) and the step count, and writes the
  // working parameters (those of DeviceBuffers::working_range).
  void load_state(std::span<const float* const> arrays, int64_t step);
  // Copies the state arrays out into host arrays in flat layout order (also after a failed
  // step, to inspect what each subgroup holds).
  void read_state(std::span<float* const> arrays);
  // The same from `fill`, which writes state array k (0: the fp32 params) over `range` into
  // out[0, range.size()), asked piece by piece (at most kPieceFloats at a time, through one
  // host buffer): a model's state need never be in host memory twice. Every array is asked
  // for the plan's partition, the params for all that DeviceBuffers::working_range holds.
  static constexpr size_t kPieceFloats = size_t{1} << 22;
  using StateFill = std::function<void(size_t k, ParamRange range, float* out)>;
  void load_state(const StateFill& fill, int64_t step);
  // Pieces of state: values[0, range.size()) of array k over `range` (flat order), valid
  // during the call.
  using StateSink = std::function<void(size_t k, ParamRange range, const float* values)>;
  // The same from pieces in whatever order a source has them (a checkpoint's files, read
  // front to back): `feed` calls put(k, range, values) for pieces that together give every
  // element of the plan's partition of every array, and the params over all that
  // DeviceBuffers::working_range holds, once (throws when any was missed or given twice);
  // the engine takes of each piece what it holds and drops the rest. place(k, range) is
  // where the engine keeps array k over `range` in host memory itself (one subgroup the
  // host can write holds all of it), else null: a source may read a piece there and put it
  // from there, which saves a copy.
  using StatePlace = std::function<float*(size_t k, ParamRange range)>;
  using StateFeed = std::function<void(const StateSink& put, const StatePlace& place)>;
  void load_state(const StateFeed& feed, int64_t step);
  // The state piece by piece: sink(k, range, values) for array k, the plan's partition in
  // flat order, one array after the other.
  void read_state(const StateSink& sink);
  // State array k (0: the fp32 params) over `range` (within the plan's partition), for a
  // reader between steps: a pointer into the engine's own memory where one subgroup whose
  // state the host can read (host subgroups; every subgroup on the cpu device) holds all of
  // it, else `scratch` (range.size() floats) filled from the subgroups holding it. Valid
  // until the next step. A synchronous checkpoint writes from it with no copy of the state.
  const float* state_span(size_t k, ParamRange range, float* scratch);
  // AdamW's three arrays.
  void load_state(const float* params, const float* m, const float* v, int64_t step) {
    const float* arrays[] = {params, m, v};
    load_state(arrays, step);
  }
  void read_state(float* params, float* m, float* v) {
    float* arrays[] = {params, m, v};
    read_state(arrays);
  }

  // Lazy snapshot, for checkpoints taken while training goes on: queues copies of every
  // subgroup's state arrays into `arrays` (host memory, flat layout order as read_state
  // fills them; pinned memory lets a GPU copy asynchronously) on a stream of their own,
  // in the order the next step updates the subgroups, and returns. The model may compute
  // meanwhile; the next step() waits for a subgroup's copy only before it changes that
  // subgroup's state (counted in UpdateStepStats::capture_wait_ms), so the arrays receive
  // the state as it is now. They must stay valid until finish_capture(). One capture at
  // a time. Returns an event reached once every copy has landed, which any thread may
  // wait for (a background writer), valid until the next begin_capture.
  Event& begin_capture(std::span<float* const> arrays);
  // The same through a bounded pool (offload/snapshot_pool.h), for when a full copy does
  // not fit in host memory: a thread of the engine's queues the copies piece by piece
  // (each piece every state array of up to pool.slot_floats() / state_floats() params of
  // one subgroup), in the order the next step updates the subgroups, each once the pool
  // has a free slot, and closes the pool after the last. The next step's wait for a
  // subgroup includes waiting for its pieces to be queued, that is for the pool's writer
  // (back-pressure). The pool must be open, and its writer draining it, until
  // finish_capture().
  void begin_streamed_capture(SnapshotPool& pool);
  bool capturing() const { return capture_stream_ != nullptr; }
  // Blocks until every copy of the capture has been queued and has landed (rethrows a
  // failed one) and ends it; returns the milliseconds waited. Nothing to do without a
  // capture.
  double finish_capture();

  // One step of the rule with learning rate lr and gradient scale grad_scale (clipping), the
  // gradients in DeviceBuffers::grads being complete. On failure throws tandem::Error
  // saying that training cannot continue; the engine then refuses further steps.
  //
  // With OffloadSettings::overlap_forward the step returns once the device's work is queued
  // and the CPU updates have begun on a thread of the engine, in flat order, which is the
  // order the model's forward reads its blocks in (Model::blocks()). The next forward reads
  // each block once wait_for_parameters() says its parameters are final, while the later
  // subgroups are still being updated; finish_update() ends the step (a failure is thrown
  // there, or by wait_for_parameters). Every other call below finishes it first. Nothing
  // changes numerically: each subgroup's update is the same, and each block is read once
  // it is complete.
  UpdateStepStats step(double lr, float grad_scale);
  bool update_in_flight() const { return update_in_flight_; }
  // Returns once the working parameters of `range` (those the plan's subgroups write) may be
  // read: with a `reader` stream, the one the caller queues its reads on (a GPU model's),
  // once their writes are queued, that stream's later work waiting for them on the device;
  // without one (the caller reads at once, as the CPU backend's kernels do), once they are
  // written. Nothing to wait for without an update in flight.
  void wait_for_parameters(ParamRange range, Stream* reader);
  struct OverlapTimes {
    // How long the update in flight ran on behind the caller's own work (the next forward)
    // after step() returned, and how long the caller waited for it (here and in
    // wait_for_parameters): hidden + waited is how long it ran after step() returned.
    double hidden_ms = 0;
    double waited_ms = 0;
  };
  // Waits for the update in flight to end, rethrowing its failure (as step() would have),
  // and orders the producer's later work after all of it (the next backward overwrites the
  // gradients it reads). Zeros without one.
  OverlapTimes finish_update();

  // Drops the coming step instead of taking it (its gradients are not finite): the state
  // and the step count stay as they are, gradient copies already started are waited for
  // (so the model may overwrite its gradients) and forgotten. A capture in flight goes on.
  void skip_step();
  // What the last step() reported; empty when the last attempt was skipped (skip_step).
  const UpdateStepStats& last_step_stats() const { return last_step_; }

  // Tells the engine that gradients [begin, end) of the coming step are final (called
  // from backward, see Model::GradientsReady; with a producer stream, final once the work
  // queued on it so far is done): CPU-updated subgroups whose gradients are all final
  // start copying them to pinned host memory now, overlapped with the rest of
  // backward. Ranges of one step must not overlap.
  void gradients_ready(size_t begin, size_t end);

  // Records CPU updates on lane "cpu update" and the device's work on its stream lanes
  // while `tracer` is enabled (null: off).
  void set_tracer(TraceRecorder* tracer);

 private:
  struct SubgroupState;
  // A rule with an exchange (update_rule.h) prepares every subgroup before updating it.
  enum class Phase { kPrepare, kUpdate };
  void enqueue_staged(SubgroupState& sg, size_t slot, Phase phase, UpdateStepStats& stats);
  void enqueue_device_update(SubgroupState& sg, float* state, Phase phase);
  // Every device subgroup's work of the phase, queued; every host subgroup's, done.
  void enqueue_device_work(Phase phase, UpdateStepStats& stats);
  void run_host_work(Phase phase, UpdateStepStats& stats);
  // The update phase's host work and the wait for all of the step's work: on the calling
  // thread, or on update_thread_ with overlap_forward.
  void finish_on_host(UpdateStepStats& stats);
  // sg's working parameters are final once sg.working_final is reached (recorded behind
  // their last write, on the stream that wrote them).
  void mark_working_final(SubgroupState& sg, Stream& stream);
  [[noreturn]] void fail_step(int64_t step, const Error& error);
  void synchronize_all();
  // Makes each of `streams` wait (on the device, not the host) for the work queued so
  // far on the producer stream; nothing without one.
  void wait_for_producer(std::initializer_list<Stream*> streams);
  // The reverse: later work on the producer stream waits for the work queued so far on
  // each of `streams` (at most kReleaseEvents); nothing without a producer.
  void release_to_producer(std::initializer_list<Stream*> streams);
  void send_gradients(SubgroupState& sg);
  // Before the step changes sg's state: waits for its snapshot copy, if one is pending.
  void wait_for_capture(SubgroupState& sg, UpdateStepStats& stats);
  // The subgroups in the order step() changes them: device work first, then the host's.
  std::vector<SubgroupState*> update_order() const;
  // The streamed capture's thread (begin_streamed_capture).
  void stream_capture(SnapshotPool& pool, const std::vector<SubgroupState*>& order);
  // sg's snapshot copies are queued (`recorded`: and sg.captured recorded behind them).
  void mark_capture_queued(SubgroupState& sg, bool recorded);
  // "sg 3 prefetch": names work in a trace; empty when not tracing.
  std::string label(const SubgroupState& sg, std::string_view what) const;
  size_t working_bytes() const;
  size_t grad_bytes() const;
  // The gradient of parameter `index` in device memory.
  const void* grad_at(size_t index) const;
  RuleArrays arrays(const SubgroupState& sg, float* state, const void* grads) const;
  // The working copy of parameter `index` in device memory.
  void* working_at(size_t index) const;
  ParamRange working_range() const { return *buffers_.working_range; }

  Device& device_;
  OffloadPlan plan_;
  std::unique_ptr<UpdateRule> rule_;
  size_t state_floats_;  // rule_->state_floats()
  DeviceBuffers buffers_;
  int64_t step_ = 0;
  bool failed_ = false;
  TraceRecorder* tracer_ = nullptr;
  UpdateStepStats pending_;    // what gradients_ready() queued before the step
  UpdateStepStats last_step_;  // what the last step() returned (nothing after a skip)

  DeviceAllocation host_state_;    // pinned: state blocks of host and staged subgroups
  DeviceAllocation host_grads_;    // pinned: gradients of host subgroups
  DeviceAllocation host_working_;  // pinned: 16-bit working copies of host subgroups
  DeviceAllocation device_state_;  // device: state blocks of resident subgroups
  DeviceAllocation staging_;       // device: staging_buffers x the largest subgroup's state
  std::unique_ptr<Stream> h2d_, d2h_, compute_;
  std::unique_ptr<Event> produced_;  // recorded on DeviceBuffers::producer
  static constexpr size_t kReleaseEvents = 3;
  std::vector<std::unique_ptr<Event>> released_;  // waited for on DeviceBuffers::producer
  std::vector<std::unique_ptr<Event>> slot_free_, slot_loaded_, slot_updated_;
  std::vector<std::unique_ptr<SubgroupState>> subgroups_;
  std::unique_ptr<Stream> capture_stream_;  // while a capture is in flight
  std::unique_ptr<Event> capture_landed_;   // recorded after a capture's last copy
  // A streamed capture: its thread, which tells the step through capture_queued_ when a
  // subgroup's copies are queued (SubgroupState::capture_queued, under capture_mutex_).
  std::thread capture_thread_;
  std::mutex capture_mutex_;
  std::condition_variable capture_queued_;
  std::exception_ptr capture_error_;  // what stopped the capture thread, for finish_capture
  // An update running on behind step() (overlap_forward): its thread, which tells
  // wait_for_parameters through working_marked_ when a subgroup's working parameters are
  // queued (SubgroupState::working_marked, under update_mutex_) and when it is done.
  bool update_in_flight_ = false;
  int64_t step_in_flight_ = 0;
  std::thread update_thread_;
  std::mutex update_mutex_;
  std::condition_variable working_marked_;
  bool update_done_ = false;         // under update_mutex_
  std::exception_ptr update_error_;  // what stopped the update thread, for finish_update
  Stopwatch in_flight_clock_;        // from step()'s return
  double update_done_ms_ = 0;        // on in_flight_clock_, under update_mutex_
  // The caller's waits for the update in flight, [begin, end) on in_flight_clock_: only
  // their parts before the update ended count (waking up late is not the update's time).
  std::vector<std::pair<double, double>> waits_;
};

// This rank's state arrays as `engine` holds them (the fp32 params first, then the rule's,
// OptimizerFamily::state_names), `num_params` floats each; partitions this rank does not
// hold are left zero.
std::vector<std::vector<float>> read_engine_state(UpdateEngine& engine, size_t num_params);

}  // namespace tandem
