// Subcommands of the `tandem` command; each registers its options and a callback.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <vector>

#include "tandem/core/enum_names.h"

namespace tandem {
struct TrainConfig;
}

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

// The run configuration a command reads: --config FILE (required) and --set KEY=VALUE
// overrides, declared alike by every command that takes them (cli/config_options.cc).
struct ConfigOptions {
  std::string path;
  std::vector<std::string> overrides;
  // load_train_config(path, overrides): the file read, the overrides applied, checked.
  TrainConfig load() const;
};
void add_config_options(CLI::App* cmd, ConfigOptions& options,
                        const std::string& set_help = "Override a config value (repeatable)");

// The names of an enum's table (core/enum_names.h), or those of `only`, in its order.
template <typename Enum, size_t N>
std::vector<std::string> enum_choices(const EnumName<Enum> (&names)[N],
                                      std::initializer_list<Enum> only = {}) {
  std::vector<std::string> choices;
  if (only.size() == 0)
    for (const EnumName<Enum>& entry : names) choices.emplace_back(entry.name);
  for (Enum value : only) choices.emplace_back(enum_name(names, value));
  return choices;
}

// An option naming one of an enum's values: CLI11 checks the word against the table's
// names (enum_choices) and `value` (an Enum or a std::optional<Enum>) is set from it.
template <typename Target, typename Enum, size_t N>
CLI::Option* add_enum_option(CLI::App* cmd, const std::string& name, Target& value,
                             const EnumName<Enum> (&names)[N], const std::string& help,
                             std::initializer_list<Enum> only = {}) {
  return cmd
      ->add_option_function<std::string>(
          name, [&value, &names](const std::string& word) { value = *enum_from_name(names, word); },
          help)
      ->check(CLI::IsMember(enum_choices(names, only)));
}

// The same for a list (repeatable, or comma-separated with ->delimiter(',')): `values`
// becomes the values named, in their order.
template <typename Enum, size_t N>
CLI::Option* add_enum_list_option(CLI::App* cmd, const std::string& name, std::vector<Enum>& values,
                                  const EnumName<Enum> (&names)[N], const std::string& help) {
  return cmd
      ->add_option_function<std::vector<std::string>>(
          name,
          [&values, &names](const std::vector<std::string>& words) {
            values.clear();
            for (const std::string& word : words) values.push_back(*enum_from_name(names, word));
          },
          help)
      ->check(CLI::IsMember(enum_choices(names)));
}

void register_train(CLI::App& app);
void register_sample(CLI::App& app);
void register_tokenize(CLI::App& app);
// Its subcommands are in cli/bench/, one per file.
void register_bench(CLI::App& app);
void register_plan(CLI::App& app);
void register_logits(CLI::App& app);

}  // namespace tandem::cli
