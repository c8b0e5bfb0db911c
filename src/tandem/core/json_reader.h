// Reading a JSON document that a person wrote by hand: every mistake reported once, naming
// the dotted path of the key ("optimizer.params.lr"), what was found and what is allowed,
// with a "did you mean" for a near-miss key. No schema lives here: config/ declares what
// its keys are (config/train_config.cc) and reads them with these.
//
// Keys named "$schema", "comment" and "_comment" are accepted and ignored at any level, so
// that files can point at a JSON schema and carry notes (JSON has no comments).
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

#include "tandem/core/error.h"

namespace tandem {

// A list of allowed keys, in the order messages list them.
using JsonKeyNames = std::span<const std::string_view>;

bool is_ignored_json_key(std::string_view key);
std::string ascii_lower(std::string_view text);                             // "AdamW" -> "adamw"
std::string join_json_path(std::string_view prefix, std::string_view key);  // "a.b"
std::string join_key_names(JsonKeyNames keys);                              // "a, b, c"
// The allowed key nearest to `key`, or "" when none is near enough to be a likely typo (a
// third of the key's length, at least one edit, case-insensitive, a swap of neighbours one
// edit: "lrr" -> "lr", "warmup_steps" -> "warmup_num_steps"), or the one allowed key it
// begins ("train_micro_batch_size" -> "train_micro_batch_size_per_gpu").
std::string closest_key(std::string_view key, JsonKeyNames allowed);
// The value as the user wrote it, shortened, with its JSON type: "\"100\" (a string)".
std::string describe_json(const nlohmann::json& value);
// The shortest decimal that reads back as the same float ("0.95", not 0.949999988079071),
// so that a written file is both exact and readable.
nlohmann::json float_json(float f);

// Parses a file's text, refusing a key written twice in one object (nlohmann keeps the last
// silently; either was a mistake). Errors name the file, with the line:column of a syntax
// error, for editors that jump to file:line:col.
nlohmann::json read_json_file(const std::filesystem::path& path);

// A JSON object and its dotted path ("optimizer.params"), with a reader for each kind of
// field. Every reader leaves the field alone when the key is absent.
class JsonSection {
 public:
  JsonSection(const nlohmann::json* object, std::string path)
      : object_(object), path_(std::move(path)) {}

  // Refuses keys outside `allowed`. `child`/`child_keys` name a nested section whose keys
  // are sometimes written one level too high ("optimizer": {"lr": ...}). `refused` keys pass
  // (their readers refuse them, saying why) but are never offered as allowed.
  void check_keys(JsonKeyNames allowed, std::string_view child = {}, JsonKeyNames child_keys = {},
                  JsonKeyNames refused = {}) const;
  // The nested object at `key` (a section with no object when the key is absent).
  JsonSection section(std::string_view key) const;

  // An integer in [min, max]; 100.0 counts as 100, 100.5 does not. `description` replaces
  // the range's wording in messages ("0, 1, 2 or 3").
  template <typename Int>
  void read_int(std::string_view key, Int& out, int64_t min,
                int64_t max = std::numeric_limits<int64_t>::max(),
                std::string_view description = {}) const {
    if (const nlohmann::json* value = find(key))
      out =
          static_cast<Int>(int_value(*value, key, min, std::min(max, int_max<Int>()), description));
  }
  void read_uint64(std::string_view key, uint64_t& out) const;
  // A finite number accepted by `ok`; `wanted` says what `ok` accepts ("a number > 0").
  // For float fields the check applies to the value after rounding to float, so that 1e-50
  // (0 as a float) is refused as an eps and 1e39 (inf) as an lr.
  template <typename Real, typename Ok>
  void read_real(std::string_view key, Real& out, std::string_view wanted, Ok ok) const {
    if (const nlohmann::json* value = find(key))
      out = real_value<Real>(*value, path(key), wanted, ok);
  }
  void read_bool(std::string_view key, bool& out) const;
  // Returns the string read, or `out` as it was when the key is absent.
  std::string read_string(std::string_view key, std::string& out) const;
  // Reads "type" and checks it (case-insensitively) against the one supported value.
  void read_type(std::string_view supported) const;

  template <typename Real, typename Ok>
  static Real real_value(const nlohmann::json& value, const std::string& where,
                         std::string_view wanted, Ok ok) {
    if (!value.is_number()) fail(where, " must be ", wanted, ", got ", describe_json(value));
    const double d = value.get<double>();
    // Out-of-range double -> float conversion is undefined, so the range is checked first.
    if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<Real>::max())
      fail(where, " must be ", wanted, ", got ", value.dump());
    const Real v = static_cast<Real>(d);
    if (!ok(static_cast<double>(v))) fail(where, " must be ", wanted, ", got ", value.dump());
    return v;
  }

  const nlohmann::json* find(std::string_view key) const;
  std::string path(std::string_view key) const { return join_json_path(path_, key); }
  const std::string& path() const { return path_; }

 private:
  template <typename Int>
  static constexpr int64_t int_max() {
    return std::numeric_limits<Int>::max() > uint64_t(std::numeric_limits<int64_t>::max())
               ? std::numeric_limits<int64_t>::max()
               : static_cast<int64_t>(std::numeric_limits<Int>::max());
  }
  int64_t int_value(const nlohmann::json& value, std::string_view key, int64_t min, int64_t max,
                    std::string_view description) const;

  const nlohmann::json* object_;
  std::string path_;
};

}  // namespace tandem
