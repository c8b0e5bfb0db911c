#include <string>

#include "tandem/cli/commands.h"

namespace tandem::cli {

namespace {

CLI::Validator number_above(double bound, bool inclusive, const std::string& wanted) {
  return CLI::Validator(
      [bound, inclusive, wanted](std::string& value) -> std::string {
        double x = 0;
        size_t used = 0;
        try {
          x = std::stod(value, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        const bool ok = used == value.size() && used > 0 && (inclusive ? x >= bound : x > bound);
        return ok ? std::string() : "must be " + wanted + ", got " + value;
      },
      wanted);
}

}  // namespace

CLI::Validator positive_number() { return number_above(0, false, "a number > 0"); }
CLI::Validator non_negative_number() { return number_above(0, true, "a number >= 0"); }

}  // namespace tandem::cli
