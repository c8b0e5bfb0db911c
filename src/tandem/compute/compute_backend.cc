#include "tandem/compute/compute_backend.h"

namespace tandem {

size_t storage_dtype_bytes(StorageDType dtype) {
  return dtype == StorageDType::kBF16 ? sizeof(Bf16) : sizeof(float);
}

}  // namespace tandem
