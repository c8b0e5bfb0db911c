// An enum's names, declared once as a table beside the enum: the name of a value, the
// value of a name (case-insensitively, as a config writes it) and the list for messages
// all come from that table, instead of a switch and a chain of comparisons per enum.
//
//   enum class UpdateSite { kHost, kDeviceResident, kDeviceStaged };
//   inline constexpr EnumName<UpdateSite> kUpdateSiteNames[] = {
//       {UpdateSite::kHost, "host"}, ...};
//   enum_name(kUpdateSiteNames, site)  // "host"
//
// C++17, so that CUDA sources may include the headers that use it.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

template <typename Enum>
struct EnumName {
  Enum value;
  std::string_view name;
};

// The name of `value`; "?" for a value the table lacks (a cast from an integer).
template <typename Enum, size_t N>
constexpr std::string_view enum_name(const EnumName<Enum> (&names)[N], Enum value) {
  for (const EnumName<Enum>& entry : names)
    if (entry.value == value) return entry.name;
  return "?";
}

// The value named `text`, ignoring ASCII case ("AdamW", "adamw"); nullopt when none is.
template <typename Enum, size_t N>
std::optional<Enum> enum_from_name(const EnumName<Enum> (&names)[N], std::string_view text) {
  const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
  for (const EnumName<Enum>& entry : names) {
    if (entry.name.size() != text.size()) continue;
    bool same = true;
    for (size_t i = 0; i < text.size() && same; ++i) same = lower(entry.name[i]) == lower(text[i]);
    if (same) return entry.value;
  }
  return std::nullopt;
}

// The same, in the case the table gives (a file format's names: safetensors' "F32").
template <typename Enum, size_t N>
std::optional<Enum> enum_from_exact_name(const EnumName<Enum> (&names)[N], std::string_view text) {
  for (const EnumName<Enum>& entry : names)
    if (entry.name == text) return entry.value;
  return std::nullopt;
}

// The names for a message, each quoted, `separator` between them:
// "\"device\", \"cpu\", \"ratio\"".
template <typename Enum, size_t N>
std::string enum_names_list(const EnumName<Enum> (&names)[N], std::string_view separator = ", ") {
  std::string out;
  for (const EnumName<Enum>& entry : names) {
    if (!out.empty()) out += separator;
    out += '"';
    out += entry.name;
    out += '"';
  }
  return out;
}

}  // namespace tandem
