#include "tandem/train/preflight.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "tandem/comm/agreement.h"
#include "tandem/comm/communicator.h"
#include "tandem/config/memory_plan.h"
#include "tandem/core/checksum.h"
#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/data/dataset.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace fs = std::filesystem;

void check_free_space(const fs::path& dir, uint64_t needed, const std::string& what) {
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  if (ec) return;  // a filesystem that cannot say: the writes will tell
  TANDEM_CHECK(space.available >= needed, dir.string(), ": ", format_bytes(space.available),
               " free, but ", what, " takes ", format_bytes(needed),
               "; free some space or choose another train.output_dir");
}

void check_writable_file(const fs::path& path, const std::string& option) {
  std::error_code ec;
  if (path.has_parent_path()) {
    fs::create_directories(path.parent_path(), ec);
    if (ec) fail(option, " ", path.string(), ": cannot create its directory (", ec.message(), ")");
  }
  TANDEM_CHECK(!fs::is_directory(path, ec), option, " ", path.string(),
               ": is a directory; name a file");
  const bool existed = fs::exists(path, ec);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) fail(option, " ", path.string(), ": cannot write (", std::strerror(errno), ")");
  ::close(fd);
  if (!existed) fs::remove(path, ec);
}

void check_ranks_agree(Communicator& comm, const TrainConfig& config, const TokenSplit& data,
                       const TrainOptions& options) {
  nlohmann::json mine = to_json(config);
  // Ranks stopping at different steps would leave one waiting for the others.
  mine["options"] = {{"resume", options.resume.string()},
                     {"stop_at_step", options.stop_at_step},
                     {"stop_on_signals", static_cast<bool>(options.stop_requested)}};
  mine["data"]["train_tokens_xxh3"] =
      checksum_hex(checksum64(data.train.data(), data.train.size() * sizeof(int32_t)));
  mine["data"]["val_tokens_xxh3"] =
      checksum_hex(checksum64(data.val.data(), data.val.size() * sizeof(int32_t)));
  require_same_on_every_rank(comm, mine, "configuration or data",
                             "start every rank with the same --config, --set, --resume, "
                             "--stop-at-step and data files");
}

void check_plan_fits_host(const TrainingMemoryPlan& plan, bool allow_overcommit,
                          Communicator& comm) {
  const bool host_ok = plan.host_fits() || allow_overcommit;
  fail_together(comm,
                host_ok ? std::string()
                        : cat("the plan takes ", format_bytes(plan.host_bytes_needed()),
                              " of host memory (pinned ", format_bytes(plan.total.pinned_host),
                              ", host ", format_bytes(plan.total.host),
                              plan.device_is_host
                                  ? cat(", the cpu device's ", format_bytes(plan.total.device))
                                  : std::string(),
                              "), more than the machine's ", format_bytes(plan.machine_host_bytes),
                              "; ", plan.host_memory_fixes(),
                              "; or pass --allow-host-overcommit to run anyway (expect "
                              "swapping or the OOM killer)"),
                "another rank's plan does not fit its machine's host memory (its error says why)");
}

}  // namespace tandem
