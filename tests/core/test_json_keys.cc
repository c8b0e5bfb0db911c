// What a config is read with (core/json_keys.h, core/json_reader.h, core/enum_names.h): a
// table of keys reads a struct, checks each value and names a mistake with its dotted path,
// and writes the struct back; an enum's names come from one table.

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/config/train_config.h"
#include "tandem/core/cpu_features.h"
#include "tandem/core/enum_names.h"
#include "tandem/core/json_keys.h"
#include "tandem/device/device.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/offload/update_types.h"
#include "tandem/optim/demo/demo_wire.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using testing::error_of;

enum class Color { kRed, kDarkBlue };
constexpr EnumName<Color> kColorNames[] = {{Color::kRed, "red"}, {Color::kDarkBlue, "dark_blue"}};

struct Settings {
  int64_t count = 3;
  float rate = 0.5f;
  bool on = false;
  std::string name = "x";
  Color color = Color::kRed;
  struct {
    int depth = 1;
  } inner;
};

std::vector<JsonKey<Settings>> settings_keys() {
  using Keys = JsonKeys<Settings>;
  return {Keys::integer("count", TANDEM_FIELD(count), 1, 10),
          Keys::real("rate", TANDEM_FIELD(rate), "a number > 0", [](double v) { return v > 0; }),
          Keys::boolean("on", TANDEM_FIELD(on)),
          Keys::text("name", TANDEM_FIELD(name), /*may_be_empty=*/false),
          Keys::choice("color", TANDEM_FIELD(color), kColorNames),
          Keys::section("inner", {Keys::integer("depth", TANDEM_FIELD(inner.depth), 0)})};
}

Settings read(const json& object) {
  Settings settings;
  read_json_keys<Settings>(JsonSection(&object, "settings"), settings_keys(), settings);
  return settings;
}

TEST(EnumNames, TheNameTheValueAndTheListComeFromOneTable) {
  EXPECT_EQ(enum_name(kColorNames, Color::kDarkBlue), "dark_blue");
  EXPECT_EQ(enum_name(kColorNames, static_cast<Color>(7)), "?");
  EXPECT_EQ(enum_from_name(kColorNames, "Dark_BLUE"), Color::kDarkBlue);
  EXPECT_EQ(enum_from_name(kColorNames, "blue"), std::nullopt);
  EXPECT_EQ(enum_from_name(kColorNames, "red "), std::nullopt);
  EXPECT_EQ(enum_names_list(kColorNames), "\"red\", \"dark_blue\"");
}

// Every table the config reads: each value's name reads back as that value, and no two
// values share a name.
template <typename Enum, size_t N>
void expect_round_trip(const EnumName<Enum> (&names)[N]) {
  for (const EnumName<Enum>& entry : names) {
    EXPECT_EQ(enum_from_name(names, entry.name), entry.value) << entry.name;
    EXPECT_EQ(enum_name(names, entry.value), entry.name);
  }
}

TEST(EnumNames, EveryTableReadsBackItsOwnNames) {
  expect_round_trip(kUpdateScheduleNames);
  expect_round_trip(kUpdateSiteNames);
  expect_round_trip(kDeviceKindNames);
  expect_round_trip(kDemoValueFormatNames);
  expect_round_trip(kCheckpointFailureNames);
  expect_round_trip(kModelTypeNames);
  expect_round_trip(kDTypeNames);
  expect_round_trip(kMemorySpaceNames);
  expect_round_trip(kSimdTargetNames);
  expect_round_trip(kStorageDTypeNames);
  expect_round_trip(kGradDTypeNames);
  expect_round_trip(kWorkingDTypeNames);
}

// A file format's names are read as written: safetensors says "F32", never "f32".
TEST(EnumNames, AFormatsNamesAreReadInTheirOwnCaseOnly) {
  EXPECT_EQ(parse_dtype("BF16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("bf16"), std::nullopt);
  EXPECT_EQ(parse_simd_target("avx2"), SimdTarget::kAvx2);
  EXPECT_EQ(parse_simd_target("AVX2"), std::nullopt);
  EXPECT_EQ(enum_from_exact_name(kColorNames, "dark_blue"), Color::kDarkBlue);
  EXPECT_EQ(enum_from_exact_name(kColorNames, "Dark_Blue"), std::nullopt);
}

TEST(JsonKeys, ATableReadsEveryKindOfKeyAndWritesItBack) {
  const Settings read_back = read({{"count", 7},
                                   {"rate", 0.125},
                                   {"on", true},
                                   {"name", "y"},
                                   {"color", "DARK_BLUE"},
                                   {"inner", {{"depth", 4}}}});
  EXPECT_EQ(read_back.count, 7);
  EXPECT_EQ(read_back.rate, 0.125f);
  EXPECT_TRUE(read_back.on);
  EXPECT_EQ(read_back.name, "y");
  EXPECT_EQ(read_back.color, Color::kDarkBlue);
  EXPECT_EQ(read_back.inner.depth, 4);

  const json written = write_json_keys<Settings>(settings_keys(), read_back);
  EXPECT_EQ(written, json({{"count", 7},
                           {"rate", 0.125},
                           {"on", true},
                           {"name", "y"},
                           {"color", "dark_blue"},
                           {"inner", {{"depth", 4}}}}));

  // Absent keys leave the defaults; a float is written as the shortest decimal that reads
  // back as the same float.
  const Settings defaults = read(json::object());
  EXPECT_EQ(defaults.count, 3);
  EXPECT_EQ(defaults.inner.depth, 1);
  Settings tenth;
  tenth.rate = 0.1f;
  EXPECT_EQ(write_json_keys<Settings>(settings_keys(), tenth)["rate"].dump(), "0.1");
}

TEST(JsonKeys, AMistakeIsNamedWithItsPathWhatWasFoundAndWhatIsAllowed) {
  EXPECT_CONTAINS(error_of([] {
                    read({{"cuont", 1}});
                  }),
                  "unknown key 'settings.cuont'; did you mean 'count'?");
  EXPECT_CONTAINS(error_of([] {
                    read({{"inner", {{"depht", 1}}}});
                  }),
                  "unknown key 'settings.inner.depht'; did you mean 'depth'?");
  EXPECT_CONTAINS(error_of([] {
                    read({{"count", 11}});
                  }),
                  "settings.count must be an integer in [1, 10], got 11");
  EXPECT_CONTAINS(error_of([] { read({{"count", "7"}}); }), "got \"7\" (a string)");
  EXPECT_CONTAINS(error_of([] { read({{"rate", 1e39}}); }), "settings.rate must be a number > 0");
  EXPECT_CONTAINS(
      error_of([] {
        read({{"color", "green"}});
      }),
      "settings.color must be one of: \"red\", \"dark_blue\"; got \"green\" (a string)");
  EXPECT_CONTAINS(error_of([] { read({{"name", ""}}); }), "settings.name must not be empty");
  EXPECT_CONTAINS(error_of([] { read({{"inner", 3}}); }), "settings.inner must be an object");
}

TEST(JsonReader, AFileNamesARepeatedKeyAndTheLineAndColumnOfASyntaxError) {
  const testing::ScratchDir dir("json_reader");
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return dir / name;
  };
  const auto twice = write("twice.json", "{\"a\": {\"b\": 1, \"b\": 2}}");
  EXPECT_CONTAINS(error_of([&] { read_json_file(twice); }),
                  twice.string() + ": duplicate key 'a.b'");
  const auto broken = write("broken.json", "{\n  \"a\": 1,\n}");
  EXPECT_CONTAINS(error_of([&] { read_json_file(broken); }),
                  broken.string() + ":3:1: JSON syntax error");
  EXPECT_EQ(read_json_file(write("good.json", "{\"a\": [1, 2]}")), json({{"a", {1, 2}}}));
}

}  // namespace
}  // namespace tandem
