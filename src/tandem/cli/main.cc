// The `tandem` command.
//   tandem train    --config FILE [--set key=value ...] [--metrics FILE] [--resume DIR]
//   tandem sample   --checkpoint DIR [--prompt TEXT] [--bytes N] [--temperature T] [--seed S]
//   tandem tokenize --input TEXT_FILE --output SHARD.bin
//   tandem logits   --checkpoint DIR --tokens IDS --output FILE.safetensors
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
    // A first word that is no command is named as such, with the commands there are.
    std::string commands;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      commands += (commands.empty() ? "" : ", ") + sub->get_name();
      known = known || (argc > 1 && sub->get_name() == argv[1]);
    }
    if (argc > 1 && argv[1][0] != '-' && !known) {
      const std::string what = std::string("unknown command '") + argv[1] + "'; the commands are " +
                               commands + " (tandem --help says more)";
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
