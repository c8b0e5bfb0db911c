#include "tandem/ckpt/resume_check.h"

#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/optim/optimizer_family.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {

// Every leaf of `json` as "a.b.c" -> its JSON text.
void flatten(const nlohmann::json& json, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  if (json.is_object()) {
    for (const auto& [key, value] : json.items())
      flatten(value, prefix.empty() ? key : prefix + "." + key, out);
    return;
  }
  out[prefix] = json.dump();
}

// A value for the message: floats as the config gives them (7 significant digits).
std::string shown(const std::string& dumped) {
  try {
    const nlohmann::json value = nlohmann::json::parse(dumped);
    if (value.is_number_float()) {
      char text[32];
      std::snprintf(text, sizeof text, "%.7g", value.get<double>());
      return text;
    }
  } catch (const nlohmann::json::exception&) {
  }
  return dumped;
}

// The config keys whose values the numbers depend on (prefixes end with '.').
bool changes_the_numbers(const std::string& key) {
  static const char* const kKeys[] = {
      "model.",
      "optimizer.",
      "scheduler.",
      // Not "demo.": its one key, replica_check_interval, says how often the ranks prove
      // their replicas agree, which changes no number.
      "train_micro_batch_size_per_gpu",
      "gradient_clipping",
      "bf16.",
      "train.seed",
  };
  for (const char* k : kKeys) {
    const std::string wanted = k;
    if (wanted.back() == '.' ? key.rfind(wanted, 0) == 0 : key == wanted) return true;
  }
  return false;
}

}  // namespace

std::vector<ResumeMismatch> resume_mismatches(const TrainingState& then, const TrainConfig& now,
                                              const RunData& data) {
  std::vector<ResumeMismatch> out;
  std::map<std::string, std::string> a, b;
  flatten(to_json(then.config), "", a);
  flatten(to_json(now), "", b);
  for (const auto& [key, value] : b) {
    if (!changes_the_numbers(key)) continue;
    const auto it = a.find(key);
    const std::string old_value = it == a.end() ? "(not set)" : it->second;
    if (old_value != value) out.push_back({key, shown(old_value), shown(value)});
  }
  for (const auto& [key, value] : a)
    if (changes_the_numbers(key) && b.count(key) == 0)
      out.push_back({key, shown(value), "(not set)"});
  if (then.config.seq_len() != now.seq_len())
    out.push_back(
        {"train.seq_len", std::to_string(then.config.seq_len()), std::to_string(now.seq_len())});
  // N ranks give the bits of one rank accumulating N micro-batches: their product matters.
  const int then_world = then.world_size > 0 ? then.world_size : data.world_size;
  const int64_t then_micro = int64_t{then_world} * then.config.gradient_accumulation_steps;
  const int64_t now_micro = int64_t{data.world_size} * now.gradient_accumulation_steps;
  if (then_micro != now_micro)
    out.push_back(
        {"micro-batches per step (ranks x gradient_accumulation_steps)",
         cat(then_micro, " (", then_world, " x ", then.config.gradient_accumulation_steps, ")"),
         cat(now_micro, " (", data.world_size, " x ", now.gradient_accumulation_steps, ")")});
  if (!then.train_tokens_xxh3.empty()) {
    if (then.train_tokens_xxh3 != data.train_tokens_xxh3 || then.train_tokens != data.train_tokens)
      out.push_back(
          {cat("the training tokens (data.train_path, data.val_path, ", "data.val_fraction)"),
           cat(then.train_tokens, " tokens, XXH3 ", then.train_tokens_xxh3, " from ",
               then.config.data.train_path),
           cat(data.train_tokens, " tokens, XXH3 ", data.train_tokens_xxh3, " from ",
               now.data.train_path)});
  } else if (then.config.data.train_path != now.data.train_path) {
    out.push_back({"data.train_path", then.config.data.train_path, now.data.train_path});
  }
  return out;
}

std::string describe(const std::vector<ResumeMismatch>& mismatches) {
  std::string text;
  for (const ResumeMismatch& m : mismatches)
    text += cat(text.empty() ? "" : "; ", m.key, ": the checkpoint has ", m.checkpoint,
                ", this run ", m.now);
  return text;
}

std::optional<fs::path> run_directory_of(const fs::path& resume) {
  std::error_code ec;
  const fs::path path = fs::weakly_canonical(resume, ec);
  if (ec) return std::nullopt;
  if (fs::is_regular_file(path / "checkpoints" / "latest", ec) ||
      fs::is_directory(path / "checkpoints", ec))
    return path;
  // A checkpoints directory, or a checkpoint inside one.
  for (fs::path dir : {path, path.parent_path()})
    if (dir.filename() == "checkpoints") return dir.parent_path();
  return std::nullopt;
}

std::vector<std::string> check_resumable(const fs::path& path, const TrainingState& state,
                                         const TrainConfig& now, const RunData& data,
                                         bool allow_inexact) {
  const std::string diff = describe_model_difference(state.config.model, now.model);
  TANDEM_CHECK(diff.empty(), path.string(), ": the checkpoint's model differs from the config (",
               diff, "); resume with the config the run started with");
  TANDEM_CHECK(state.config.optimizer.type == now.optimizer.type, path.string(),
               ": optimizer.type: the checkpoint was written with ",
               optimizer_type_name(state.config.optimizer.type), ", the config says ",
               optimizer_type_name(now.optimizer.type),
               "; resume with the optimizer the run started with, or start a new run");
  TANDEM_CHECK(state.step <= now.train.steps, path.string(), ": the checkpoint is at step ",
               state.step, ", beyond train.steps = ", now.train.steps,
               "; raise train.steps to continue");
  // State every rank keeps its own (DeMo's) exists for the world size that wrote it only:
  // no flag can make up the others'.
  const int then_ranks = state.world_size;
  TANDEM_CHECK(!optimizer_family(state.config.optimizer.type).state_per_rank || then_ranks == 0 ||
                   then_ranks == data.world_size,
               path.string(), ": the checkpoint holds the ",
               optimizer_type_name(state.config.optimizer.type), " state of ",
               then_ranks == 1 ? std::string("one rank") : cat("each of ", then_ranks, " ranks"),
               " (every rank keeps its own); resume it with ", then_ranks,
               then_ranks == 1 ? " rank" : " ranks", ", not ", data.world_size);
  std::vector<std::string> notes;
  // Everything bit-exact continuation depends on, or the user's word that it may differ.
  const std::vector<ResumeMismatch> mismatches = resume_mismatches(state, now, data);
  if (!mismatches.empty()) {
    TANDEM_CHECK(allow_inexact, path.string(),
                 ": this run differs from the checkpoint's in what the numbers depend on (",
                 describe(mismatches),
                 "); resume with the run's own config and data, or pass --allow-inexact-resume "
                 "to go on anyway without bit-exact continuation");
    notes.push_back(
        cat("tandem: resuming without bit-exact continuation (", describe(mismatches), ")"));
  }
  if (state.config.train.steps != now.train.steps)
    notes.push_back(cat("tandem: train.steps is ", now.train.steps, " (the checkpoint's run had ",
                        state.config.train.steps, "): the learning-rate schedule now spans ",
                        now.train.steps, " steps"));
  return notes;
}

}  // namespace tandem
