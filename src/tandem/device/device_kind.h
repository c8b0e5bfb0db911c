// Which kind of device a run trains on, apart from the device layer itself so that a
// config can name it without including device.h.
#pragma once

#include <string_view>

#include "tandem/core/enum_names.h"

namespace tandem {

// Which variant of a DeviceKernel a device runs (and so which memory a kernel's own
// workspace must live in).
enum class DeviceKind {
  kHostOnly,  // device/cpu: DeviceKernel::on_host
  kCuda,      // DeviceKernel::on_cuda
};

// The config's word for it: "cpu" (the host-only device), "cuda".
inline constexpr EnumName<DeviceKind> kDeviceKindNames[] = {{DeviceKind::kHostOnly, "cpu"},
                                                            {DeviceKind::kCuda, "cuda"}};
constexpr std::string_view device_kind_name(DeviceKind kind) {
  return enum_name(kDeviceKindNames, kind);
}

}  // namespace tandem
