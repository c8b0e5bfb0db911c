#include "tandem/comm/cpu_binding.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>

#include "tandem/comm/communicator.h"
#include "tandem/core/format.h"

namespace tandem {
namespace {

std::vector<int> affinity_of(pid_t pid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(pid, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

// A rank's RankCpus as it is sent: of fixed size, so that one all-gather carries every rank's.
struct PackedRankCpus {
  static constexpr int kWords = CPU_SETSIZE / 64;
  char host[64];
  uint64_t cpus[kWords];
  uint64_t launcher_cpus[kWords];
};

void pack_cpus(const std::vector<int>& cpus, uint64_t (&words)[PackedRankCpus::kWords]) {
  std::fill(std::begin(words), std::end(words), 0);
  for (int cpu : cpus)
    if (cpu >= 0 && cpu < CPU_SETSIZE) words[cpu / 64] |= uint64_t{1} << (cpu % 64);
}

std::vector<int> unpack_cpus(const uint64_t (&words)[PackedRankCpus::kWords]) {
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if ((words[cpu / 64] >> (cpu % 64)) & 1) cpus.push_back(cpu);
  return cpus;
}

PackedRankCpus pack(const RankCpus& rank) {
  PackedRankCpus packed{};
  std::strncpy(packed.host, rank.host.c_str(), sizeof packed.host - 1);
  pack_cpus(rank.cpus, packed.cpus);
  pack_cpus(rank.launcher_cpus, packed.launcher_cpus);
  return packed;
}

RankCpus unpack(const PackedRankCpus& packed) {
  return {.host = std::string(packed.host, strnlen(packed.host, sizeof packed.host)),
          .cpus = unpack_cpus(packed.cpus),
          .launcher_cpus = unpack_cpus(packed.launcher_cpus)};
}

// The warning for the ranks `on_host` (indices into `ranks`) of one host; "" when none is due.
std::string host_warning(const std::vector<RankCpus>& ranks, const std::vector<size_t>& on_host) {
  std::set<int> used, launcher;
  size_t fewest = SIZE_MAX;
  for (size_t r : on_host) {
    used.insert(ranks[r].cpus.begin(), ranks[r].cpus.end());
    launcher.insert(ranks[r].launcher_cpus.begin(), ranks[r].launcher_cpus.end());
    fewest = std::min(fewest, ranks[r].cpus.size());
  }
  if (launcher.empty() || used.empty() || 2 * used.size() > launcher.size()) return "";
  const size_t n = on_host.size();
  std::string each;
  for (size_t r : on_host) {
    if (!each.empty()) each += "; ";
    if (n > 1) each += cat("rank ", r, ": ");
    each += cat(ranks[r].cpus.size() == 1 ? "CPU " : "CPUs ", cpu_list_text(ranks[r].cpus));
  }
  const std::string who = n == 1 ? cat("rank ", on_host.front()) : cat("the ", n, " ranks");
  const std::string cores = fewest == 1 ? std::string("1 CPU") : cat(fewest, " CPUs");
  const size_t share = launcher.size() / n;
  return cat(who, " on ", ranks[on_host.front()].host, " may run on ", used.size(), " of the ",
             launcher.size(), " CPUs ", n == 1 ? "its" : "their", " launcher may (", each, "), so ",
             n == 1 ? "it has " : "each has as few as ", cores,
             " for its share of the CPU's work (the optimizer update of host subgroups, the cpu "
             "device's compute). OpenMPI's mpirun binds each rank to one core when it starts 2 "
             "or fewer: give ",
             n == 1 ? "it" : "them", " the rest with `mpirun --bind-to none`",
             n > 1 && share >= 2
                 ? cat(", or `--map-by slot:PE=", share, "` for ", share, " cores each")
                 : std::string());
}

}  // namespace

RankCpus this_rank_cpus() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "this machine");
  return {.host = host, .cpus = affinity_of(getpid()), .launcher_cpus = affinity_of(getppid())};
}

std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string text;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) j++;
    if (!text.empty()) text += ",";
    text += j == i ? cat(cpus[i]) : cat(cpus[i], "-", cpus[j]);
    i = j + 1;
  }
  return text;
}

std::string cpu_binding_warning(const std::vector<RankCpus>& ranks) {
  std::vector<std::string> hosts;  // in the order of their first rank
  for (const RankCpus& rank : ranks)
    if (std::find(hosts.begin(), hosts.end(), rank.host) == hosts.end()) hosts.push_back(rank.host);
  for (const std::string& host : hosts) {
    std::vector<size_t> on_host;
    for (size_t r = 0; r < ranks.size(); r++)
      if (ranks[r].host == host) on_host.push_back(r);
    if (std::string warning = host_warning(ranks, on_host); !warning.empty()) return warning;
  }
  return "";
}

std::string cpu_binding_warning(Communicator& comm) {
  const PackedRankCpus mine = pack(this_rank_cpus());
  std::vector<PackedRankCpus> all(static_cast<size_t>(comm.world_size()));
  comm.all_gather(&mine, all.data(), sizeof mine);
  std::vector<RankCpus> ranks;
  for (const PackedRankCpus& packed : all) ranks.push_back(unpack(packed));
  return cpu_binding_warning(ranks);
}

}  // namespace tandem
