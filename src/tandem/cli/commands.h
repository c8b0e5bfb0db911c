// Subcommands of the `tandem` command; each registers its options and a callback.
#pragma once

#include <CLI/CLI.hpp>

namespace tandem::cli {

// Thrown by a subcommand that ends with a status of its own (after unwinding, so that
// communicators and files close properly); main returns `code`.
struct ExitStatus {
  int code = 0;
};

// Validators whose messages say what is wanted ("must be a number > 0, got 0") rather
// than CLI11's range with the largest double spelled out.
CLI::Validator positive_number();
CLI::Validator non_negative_number();

void register_train(CLI::App& app);
void register_sample(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_bench(CLI::App& app);
// Its `plan` subcommand (cli/bench_plan_command.cc).
void register_bench_plan(CLI::App& bench);
void register_plan(CLI::App& app);
void register_logits(CLI::App& app);

}  // namespace tandem::cli
