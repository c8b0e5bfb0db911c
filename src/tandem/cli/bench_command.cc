#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tandem/bench/adamw_bench.h"
#include "tandem/bench/checkpoint_bench.h"
#include "tandem/bench/checkpoint_io_bench.h"
#include "tandem/bench/cuda/memcpy_peak.h"
#include "tandem/bench/demo_bench.h"
#include "tandem/bench/device_bench.h"
#include "tandem/bench/offload_bench.h"
#include "tandem/bench/versus_bench.h"
#include "tandem/bench/zero_bench.h"
#include "tandem/cli/commands.h"
#include "tandem/config/train_config.h"
#include "tandem/core/error.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/train/step_settings.h"
#include "tandem/train/trainer.h"

namespace tandem::cli {
namespace {

// A benchmark's result on stdout: one JSON object, or its text report.
template <typename Result, typename... TextArgs>
void print_result(const Result& result, bool json, const TextArgs&... text_args) {
  const std::string out = json ? result.to_json().dump() + "\n" : result.to_text(text_args...);
  std::fputs(out.c_str(), stdout);
}

}  // namespace

namespace {

// More threads than CPUs run, but share them: the figures then mean less.
void warn_if_more_threads_than_cpus(int threads) {
  const unsigned cpus = std::thread::hardware_concurrency();
  if (cpus > 0 && threads > static_cast<int>(cpus))
    std::fprintf(stderr,
                 "tandem: warning: --threads %d is more than this machine's %u CPUs; the threads "
                 "share them, and the figures mean less\n",
                 threads, cpus);
}

}  // namespace

void register_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Measure kernels against the machine's limits");
  bench->require_subcommand(1);
  register_bench_plan(*bench);

  struct AdamWArgs {
    double params = 1e8;
    std::string grad_dtype = "fp32";
    std::string param_dtype = "bf16";
    int threads = 0;
    std::string target;
    int repetitions = 5;
    bool json = false;
    std::string device = "cpu";
  };
  auto args = std::make_shared<AdamWArgs>();
  CLI::App* adamw = bench->add_subcommand(
      "adamw", "CPU AdamW throughput and its ratio to a STREAM triad measured in the same run");
  adamw->add_option("--params", args->params, "Parameters to update (e.g. 1e8)")
      ->check(CLI::Range(1.0, 1e11));
  adamw->add_option("--grad-dtype", args->grad_dtype, "Gradient type")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  adamw
      ->add_option("--param-dtype", args->param_dtype,
                   "16-bit working copy written in the same pass")
      ->check(CLI::IsMember({"bf16", "fp16", "none"}));
  adamw->add_option("--threads", args->threads, "Threads (default: one per CPU)")
      ->check(CLI::Range(0, 4096));
  adamw->add_option("--target", args->target, "SIMD kernel (default: the best this CPU has)")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512"}));
  adamw->add_option("--repetitions", args->repetitions, "Timed passes (best is reported)")
      ->check(CLI::Range(1, 1000));
  adamw->add_flag("--json", args->json, "Print one JSON object");
  adamw
      ->add_option("--device", args->device,
                   "cpu: the CPU kernel vs a triad; cuda: the GPU kernel vs a device copy")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  adamw->callback([args] {
    if (args->device == "cuda") {
      auto device = make_cuda_device({});
      const DeviceAdamWBenchResult r =
          run_device_adamw_bench(*device, static_cast<size_t>(args->params), args->repetitions);
      print_result(r, args->json, device->name());
      return;
    }
    AdamWBenchOptions options;
    options.params = static_cast<size_t>(args->params);
    options.grad_dtype = args->grad_dtype == "bf16" ? GradDType::kBF16 : GradDType::kF32;
    options.working_dtype = args->param_dtype == "none"   ? WorkingDType::kNone
                            : args->param_dtype == "fp16" ? WorkingDType::kF16
                                                          : WorkingDType::kBF16;
    options.threads = args->threads;
    warn_if_more_threads_than_cpus(args->threads);
    if (!args->target.empty()) options.target = *parse_simd_target(args->target);
    options.repetitions = args->repetitions;
    const AdamWBenchResult result = run_adamw_bench(options);
    print_result(result, args->json);
  });

  struct DemoArgs {
    int threads = 0;
    std::string target;
    int repetitions = 3;
    bool json = false;
  };
  auto demo_args = std::make_shared<DemoArgs>();
  CLI::App* demo = bench->add_subcommand(
      "demo", "DeMo step throughput on the CPU, and its DCT's GFLOP/s next to OpenBLAS sgemm");
  demo->add_option("--threads", demo_args->threads, "Threads (default: one per CPU)")
      ->check(CLI::Range(0, 4096));
  demo->add_option("--target", demo_args->target, "SIMD kernel (default: the best this CPU has)")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512"}));
  demo->add_option("--repetitions", demo_args->repetitions, "Timed passes (best is reported)")
      ->check(CLI::Range(1, 1000));
  demo->add_flag("--json", demo_args->json, "Print one JSON object");
  demo->callback([demo_args] {
    DemoBenchOptions options;
    options.threads = demo_args->threads;
    warn_if_more_threads_than_cpus(demo_args->threads);
    if (!demo_args->target.empty()) options.target = *parse_simd_target(demo_args->target);
    options.repetitions = demo_args->repetitions;
    const DemoBenchResult result = run_demo_bench(options);
    print_result(result, demo_args->json);
  });

  struct CheckpointArgs {
    std::string config;
    std::vector<std::string> overrides;
    int64_t steps = 30;
    int64_t interval = 5;
    int64_t pool_mb = 0;
    bool json = false;
  };
  auto checkpoint_args = std::make_shared<CheckpointArgs>();
  CLI::App* checkpoint = bench->add_subcommand(
      "checkpoint",
      "Synchronous, lazy and streamed (through a bounded pool) checkpoints on the same run: "
      "each checkpoint's stall as a fraction of a step, and its flush time");
  checkpoint->add_option("--config", checkpoint_args->config, "Run configuration (JSON)")
      ->required();
  checkpoint->add_option("--set", checkpoint_args->overrides,
                         "Override a config value (repeatable)");
  checkpoint->add_option("--steps", checkpoint_args->steps, "Steps per mode")
      ->check(CLI::Range(int64_t{2}, int64_t{1000000}));
  checkpoint->add_option("--interval", checkpoint_args->interval, "A checkpoint every N steps")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  checkpoint
      ->add_option("--pool-mb", checkpoint_args->pool_mb,
                   "The streamed mode's pool in MiB (default: an eighth of the state)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  checkpoint->add_flag("--json", checkpoint_args->json, "Print one JSON object");
  checkpoint->callback([checkpoint_args] {
    CheckpointBenchOptions options;
    options.config = load_train_config(checkpoint_args->config, checkpoint_args->overrides);
    options.steps = checkpoint_args->steps;
    options.interval = checkpoint_args->interval;
    options.pool_mb = checkpoint_args->pool_mb;
    const CheckpointBenchResult result = run_checkpoint_bench(options);
    print_result(result, checkpoint_args->json);
  });

  struct CheckpointIoArgs {
    std::string config;
    std::vector<std::string> overrides;
    std::string dir;
    int rounds = 5;
    bool json = false;
  };
  auto io_args = std::make_shared<CheckpointIoArgs>();
  CLI::App* checkpoint_io = bench->add_subcommand(
      "checkpoint-io",
      "A checkpoint's synchronous save and the resume's read of it, alone (no training): "
      "milliseconds and GB/s of each");
  checkpoint_io->add_option("--config", io_args->config, "Run configuration (JSON)")->required();
  checkpoint_io->add_option("--set", io_args->overrides, "Override a config value (repeatable)");
  checkpoint_io->add_option("--dir", io_args->dir,
                            "Where to write (an existing directory on the disk to measure; "
                            "default: the system's temporary directory)");
  checkpoint_io->add_option("--rounds", io_args->rounds, "Saves and loads, alternating")
      ->check(CLI::Range(1, 1000));
  checkpoint_io->add_flag("--json", io_args->json, "Print one JSON object");
  checkpoint_io->callback([io_args] {
    CheckpointIoBenchOptions options;
    options.config = load_train_config(io_args->config, io_args->overrides);
    options.dir = io_args->dir;
    options.rounds = io_args->rounds;
    print_result(run_checkpoint_io_bench(options), io_args->json);
  });

  struct PcieArgs {
    double bytes = 256.0 * (1 << 20);
    int repetitions = 5;
    bool json = false;
  };
  auto pcie_args = std::make_shared<PcieArgs>();
  CLI::App* pcie = bench->add_subcommand(
      "pcie", "Pinned host-to-device, device-to-host and both-at-once copy bandwidth (GPU)");
  pcie->add_option("--bytes", pcie_args->bytes, "Bytes per copy")->check(CLI::Range(1.0, 1e11));
  pcie->add_option("--repetitions", pcie_args->repetitions, "Timed copies (best is reported)")
      ->check(CLI::Range(1, 1000));
  pcie->add_flag("--json", pcie_args->json, "Print one JSON object");
  pcie->callback([pcie_args] {
    auto device = make_cuda_device({});
    const auto bytes = static_cast<size_t>(pcie_args->bytes);
    PcieBenchResult r = run_pcie_bench(*device, bytes, pcie_args->repetitions);
    const MemcpyPeak peak = measure_memcpy_peak(*device, bytes, pcie_args->repetitions);
    r.peak_h2d_gb_per_s = peak.h2d_gb_per_s;
    r.peak_d2h_gb_per_s = peak.d2h_gb_per_s;
    print_result(r, pcie_args->json, device->name());
  });

  struct StepArgs {
    std::string config;
    std::vector<std::string> overrides;
    int steps = 10;
    int warmup = 3;
    bool json = false;
  };
  auto step_args = std::make_shared<StepArgs>();
  CLI::App* step = bench->add_subcommand(
      "step", "Training-step throughput: tokens/s and per-phase ms for a config and schedule");
  step->add_option("--config", step_args->config, "Run configuration (JSON)")->required();
  step->add_option("--set", step_args->overrides, "Override a config value (repeatable)");
  step->add_option("--steps", step_args->steps, "Timed steps (the median is reported)")
      ->check(CLI::Range(1, 100000));
  step->add_option("--warmup", step_args->warmup, "Steps run first and not timed")
      ->check(CLI::Range(0, 100000));
  step->add_flag("--json", step_args->json, "Print one JSON object");
  step->callback([step_args] {
    TrainConfig config = with_chosen_step_settings(
        load_train_config(step_args->config, step_args->overrides), step_args->json ? nullptr : stderr);
    config.train.steps = step_args->warmup + step_args->steps;
    config.train.eval_interval = 0;
    config.train.sample_bytes = 0;
    TrainOptions options;
    options.save_checkpoints = false;
    options.show_progress = false;
    const TrainResult result = train(config, options);
    // Medians over the timed steps: robust to a noisy neighbour on a shared machine.
    const StepMedians m = step_medians(result, step_args->warmup);
    const nlohmann::json report = {
        {"tokens_per_s", m.tokens_per_s},
        {"ms", m.ms},
        {"forward_ms", m.forward_ms},
        {"backward_ms", m.backward_ms},
        {"update_ms", m.update_ms},
        {"predicted_update_ms", result.plan.prediction.seconds * 1e3},
        {"params", config.model.num_parameters()},
        {"batch", config.micro_batch_size},
        {"seq_len", config.seq_len()},
        {"gradient_accumulation_steps", config.gradient_accumulation_steps},
        {"schedule", std::string(update_schedule_name(config.offload.schedule))},
        {"device", std::string(device_kind_name(config.device.type))},
        {"device_bytes", result.plan.total.device},
        {"pinned_host_bytes", result.plan.total.pinned_host},
        {"timed_steps", step_args->steps},
        {"state_digest", result.state_digest},
        {"losses", [&] {
           std::vector<double> losses;
           for (const StepRecord& r : result.steps) losses.push_back(r.loss);
           return losses;
         }()}};
    if (step_args->json) {
      std::printf("%s\n", report.dump().c_str());
      return;
    }
    std::printf(
        "tandem bench step: %ld parameters, %d x %d tokens x %d micro-batches, schedule %s, "
        "%s device\n  %.0f tokens/s, %.1f ms/step (forward %.1f, backward %.1f, update %.1f); "
        "medians of %d steps after %d warm-up\n",
        static_cast<long>(config.model.num_parameters()), config.micro_batch_size, config.seq_len(),
        config.gradient_accumulation_steps,
        std::string(update_schedule_name(config.offload.schedule)).c_str(),
        std::string(device_kind_name(config.device.type)).c_str(),
        report["tokens_per_s"].get<double>(), report["ms"].get<double>(),
        report["forward_ms"].get<double>(), report["backward_ms"].get<double>(),
        report["update_ms"].get<double>(), step_args->steps, step_args->warmup);
  });

  struct OffloadArgs {
    std::string config;
    std::vector<std::string> overrides;
    std::vector<std::string> schedules = {"cpu", "interleave", "auto"};
    int steps = 10;
    int warmup = 3;
    bool json = false;
  };
  auto offload_args = std::make_shared<OffloadArgs>();
  CLI::App* offload = bench->add_subcommand(
      "offload",
      "Update schedules side by side on one config, in one process: tokens/s, per-phase ms, "
      "predicted / measured update time, memory per tier, and one state digest for all");
  offload->add_option("--config", offload_args->config, "Run configuration (JSON)")->required();
  offload->add_option("--set", offload_args->overrides, "Override a config value (repeatable)");
  offload
      ->add_option("--schedules", offload_args->schedules,
                   "Comma-separated offload_optimizer.schedule values, run in this order")
      ->delimiter(',')
      ->check(CLI::IsMember({"device", "cpu", "ratio", "interleave", "auto"}));
  offload->add_option("--steps", offload_args->steps, "Timed steps per schedule (median)")
      ->check(CLI::Range(1, 100000));
  offload->add_option("--warmup", offload_args->warmup, "Steps run first and not timed")
      ->check(CLI::Range(0, 100000));
  offload->add_flag("--json", offload_args->json, "Print one JSON object");
  offload->callback([offload_args] {
    OffloadBenchOptions options;
    options.config = load_train_config(offload_args->config, offload_args->overrides);
    options.schedules.clear();
    for (const std::string& name : offload_args->schedules)
      for (UpdateSchedule s :
           {UpdateSchedule::kDevice, UpdateSchedule::kCpu, UpdateSchedule::kRatio,
            UpdateSchedule::kInterleave, UpdateSchedule::kAuto})
        if (update_schedule_name(s) == name) options.schedules.push_back(s);
    options.steps = offload_args->steps;
    options.warmup = offload_args->warmup;
    options.progress = [](const std::string& what) {
      std::fprintf(stderr, "tandem bench offload: %s\n", what.c_str());
    };
    const OffloadBenchResult result = run_offload_bench(options);
    print_result(result, offload_args->json);
    if (result.schedules_run() == 0)
      fail(
          "tandem bench offload: no schedule fits the device (each one's reason is above); "
          "raise device.memory_gb or lower the micro-batch or sequence length");
    // Schedules that disagree on the bits are a bug, whatever the speed.
    if (!result.digests_agree())
      fail(
          "tandem bench offload: the schedules ended with different state digests; every "
          "schedule must compute the same bits (run test_schedules, and report this)");
  });

  struct VersusArgs {
    std::string config;
    std::vector<std::string> overrides;
    std::vector<std::string> versus;
    int rounds = 3;
    int steps = 10;
    int warmup = 3;
    bool json = false;
  };
  auto versus_args = std::make_shared<VersusArgs>();
  CLI::App* versus = bench->add_subcommand(
      "versus",
      "A config against the same config with settings changed (--versus KEY=VALUE), trained in "
      "alternating rounds in one process: the ratio of their step times, and their state digests");
  versus->add_option("--config", versus_args->config, "Run configuration (JSON)")->required();
  versus->add_option("--set", versus_args->overrides, "Override a config value on both sides");
  versus
      ->add_option("--versus", versus_args->versus,
                   "A setting the variant changes (repeatable), e.g. "
                   "activation_checkpointing.interval=1")
      ->required();
  versus->add_option("--rounds", versus_args->rounds, "Runs of each side, alternating")
      ->check(CLI::Range(1, 1000));
  versus->add_option("--steps", versus_args->steps, "Timed steps per run (the median is taken)")
      ->check(CLI::Range(1, 100000));
  versus->add_option("--warmup", versus_args->warmup, "Steps run first in each run, not timed")
      ->check(CLI::Range(0, 100000));
  versus->add_flag("--json", versus_args->json, "Print one JSON object");
  versus->callback([versus_args] {
    VersusBenchOptions options;
    options.base = load_train_config(versus_args->config, versus_args->overrides);
    std::vector<std::string> variant_overrides = versus_args->overrides;
    variant_overrides.insert(variant_overrides.end(), versus_args->versus.begin(),
                             versus_args->versus.end());
    options.variant = load_train_config(versus_args->config, variant_overrides);
    options.changes = versus_args->versus;
    options.rounds = versus_args->rounds;
    options.steps = versus_args->steps;
    options.warmup = versus_args->warmup;
    options.progress = [](const std::string& what) {
      std::fprintf(stderr, "tandem bench versus: %s\n", what.c_str());
    };
    const VersusBenchResult result = run_versus_bench(options);
    if (versus_args->json)
      std::printf("%s\n", result.to_json().dump().c_str());
    else
      std::fputs(result.to_text().c_str(), stdout);
    if (!result.digests_agree)
      fail(
          "tandem bench versus: the two sides ended with different state digests; the settings "
          "it compares must not change a number (run the tests, and report this)");
  });

  struct ZeroArgs {
    std::string config;
    std::vector<std::string> overrides;
    std::vector<int> world_sizes = {1, 2, 4};
    std::vector<int> stages = {0, 1, 2, 3};
    int steps = 5;
    int warmup = 2;
    bool json = false;
  };
  auto zero_args = std::make_shared<ZeroArgs>();
  CLI::App* zero = bench->add_subcommand(
      "zero",
      "Each ZeRO stage at each world size (ranks launched with mpirun): s/step, bytes per rank "
      "per tier, bytes per rank per step");
  zero->add_option("--config", zero_args->config, "Run configuration (JSON)")->required();
  zero->add_option("--set", zero_args->overrides, "Override a config value (repeatable)");
  zero->add_option("--world-sizes", zero_args->world_sizes, "Comma-separated, e.g. 1,2,4")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  zero->add_option("--stages", zero_args->stages, "Comma-separated ZeRO stages (0-3)")
      ->delimiter(',')
      ->check(CLI::Range(0, 3));
  zero->add_option("--steps", zero_args->steps, "Timed steps per run (the median is reported)")
      ->check(CLI::Range(1, 100000));
  zero->add_option("--warmup", zero_args->warmup, "Steps run first and not timed")
      ->check(CLI::Range(0, 100000));
  zero->add_flag("--json", zero_args->json, "Print a JSON array, one object per run");
  zero->callback([zero_args] {
    // Refuse a bad config here, once, rather than in every launched run.
    load_train_config(zero_args->config, zero_args->overrides);
    ZeroBenchOptions options;
    options.config = zero_args->config;
    options.overrides = zero_args->overrides;
    options.world_sizes = zero_args->world_sizes;
    options.stages = zero_args->stages;
    options.steps = zero_args->steps;
    options.warmup = zero_args->warmup;
    options.tandem_binary = std::filesystem::read_symlink("/proc/self/exe");
    options.progress = [](const std::string& what) {
      std::fprintf(stderr, "tandem bench zero: %s\n", what.c_str());
    };
    const std::vector<ZeroBenchCase> cases = run_zero_bench(options);
    if (zero_args->json) {
      std::printf("%s\n", zero_bench_json(cases).dump().c_str());
      return;
    }
    std::fputs(zero_bench_table(cases).c_str(), stdout);
  });
}

}  // namespace tandem::cli
