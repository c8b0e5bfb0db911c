#include "tandem/core/json_reader.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tandem/core/file_io.h"

namespace tandem {

using json = nlohmann::json;

namespace {

// Edit distance, case-insensitive, a swap of two neighbours one edit (optimal string
// alignment): "LR" and "lrr" are both one slip from "lr", "stpes" one from "steps".
size_t edit_distance(std::string_view a_in, std::string_view b_in) {
  const std::string a = ascii_lower(a_in), b = ascii_lower(b_in);
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string int_description(int64_t min, int64_t max) {
  if (max == std::numeric_limits<int64_t>::max() || max == std::numeric_limits<int>::max()) {
    if (min == 1) return "a positive integer";
    if (min == 0) return "a non-negative integer";
    return cat("an integer >= ", min);
  }
  return cat("an integer in [", min, ", ", max, "]");
}

// The text of the object keys seen so far on the way down, to name a repeated one.
struct ObjectLevel {
  std::set<std::string> keys;
  std::string path;
  std::string last_key;
};

// `last_key`: the path of the last key read, for an error the parser meets in its value.
json parse_json_refusing_duplicates(const std::string& text, std::string& last_key) {
  std::vector<ObjectLevel> stack;
  const auto callback = [&stack, &last_key](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: {
        std::string path;
        if (!stack.empty()) path = join_json_path(stack.back().path, stack.back().last_key);
        stack.push_back({{}, std::move(path), {}});
        break;
      }
      case json::parse_event_t::key: {
        const std::string key = parsed.get<std::string>();
        if (!stack.empty()) {
          if (!stack.back().keys.insert(key).second)
            fail("duplicate key '", join_json_path(stack.back().path, key), "'");
          stack.back().last_key = key;
          last_key = join_json_path(stack.back().path, key);
        }
        break;
      }
      case json::parse_event_t::object_end:
        if (!stack.empty()) stack.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  return json::parse(text, callback);
}

// "line:column" of a byte offset, both 1-based.
std::string line_column(const std::string& text, size_t byte) {
  byte = std::min(byte, text.size());
  size_t line = 1, column = 1;
  for (size_t i = 0; i < byte; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return cat(line, ':', column);
}

}  // namespace

std::string ascii_lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool is_ignored_json_key(std::string_view key) {
  return key == "$schema" || key == "comment" || key == "_comment";
}

std::string join_json_path(std::string_view prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : cat(prefix, '.', key);
}

std::string join_key_names(JsonKeyNames keys) {
  std::string out;
  for (std::string_view key : keys) {
    if (!out.empty()) out += ", ";
    out += key;
  }
  return out;
}

std::string closest_key(std::string_view key, JsonKeyNames allowed) {
  // A key cut short (train_micro_batch_size) means the one it begins, when only one does,
  // though a shorter one be fewer edits away (train_batch_size).
  if (key.size() >= 4) {
    std::string extended;
    bool several = false;
    for (std::string_view candidate : allowed) {
      if (candidate.size() <= key.size() || !ascii_lower(candidate).starts_with(ascii_lower(key)))
        continue;
      several = several || !extended.empty();
      extended = candidate;
    }
    if (!extended.empty() && !several) return extended;
  }
  const size_t limit = std::max<size_t>(1, key.size() / 3);
  std::string best;
  size_t best_distance = limit + 1;
  for (std::string_view candidate : allowed) {
    const size_t d = edit_distance(key, candidate);
    if (d < best_distance) best_distance = d, best = candidate;
  }
  return best;
}

std::string describe_json(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  switch (value.type()) {
    case json::value_t::string:
      return text + " (a string)";
    case json::value_t::boolean:
      return text + " (a boolean)";
    case json::value_t::array:
      return text + " (an array)";
    case json::value_t::object:
      return text + " (an object)";
    default:
      return text;
  }
}

// Read back as a double and rounded to float by a reader; that double rounding is checked,
// with the exact double value as the fallback.
json float_json(float f) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), f);
  const double shortest = std::strtod(std::string(buffer, result.ptr).c_str(), nullptr);
  if (static_cast<float>(shortest) == f) return shortest;
  return static_cast<double>(f);
}

json read_json_file(const std::filesystem::path& path) {
  const std::string text = read_file_text(path);
  std::string last_key;
  try {
    return parse_json_refusing_duplicates(text, last_key);
  } catch (const json::out_of_range& e) {
    // A number beyond a double's range (1e400): the parser names the number, not where.
    std::string number = e.what();
    if (const size_t quote = number.find('\''); quote != std::string::npos)
      number = number.substr(quote);
    fail(path.string(), ": ", last_key.empty() ? "a number" : cat("the value of ", last_key),
         " is out of range (", number,
         "): numbers must be finite doubles, at most about 1.8e308 in magnitude; write a smaller "
         "number");
  } catch (const json::parse_error& e) {
    // e.byte is 1-based and points at the character that broke the parse. nlohmann's own
    // message repeats a position in its own wording; keep only the explanation after it.
    std::string why = e.what();
    if (const size_t colon = why.find(": ");
        why.rfind("[json.exception", 0) == 0 && colon != std::string::npos)
      why = why.substr(colon + 2);
    fail(path.string(), ":", line_column(text, e.byte > 0 ? e.byte - 1 : 0),
         ": JSON syntax error: ", why);
  } catch (const Error& e) {
    fail(path.string(), ": ", e.what());
  }
}

void JsonSection::check_keys(JsonKeyNames allowed, std::string_view child, JsonKeyNames child_keys,
                             JsonKeyNames refused) const {
  if (object_ == nullptr) return;
  for (const auto& [key, value] : object_->items()) {
    if (is_ignored_json_key(key) ||
        std::find(allowed.begin(), allowed.end(), key) != allowed.end() ||
        std::find(refused.begin(), refused.end(), key) != refused.end())
      continue;
    std::string hint;
    if (std::find(child_keys.begin(), child_keys.end(), key) != child_keys.end()) {
      hint = cat("; did you mean '", join_json_path(join_json_path(path_, child), key), "'?");
    } else if (std::string near = closest_key(key, allowed); !near.empty()) {
      hint = cat("; did you mean '", near, "'?");
    }
    fail("unknown key '", join_json_path(path_, key), "'", hint.empty() ? ";" : hint,
         " allowed keys: ", join_key_names(allowed));
  }
}

JsonSection JsonSection::section(std::string_view key) const {
  const json* value = find(key);
  if (value != nullptr && !value->is_object())
    fail(path(key), " must be an object, got ", describe_json(*value));
  return JsonSection(value, path(key));
}

int64_t JsonSection::int_value(const json& value, std::string_view key, int64_t min, int64_t max,
                               std::string_view description) const {
  const std::string wanted =
      description.empty() ? int_description(min, max) : std::string(description);
  int64_t v = 0;
  bool beyond_int64 = false;  // above any max: said by the range check below, once
  if (value.is_number_integer() && !value.is_number_unsigned()) {
    v = value.get<int64_t>();
  } else if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    beyond_int64 = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    v = beyond_int64 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(u);
  } else if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::trunc(d) != d) fail(path(key), " must be ", wanted, ", got ", value.dump());
    // 2^63 is exactly representable; anything at or beyond it cannot be an int64 (the
    // conversion would be undefined): it is above any max, which the range check says.
    if (d < -9223372036854775808.0) fail(path(key), " must be ", wanted, ", got ", value.dump());
    beyond_int64 = d >= 9223372036854775808.0;
    v = beyond_int64 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(d);
  } else {
    fail(path(key), " must be ", wanted, ", got ", describe_json(value));
  }
  if (beyond_int64 || v < min || v > max) {
    // "a positive integer" does not say why 3000000000 is refused for an int field.
    const bool max_unsaid = wanted.find(std::to_string(max)) == std::string::npos;
    fail(path(key), " must be ", wanted,
         max_unsaid && (beyond_int64 || v > max) ? cat(" (at most ", max, ")") : "", ", got ",
         value.dump());
  }
  return v;
}

void JsonSection::read_uint64(std::string_view key, uint64_t& out) const {
  const json* value = find(key);
  if (value == nullptr) return;
  constexpr const char* kWanted = " must be an unsigned 64-bit integer (0 to 2^64-1), got ";
  if (value->is_number_unsigned()) {
    out = value->get<uint64_t>();
  } else if (value->is_number_integer()) {
    // Parsed text gives non-negative integers as unsigned, but JSON built in code
    // (nlohmann::json{{"seed", 7}}) holds them as signed.
    const int64_t v = value->get<int64_t>();
    if (v < 0) fail(path(key), kWanted, value->dump());
    out = static_cast<uint64_t>(v);
  } else if (value->is_number_float()) {
    const double d = value->get<double>();
    if (!(std::trunc(d) == d && d >= 0 && d < 18446744073709551616.0))
      fail(path(key), kWanted, value->dump());
    out = static_cast<uint64_t>(d);
  } else {
    fail(path(key), kWanted, describe_json(*value));
  }
}

void JsonSection::read_bool(std::string_view key, bool& out) const {
  const json* value = find(key);
  if (value == nullptr) return;
  if (!value->is_boolean()) fail(path(key), " must be true or false, got ", describe_json(*value));
  out = value->get<bool>();
}

std::string JsonSection::read_string(std::string_view key, std::string& out) const {
  const json* value = find(key);
  if (value == nullptr) return out;
  if (!value->is_string()) fail(path(key), " must be a string, got ", describe_json(*value));
  out = value->get<std::string>();
  return out;
}

void JsonSection::read_type(std::string_view supported) const {
  const json* value = find("type");
  if (value == nullptr) return;
  if (!value->is_string() || ascii_lower(value->get<std::string>()) != ascii_lower(supported))
    fail(path("type"), " must be one of: \"", supported, "\"; got ", describe_json(*value));
}

const json* JsonSection::find(std::string_view key) const {
  if (object_ == nullptr) return nullptr;
  const auto it = object_->find(key);
  return it == object_->end() ? nullptr : &*it;
}

}  // namespace tandem
