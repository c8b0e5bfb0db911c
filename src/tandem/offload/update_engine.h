// The update engine: one optimizer step over the subgroups of an OffloadPlan, each
// updated at its site (host CPU, device-resident, or staged through the device), with
// copies and device work on streams overlapped with the CPU updates.
//
// Every site computes exactly adamw_reference's operations, so the parameters and
// optimizer state after a step are bit-identical whatever the schedule.
//
// State layout: each offloaded subgroup keeps [params | m | v] (3 x S floats) in one
// contiguous pinned-host block, so prefetch and write-back are one copy each: a failed
// copy leaves a subgroup either entirely old or entirely new, never half-updated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include "tandem/core/thread_pool.h"
#include "tandem/device/device.h"
#include "tandem/model/param_layout.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/optim/adamw_reference.h"
#include "tandem/optim/cpu_adamw.h"

namespace tandem {

struct UpdateStepStats {
  double ms = 0;
  size_t h2d_bytes = 0;  // host-to-device bytes queued this step (backward included)
  size_t d2h_bytes = 0;  // device-to-host bytes queued this step (backward included)
  // CPU-updated subgroups whose gradients started moving to the host during backward.
  size_t early_gradient_subgroups = 0;
};

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
    std::optional<ParamRange> working_range;
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
  UpdateEngine(Device& device, ThreadPool& pool, const ParamLayout& layout, OffloadPlan plan,
               const AdamWHyper& hyper, DeviceBuffers buffers);
  ~UpdateEngine();
  UpdateEngine(const UpdateEngine&) = delete;
  UpdateEngine& operator=(const UpdateEngine&) = delete;

  const OffloadPlan& plan() const { return plan_; }
  int64_t step_count() const { return step_; }

  // Loads fp32 params, m, v (host, flat layout order) and the step count, and writes
  // the working parameters (those of DeviceBuffers::working_range).
  void load_state(const float* params, const float* m, const float* v, int64_t step);
  // Copies the fp32 params, m, v out into host arrays in flat layout order (also after
  // a failed step, to inspect what each subgroup holds).
  void read_state(float* params, float* m, float* v);

  // One AdamW step with learning rate lr and gradient scale grad_scale (clipping), the
  // gradients in DeviceBuffers::grads being complete. On failure throws tandem::Error
  // saying that training cannot continue; the engine then refuses further steps.
  UpdateStepStats step(float lr, float grad_scale);

  // Tells the engine that gradients [begin, end) of the coming step are final (called
  // from backward, see Gpt::GradientsReady; with a producer stream, final once the work
  // queued on it so far is done): CPU-updated subgroups whose gradients are all final
  // start copying them to pinned host memory now, overlapped with the rest of
  // backward. Ranges of one step must not overlap.
  void gradients_ready(size_t begin, size_t end);

  // Records CPU updates on lane "cpu update" and the device's work on its stream lanes
  // while `tracer` is enabled (null: off).
  void set_tracer(TraceRecorder* tracer);

 private:
  struct SubgroupState;
  void enqueue_staged(SubgroupState& sg, size_t slot, const AdamWStepScalars& decay,
                      const AdamWStepScalars& no_decay, UpdateStepStats& stats);
  void enqueue_device_update(SubgroupState& sg, float* state, const AdamWStepScalars& decay,
                             const AdamWStepScalars& no_decay);
  void synchronize_all();
  // Makes each of `streams` wait (on the device, not the host) for the work queued so
  // far on the producer stream; nothing without one.
  void wait_for_producer(std::initializer_list<Stream*> streams);
  // The reverse: later work on the producer stream waits for the work queued so far on
  // each of `streams` (at most kReleaseEvents); nothing without a producer.
  void release_to_producer(std::initializer_list<Stream*> streams);
  void send_gradients(SubgroupState& sg);
  // "sg 3 prefetch": names work in a trace; empty when not tracing.
  std::string label(const SubgroupState& sg, const char* what) const;
  size_t working_bytes() const;
  size_t grad_bytes() const;
  // The gradient of parameter `index` in device memory.
  const void* grad_at(size_t index) const;
  AdamWArrays arrays(float* state, size_t size, const void* grads) const;
  // The working copy of parameter `index` in device memory.
  void* working_at(size_t index) const;
  ParamRange working_range() const { return *buffers_.working_range; }

  Device& device_;
  ThreadPool& pool_;
  CpuAdamW cpu_kernel_;
  OffloadPlan plan_;
  AdamWHyper hyper_;
  DeviceBuffers buffers_;
  int64_t step_ = 0;
  bool failed_ = false;
  TraceRecorder* tracer_ = nullptr;
  UpdateStepStats pending_;  // what gradients_ready() queued before the step

  DeviceAllocation host_state_;    // pinned: [p|m|v] blocks of host and staged subgroups
  DeviceAllocation host_grads_;    // pinned: gradients of host subgroups
  DeviceAllocation host_working_;  // pinned: 16-bit working copies of host subgroups
  DeviceAllocation device_state_;  // device: [p|m|v] blocks of resident subgroups
  DeviceAllocation staging_;       // device: staging_buffers x [p|m|v] of the largest subgroup
  std::unique_ptr<Stream> h2d_, d2h_, compute_;
  std::unique_ptr<Event> produced_;  // recorded on DeviceBuffers::producer
  static constexpr size_t kReleaseEvents = 3;
  std::vector<std::unique_ptr<Event>> released_;  // waited for on DeviceBuffers::producer
  std::vector<std::unique_ptr<Event>> slot_free_, slot_loaded_, slot_updated_;
  std::vector<std::unique_ptr<SubgroupState>> subgroups_;
};

}  // namespace tandem
