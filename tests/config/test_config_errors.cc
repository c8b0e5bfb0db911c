// Numbers and shapes a config cannot hold are named with the file and the key, as every
// other config error is (issue 44): a number beyond a double's range, and a top level that is
// not an object when --set applies to it. Both were "internal error"s before.
#include <gtest/gtest.h>

#include <string>

#include "support/test_util.h"
#include "tandem/config/train_config.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem {
namespace {

TEST(ConfigErrors, ANumberOutOfRangeNamesTheFileAndTheKey) {
  testing::ScratchDir dir("config_errors");
  const auto path = dir / "c.json";
  write_file_atomic(path, std::string(R"({"data": {"train_path": "x.txt"},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e400}}})"));
  const std::string error = testing::error_of([&] { load_train_config(path, {}); });
  EXPECT_CONTAINS(error, path.string());
  EXPECT_CONTAINS(error, "optimizer.params.lr is out of range ('1e400')");
  EXPECT_CONTAINS(error, "write a smaller number");
}

TEST(ConfigErrors, ATopLevelThatIsNotAnObjectIsNamedWithOverrides) {
  testing::ScratchDir dir("config_errors_top");
  for (const std::string& text : {std::string("[1, 2]"), std::string("\"a string\"")}) {
    const auto path = dir / "c.json";
    write_file_atomic(path, text);
    const std::string with_set =
        testing::error_of([&] { load_train_config(path, {"train.steps=3"}); });
    EXPECT_CONTAINS(with_set, path.string());
    EXPECT_CONTAINS(with_set, "top level must be an object");
    EXPECT_CONTAINS(testing::error_of([&] { load_train_config(path, {}); }),
                    "must be a JSON object");
  }
}

}  // namespace
}  // namespace tandem
