#include "tandem/comm/agreement.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tandem/core/checksum.h"
#include "tandem/core/error.h"

namespace tandem {

bool all_ranks_ok(Communicator& comm, bool ok) {
  float failures = ok ? 0.0f : 1.0f;
  comm.all_reduce_sum(&failures, 1);
  return failures == 0.0f;
}

void fail_together(Communicator& comm, const std::string& error, std::string_view elsewhere) {
  if (all_ranks_ok(comm, error.empty())) return;
  if (!error.empty()) throw ErrorOnEveryRank(error);
  throw ErrorOnEveryRank(std::string(elsewhere), /*own=*/false);
}

int max_over_ranks(Communicator& comm, int value) {
  if (comm.world_size() == 1) return value;
  std::vector<int> all(static_cast<size_t>(comm.world_size()));
  comm.all_gather(&value, all.data(), sizeof value);
  return *std::max_element(all.begin(), all.end());
}

size_t min_over_ranks(Communicator& comm, size_t value) {
  if (comm.world_size() == 1) return value;
  std::vector<size_t> all(static_cast<size_t>(comm.world_size()));
  comm.all_gather(&value, all.data(), sizeof value);
  return *std::min_element(all.begin(), all.end());
}

std::string rank_of_world(const Communicator& comm) {
  return cat("rank ", comm.rank(), " of ", comm.world_size(), ": ");
}

std::string broadcast_string(Communicator& comm, const std::string& text, int root) {
  uint64_t size = text.size();
  comm.broadcast(&size, sizeof size, root);
  std::string out = comm.rank() == root ? text : std::string(size, '\0');
  comm.broadcast(out.data(), size, root);
  return out;
}

std::string first_json_difference(const nlohmann::json& a, const nlohmann::json& b,
                                  const std::string& path) {
  const auto sub = [&](const std::string& key) { return path.empty() ? key : path + "." + key; };
  if (a.is_object() && b.is_object()) {
    for (const auto& [key, value] : a.items()) {
      if (!b.contains(key)) return sub(key);
      const std::string diff = first_json_difference(value, b.at(key), sub(key));
      if (!diff.empty()) return diff;
    }
    for (const auto& [key, value] : b.items())
      if (!a.contains(key)) return sub(key);
    return "";
  }
  return a == b ? "" : (path.empty() ? std::string("(the whole document)") : path);
}

void require_same_on_every_rank(Communicator& comm, const nlohmann::json& mine,
                                std::string_view what, std::string_view fix) {
  if (comm.world_size() == 1) return;
  const std::string root = broadcast_string(comm, mine.dump(), 0);
  const std::string diff = first_json_difference(nlohmann::json::parse(root), mine);
  fail_together(comm,
                diff.empty() ? std::string()
                             : cat("the ", what, " of this rank differs from rank 0's at '", diff,
                                   "'; ", fix),
                cat("another rank was started with a ", what,
                    " that differs from rank 0's (its error names the key)"));
}

void require_same_bits_on_every_rank(Communicator& comm, const void* data, size_t bytes,
                                     std::string_view what, std::string_view fix) {
  if (comm.world_size() == 1) return;
  const uint64_t mine = checksum64(data, bytes);
  std::vector<uint64_t> all(comm.world_size());
  comm.all_gather(&mine, all.data(), sizeof mine);
  std::string differing;
  for (int r = 1; r < comm.world_size(); r++)
    if (all[r] != all[0]) differing += cat("rank ", r, ": ", checksum_hex(all[r]), ", ");
  // Every rank saw every hash: all throw the same error together.
  if (!differing.empty())
    throw ErrorOnEveryRank(cat(what, " differ between the ranks (", differing,
                               "rank 0: ", checksum_hex(all[0]), "); ", fix));
}

}  // namespace tandem
