// Human-readable quantities for messages and reports.
#pragma once

#include <cstddef>
#include <string>

namespace tandem {

// "512 bytes", "1.50 KiB", "3.25 GiB": binary units, two decimals past bytes.
std::string format_bytes(size_t bytes);

// "12.3": `decimals` digits after the point.
std::string format_fixed(double value, int decimals);

}  // namespace tandem
