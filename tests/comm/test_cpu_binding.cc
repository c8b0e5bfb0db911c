// The warning about ranks bound to a few of a machine's CPUs (comm/cpu_binding.h): due where a
// host's ranks may together use at most half of what their launcher may, with the options that
// give them the rest; not where they use the machine, whatever the binding.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/comm/cpu_binding.h"
#include "tandem/comm/local_group.h"

namespace tandem {
namespace {

std::vector<int> range(int first, int count) {
  std::vector<int> cpus(static_cast<size_t>(count));
  std::iota(cpus.begin(), cpus.end(), first);
  return cpus;
}

RankCpus rank_on(const std::string& host, std::vector<int> cpus, int launcher_cpus) {
  return {.host = host, .cpus = std::move(cpus), .launcher_cpus = range(0, launcher_cpus)};
}

TEST(CpuBinding, CpuListsAreRuns) {
  EXPECT_EQ(cpu_list_text({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(cpu_list_text({5}), "5");
  EXPECT_EQ(cpu_list_text({}), "");
}

TEST(CpuBinding, WarnsWhereAHostsRanksMayUseAtMostHalfOfItsCpus) {
  struct Case {
    const char* what;
    std::vector<RankCpus> ranks;
    std::vector<std::string> warning;  // parts of it; empty: no warning
  };
  const std::vector<Case> cases = {
      {"mpirun -np 2 on 16 CPUs: each rank bound to one core",
       {rank_on("gpu-01", {0}, 16), rank_on("gpu-01", {1}, 16)},
       {"the 2 ranks on gpu-01 may run on 2 of the 16 CPUs their launcher may (rank 0: CPU 0; "
        "rank 1: CPU 1), so each has as few as 1 CPU",
        "`mpirun --bind-to none`", "`--map-by slot:PE=8` for 8 cores each"}},
      {"mpirun -np 1 on 16 CPUs",
       {rank_on("gpu-01", {0}, 16)},
       {"rank 0 on gpu-01 may run on 1 of the 16 CPUs its launcher may (CPU 0), so it has 1 CPU",
        "give it the rest with `mpirun --bind-to none`"}},
      {"exactly half: 4 ranks of 2 cores each on 16",
       {rank_on("h", {0, 1}, 16), rank_on("h", {2, 3}, 16), rank_on("h", {4, 5}, 16),
        rank_on("h", {6, 7}, 16)},
       {"may run on 8 of the 16 CPUs", "rank 3: CPUs 6-7", "as few as 2 CPUs"}},
      {"the second host's ranks bound, the first's not",
       {rank_on("a", range(0, 16), 16), rank_on("a", range(0, 16), 16), rank_on("b", {0}, 16),
        rank_on("b", {1}, 16)},
       {"the 2 ranks on b may run on 2 of the 16 CPUs", "rank 2: CPU 0; rank 3: CPU 1"}},
      {"2 ranks on a 2-CPU machine, one core each: all of it used",
       {rank_on("ci", {0}, 2), rank_on("ci", {1}, 2)},
       {}},
      {"unbound ranks", {rank_on("h", range(0, 16), 16), rank_on("h", range(0, 16), 16)}, {}},
      {"8 ranks bound to the sockets of 2 x 8 cores",
       {rank_on("h", range(0, 8), 16), rank_on("h", range(0, 8), 16), rank_on("h", range(0, 8), 16),
        rank_on("h", range(0, 8), 16), rank_on("h", range(8, 8), 16), rank_on("h", range(8, 8), 16),
        rank_on("h", range(8, 8), 16), rank_on("h", range(8, 8), 16)},
       {}},
      {"more than half: 2 ranks of 5 cores on 16",
       {rank_on("h", range(0, 5), 16), rank_on("h", range(5, 5), 16)},
       {}},
      {"the launcher's CPUs unknown", {{.host = "h", .cpus = {0}, .launcher_cpus = {}}}, {}},
  };
  for (const Case& c : cases) {
    const std::string warning = cpu_binding_warning(c.ranks);
    if (c.warning.empty()) {
      EXPECT_EQ(warning, "") << c.what;
      continue;
    }
    for (const std::string& part : c.warning) EXPECT_CONTAINS(warning, part) << c.what;
  }
  // A single rank has no per-rank cores to suggest.
  EXPECT_EQ(cpu_binding_warning({rank_on("h", {0}, 16)}).find("PE="), std::string::npos);
}

// Over a communicator every rank gets the warning the ranks' own CPUs call for: ranks that are
// threads of one process share its CPUs and its launcher.
TEST(CpuBinding, EveryRankGetsTheSameWarning) {
  const RankCpus here = this_rank_cpus();
  EXPECT_FALSE(here.host.empty());
  EXPECT_FALSE(here.cpus.empty());
  std::vector<std::string> warnings(2);
  run_local_ranks(2,
                  [&](Communicator& comm) { warnings[comm.rank()] = cpu_binding_warning(comm); });
  EXPECT_EQ(warnings[0], warnings[1]);
  EXPECT_EQ(warnings[0], cpu_binding_warning({here, here}));
}

}  // namespace
}  // namespace tandem
