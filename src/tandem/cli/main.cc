// The `tandem` command: one subcommand per file of cli/ (train, plan, sample, tokenize,
// logits, bench), registered below, and bench's own one per file of cli/bench/;
// `tandem COMMAND --help` lists each one's options.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "tandem/cli/commands.h"
#include "tandem/core/error.h"

namespace {

// One line on stderr. On a terminal a live progress line may be open: end it first.
void report(const char* kind, const char* what) {
  std::fflush(stdout);
  if (::isatty(fileno(stderr))) std::fputc('\n', stderr);
  std::fprintf(stderr, "tandem: %s: %s\n", kind, what);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "tandem: trains GPT-style language models whose training state does not fit in GPU "
      "memory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tandem ") + TANDEM_VERSION);
  tandem::cli::register_train(app);
  tandem::cli::register_sample(app);
  tandem::cli::register_tokenize(app);
  tandem::cli::register_bench(app);
  tandem::cli::register_plan(app);
  tandem::cli::register_logits(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A word where a command is expected that is none is named as such, with the commands
    // there are ("tandem foo", "tandem bench foo").
    CLI::App* at = &app;
    std::string words;  // the commands matched so far: "", "bench"
    int word = 1;
    for (; word < argc && argv[word][0] != '-'; word++) {
      CLI::App* next = nullptr;
      for (CLI::App* sub : at->get_subcommands({}))
        if (sub->get_name() == argv[word]) next = sub;
      if (next == nullptr) break;
      at = next;
      words += (words.empty() ? "" : " ") + std::string(argv[word]);
    }
    if (word < argc && argv[word][0] != '-' && !at->get_subcommands({}).empty()) {
      std::string commands;
      for (const CLI::App* sub : at->get_subcommands({}))
        commands += (commands.empty() ? "" : ", ") + sub->get_name();
      const std::string tandem = words.empty() ? "tandem" : "tandem " + words;
      const std::string what = "unknown command '" + (words.empty() ? "" : words + " ") +
                               argv[word] + "'; the commands " +
                               (words.empty() ? "" : "of '" + tandem + "' ") + "are " + commands +
                               " (" + tandem + " --help says more)";
      report("error", what.c_str());
      return 1;
    }
    return app.exit(e);
  } catch (const tandem::cli::ExitStatus& status) {
    return status.code;
  } catch (const tandem::Error& e) {
    report("error", e.what());
    return 1;
  } catch (const std::exception& e) {
    report("internal error", e.what());
    return 2;
  }
  return 0;
}
