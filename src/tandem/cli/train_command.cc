#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tandem/cli/commands.h"
#include "tandem/comm/agreement.h"
#include "tandem/comm/communicator.h"
#include "tandem/comm/mpi_communicator.h"
#include "tandem/comm/mpi_launch.h"
#include "tandem/config/train_config.h"
#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/core/stop_signals.h"
#include "tandem/train/trainer.h"

namespace tandem::cli {
namespace {

struct Args {
  ConfigOptions config;
  std::string metrics;
  std::string resume;
  int64_t stop_at_step = 0;
  std::string trace;
  std::string trace_steps = "2-3";
  bool allow_inexact_resume = false;
  bool allow_host_overcommit = false;
};

// The command line's options for train(), checked.
TrainOptions train_options(const Args& args) {
  std::error_code ec;
  TANDEM_CHECK(args.metrics.empty() || !std::filesystem::is_directory(args.metrics, ec),
               "--metrics ", args.metrics, ": is a directory; name the file to write");
  TrainOptions options;
  options.resume = args.resume;
  // A resumed run goes on in its own directory unless told where with --set.
  options.continue_in_resumed_run = true;
  for (const std::string& o : args.config.overrides)
    if (o.rfind("train.output_dir=", 0) == 0) options.continue_in_resumed_run = false;
  options.allow_inexact_resume = args.allow_inexact_resume;
  options.allow_host_overcommit = args.allow_host_overcommit;
  options.metrics_path = args.metrics;
  options.stop_at_step = args.stop_at_step;
  options.trace_path = args.trace;
  const std::string& range = args.trace_steps;
  const size_t dash = range.find('-');
  try {
    options.trace_first_step = std::stoll(range.substr(0, dash));
    options.trace_last_step =
        dash == std::string::npos ? options.trace_first_step : std::stoll(range.substr(dash + 1));
  } catch (const std::exception&) {
    options.trace_first_step = 0;
  }
  TANDEM_CHECK(options.trace_first_step >= 1 && options.trace_last_step >= options.trace_first_step,
               "--trace-steps '", range, "' is not a step range; use FIRST-LAST, e.g. 2-3");
  return options;
}

}  // namespace

void register_train(CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a JSON run configuration");
  add_config_options(cmd, args->config,
                     "Override a config value, e.g. --set optimizer.params.lr=3e-4 (repeatable)");
  cmd->add_option("--metrics", args->metrics,
                  "Append one JSON object per step and per evaluation to this file");
  cmd->add_option("--resume", args->resume,
                  "Continue from a checkpoint (a checkpoint dir, a checkpoints dir or a run dir)");
  cmd->add_flag("--allow-inexact-resume", args->allow_inexact_resume,
                "Resume although the config or data differ from the checkpoint's run in what the "
                "numbers depend on (the continuation is then not bit-exact)");
  cmd->add_flag("--allow-host-overcommit", args->allow_host_overcommit,
                "Train although the plan takes more host memory than the machine has");
  cmd->add_option("--stop-at-step", args->stop_at_step,
                  "Stop (with a checkpoint) after this many steps; the schedule still spans "
                  "train.steps")
      ->check(non_negative_number());
  cmd->add_option("--trace", args->trace,
                  "Write a Chrome trace (Perfetto, chrome://tracing) of the steps in "
                  "--trace-steps: compute, host-to-device, device-to-host, CPU and device updates");
  cmd->add_option("--trace-steps", args->trace_steps, "Steps to trace, FIRST-LAST (1-based)");
  cmd->callback([args, &app] {
    // Under mpirun each process is one rank; otherwise a world of one, without MPI.
    const std::unique_ptr<Communicator> comm = make_world_communicator();
    // Ctrl-C, SIGTERM, SIGHUP: stop at the next step boundary with a checkpoint.
    const StopSignals signals;
    TrainResult result;
    try {
      // Every rank reads the same files as a rule, and stops with the others when it cannot.
      TrainConfig config;
      TrainOptions options;
      std::string error;
      try {
        config = args->config.load();
        options = train_options(*args);
      } catch (const Error& e) {
        error = e.what();
      }
      fail_together(*comm, error,
                    "another rank could not read its configuration (its error says why)");
      options.stop_requested = [] { return StopSignals::requested(); };
      result = train(config, options, *comm);
    } catch (const ErrorOnEveryRank& e) {
      if (comm->world_size() == 1) throw;
      // Every rank is here, in step: the job ends with a clean finalize, not MPI_Abort (whose
      // report would follow tandem's error). Rank 0 says its error, without naming itself when
      // every rank met the same one; another rank says its own only when it differs.
      const std::string& mine = e.message();
      const std::string prefix = rank_of_world(*comm);
      const std::string rank0 = broadcast_string(*comm, e.own() ? mine : "", 0);
      const bool same = !e.own() || mine == rank0;
      const bool all_same = all_ranks_ok(*comm, same);
      if (e.own() && (comm->rank() == 0 || !same)) {
        std::fprintf(stderr, "tandem: error: %s%s\n",
                     comm->rank() == 0 && all_same ? "" : prefix.c_str(), mine.c_str());
      }
      std::fflush(stderr);
      throw ExitStatus{1};
    } catch (const Error& e) {
      if (comm->world_size() == 1) throw;
      // The other ranks may be waiting for this one in a collective: stop them all.
      std::fprintf(stderr, "tandem: error: %s\n", e.what());
      std::fflush(stderr);
      comm->abort();
      throw;
    }
    if (result.stopped_by_signal != 0) {
      if (comm->rank() == 0) {
        // The same command, resuming: every option that shapes the run carried over, and the
        // program and the launcher (mpirun with its own options: the grace period's too) as
        // this run was started with.
        std::string resume =
            shell_word(app.get_name()) + " train --config " + shell_word(args->config.path);
        if (comm->world_size() > 1) resume = launcher_command(comm->world_size()) + " " + resume;
        for (const std::string& o : args->config.overrides) resume += " --set " + shell_word(o);
        if (!args->metrics.empty()) resume += " --metrics " + shell_word(args->metrics);
        if (args->stop_at_step > 0)
          resume += " --stop-at-step " + std::to_string(args->stop_at_step);
        if (args->allow_inexact_resume) resume += " --allow-inexact-resume";
        if (args->allow_host_overcommit) resume += " --allow-host-overcommit";
        resume += " --resume " + shell_word(result.output_dir.string());
        std::fprintf(stderr, "tandem: stopped by %s after step %ld; %s\ntandem: to continue: %s\n",
                     StopSignals::name(result.stopped_by_signal),
                     static_cast<long>(result.steps_done),
                     result.last_checkpoint.empty()
                         ? "no checkpoint was written"
                         : ("checkpoint " + result.last_checkpoint.string()).c_str(),
                     resume.c_str());
      }
      // The shell's convention for a process ended by a signal.
      throw ExitStatus{128 + result.stopped_by_signal};
    }
    if (comm->rank() != 0) return;
    if (result.steps.empty()) {  // a finished run resumed: it said so
      std::fprintf(stderr, "tandem: no steps to train; checkpoint %s\n",
                   result.last_checkpoint.c_str());
      return;
    }
    // The outcome on stdout, all of it: mpirun relays a rank's stdout and stderr separately,
    // so a header on one and its sample on the other could arrive in either order.
    std::fflush(stderr);
    std::printf("tandem: %ld steps, train loss %.4f", static_cast<long>(result.steps_done),
                result.last_train_loss);
    if (!std::isnan(result.last_val_loss)) std::printf(", val loss %.4f", result.last_val_loss);
    std::printf("; checkpoint %s\n", result.last_checkpoint.c_str());
    if (!result.sample.empty()) {
      std::printf("tandem: a sample from the model:\n%s\n", printable_text(result.sample).c_str());
    }
    std::fflush(stdout);
  });
}

}  // namespace tandem::cli
