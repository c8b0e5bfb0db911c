#include "tandem/compute/compute_backend.h"

namespace tandem {

std::string_view storage_dtype_name(StorageDType dtype) {
  return dtype == StorageDType::kBF16 ? "bf16" : "fp32";
}

size_t storage_dtype_bytes(StorageDType dtype) {
  return dtype == StorageDType::kBF16 ? sizeof(Bf16) : sizeof(float);
}

}  // namespace tandem
