// The subcommands of `tandem bench`, one per file of cli/bench/ (listed in bench.cc's
// table), and what they share.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <thread>

#include "tandem/cli/commands.h"

namespace tandem::cli {

void register_bench_plan(CLI::App& bench);           // plan.cc
void register_bench_adamw(CLI::App& bench);          // adamw.cc
void register_bench_demo(CLI::App& bench);           // demo.cc
void register_bench_checkpoint(CLI::App& bench);     // checkpoint.cc
void register_bench_checkpoint_io(CLI::App& bench);  // checkpoint_io.cc
void register_bench_pcie(CLI::App& bench);           // pcie.cc
void register_bench_step(CLI::App& bench);           // step.cc
void register_bench_offload(CLI::App& bench);        // offload.cc
void register_bench_versus(CLI::App& bench);         // versus.cc
void register_bench_zero(CLI::App& bench);           // zero.cc

// A benchmark's result on stdout: one JSON object, or its text report.
template <typename Result, typename... TextArgs>
void print_result(const Result& result, bool json, const TextArgs&... text_args) {
  const std::string out = json ? result.to_json().dump() + "\n" : result.to_text(text_args...);
  std::fputs(out.c_str(), stdout);
}

// More threads than CPUs run, but share them: the figures then mean less.
inline void warn_if_more_threads_than_cpus(int threads) {
  const unsigned cpus = std::thread::hardware_concurrency();
  if (cpus > 0 && threads > static_cast<int>(cpus))
    std::fprintf(stderr,
                 "tandem: warning: --threads %d is more than this machine's %u CPUs; the threads "
                 "share them, and the figures mean less\n",
                 threads, cpus);
}

// A progress line on stderr, "tandem bench NAME: what".
inline auto progress_to_stderr(const char* name) {
  return [name](const std::string& what) {
    std::fprintf(stderr, "tandem bench %s: %s\n", name, what.c_str());
  };
}

}  // namespace tandem::cli
