// A key of a JSON object bound to a field of a struct, declared once: its name, how it is
// read (with core/json_reader.h's checks and messages) and how it is written back. A
// section's allowed keys, its reader and its writer all come from one list of these, so a
// key is never spelled twice (config/train_config.cc).
//
//   using Keys = JsonKeys<TrainLoopConfig>;
//   const std::vector<Keys::Key> loop = {
//       Keys::integer("steps", TANDEM_FIELD(steps), 1),
//       Keys::boolean("lazy_checkpoints", TANDEM_FIELD(lazy_checkpoints))};
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/core/enum_names.h"
#include "tandem/core/json_reader.h"

// A field of the struct a key is bound to: one generic lambda serves the reader (a mutable
// struct) and the writer (a const one). TANDEM_FIELD(train.steps).
#define TANDEM_FIELD(...) \
  [](auto& c) -> auto& { return c.__VA_ARGS__; }

namespace tandem {

template <typename Config>
struct JsonKey {
  std::string_view name;
  // Reads the key from its section into the struct; leaves the field alone when absent.
  std::function<void(const JsonSection&, Config&)> read;
  // The value to write; null: the key is not written for this struct.
  std::function<nlohmann::json(const Config&)> write;
  // Someone else's key (DeepSpeed's) read only to be refused with the reason: never listed
  // among the allowed keys.
  bool refused = false;
};

// The names of `keys` (or of the refused ones), in order, for JsonSection::check_keys.
template <typename Config>
std::vector<std::string_view> json_key_names(std::span<const JsonKey<Config>> keys,
                                             bool refused = false) {
  std::vector<std::string_view> names;
  for (const JsonKey<Config>& key : keys)
    if (key.refused == refused) names.push_back(key.name);
  return names;
}

// Refuses keys of `section` not in `keys`, then reads each, in the order of `keys`.
template <typename Config>
void read_json_keys(const JsonSection& section, std::span<const JsonKey<Config>> keys,
                    Config& config) {
  section.check_keys(json_key_names(keys), {}, {}, json_key_names(keys, true));
  for (const JsonKey<Config>& key : keys) key.read(section, config);
}

// Every key of `keys` written as an object (those whose writer gives null left out).
template <typename Config>
nlohmann::json write_json_keys(std::span<const JsonKey<Config>> keys, const Config& config) {
  nlohmann::json out = nlohmann::json::object();
  for (const JsonKey<Config>& key : keys)
    if (nlohmann::json value = key.write(config); !value.is_null())
      out[key.name] = std::move(value);
  return out;
}

// Makers of the usual kinds of key, each reading with JsonSection's checks.
template <typename Config>
struct JsonKeys {
  using Key = JsonKey<Config>;

  // An integer in [min, max] (`description` replaces the range's wording in messages).
  template <typename Field>
  static Key integer(std::string_view name, Field field, int64_t min,
                     int64_t max = std::numeric_limits<int64_t>::max(),
                     std::string description = {}) {
    return {
        name,
        [=](const JsonSection& s, Config& c) { s.read_int(name, field(c), min, max, description); },
        [=](const Config& c) { return nlohmann::json(field(c)); }};
  }
  // Any unsigned 64-bit integer (a seed).
  template <typename Field>
  static Key uint64(std::string_view name, Field field) {
    return {name, [=](const JsonSection& s, Config& c) { s.read_uint64(name, field(c)); },
            [=](const Config& c) { return nlohmann::json(field(c)); }};
  }
  // A finite number that `ok` accepts, `wanted` saying which; a float is written as the
  // shortest decimal that reads back as the same float.
  template <typename Field, typename Ok>
  static Key real(std::string_view name, Field field, std::string_view wanted, Ok ok) {
    return {name, [=](const JsonSection& s, Config& c) { s.read_real(name, field(c), wanted, ok); },
            [=](const Config& c) {
              const auto value = field(c);
              if constexpr (std::is_same_v<decltype(value), const float>) return float_json(value);
              return nlohmann::json(value);
            }};
  }
  template <typename Field>
  static Key boolean(std::string_view name, Field field) {
    return {name, [=](const JsonSection& s, Config& c) { s.read_bool(name, field(c)); },
            [=](const Config& c) { return nlohmann::json(field(c)); }};
  }
  template <typename Field>
  static Key text(std::string_view name, Field field, bool may_be_empty = true) {
    return {name,
            [=](const JsonSection& s, Config& c) {
              TANDEM_CHECK(!s.read_string(name, field(c)).empty() || may_be_empty, s.path(name),
                           " must not be empty");
              // A path with a NUL would be cut there by every system call (a directory made
              // under another name); no text here may hold one.
              TANDEM_CHECK(field(c).find('\0') == std::string::npos, s.path(name),
                           " holds a NUL byte (\\u0000), which no file name or setting may "
                           "hold; remove it");
            },
            [=](const Config& c) { return nlohmann::json(field(c)); }};
  }
  // One of an enum's names (core/enum_names.h), in any case.
  template <typename Field, typename Enum, size_t N>
  static Key choice(std::string_view name, Field field, const EnumName<Enum> (&names)[N]) {
    const EnumName<Enum>(*table)[N] = &names;
    return {
        name,
        [=](const JsonSection& s, Config& c) {
          const nlohmann::json* value = s.find(name);
          if (value == nullptr) return;
          const auto parsed =
              value->is_string() ? enum_from_name(*table, value->get<std::string>()) : std::nullopt;
          if (!parsed)
            fail(s.path(name), " must be one of: ", enum_names_list(*table), "; got ",
                 describe_json(*value));
          field(c) = *parsed;
        },
        [=](const Config& c) { return nlohmann::json(std::string(enum_name(*table, field(c)))); }};
  }
  // A nested object whose keys are `keys` (of the same struct).
  static Key section(std::string_view name, std::vector<Key> keys) {
    return {
        name,
        [=](const JsonSection& s, Config& c) { read_json_keys<Config>(s.section(name), keys, c); },
        [=](const Config& c) { return write_json_keys<Config>(keys, c); }};
  }
};

}  // namespace tandem
