// The launcher's words of the command that continues a run (comm/mpi_launch.h): mpirun's
// own command line, word for word, when mpirun is the rank's parent; else rebuilt from the
// OMPI_MCA_ variables, with the user's parameters and none of those mpirun sets for every
// job (checked on a real OpenMPI rank's environment where mpirun is installed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tandem/comm/mpi_launch.h"

namespace tandem {
namespace {

using Words = std::vector<std::string>;

// A rank's environment under OpenMPI 4.1's `mpirun --oversubscribe -np 2 --mca
// odls_base_sigkill_timeout 60`: the user's two parameters among those of every job.
Words open_mpi_environment() {
  return {"HOME=/root",
          "OMPI_COMM_WORLD_SIZE=2",
          "OMPI_MCA_ess=^singleton",
          "OMPI_MCA_ess_base_jobid=908984321",
          "OMPI_MCA_ess_base_vpid=1",
          "OMPI_MCA_initial_wdir=/work",
          "OMPI_MCA_mpi_oversubscribe=0",
          "OMPI_MCA_odls_base_sigkill_timeout=60",
          "OMPI_MCA_orte_app_num=0",
          "OMPI_MCA_orte_ess_num_procs=2",
          "OMPI_MCA_orte_hnp_uri=908984320.0;tcp://192.0.2.2:47173",
          "OMPI_MCA_orte_jobfam_session_dir=/tmp/ompi.vm.0/pid.23248",
          "OMPI_MCA_orte_launch=1",
          "OMPI_MCA_orte_precondition_transports=f7746cd99d8d688c-12e7871b0b0bb4c3",
          "OMPI_MCA_pmix=^s1,s2,cray,isolated",
          "OMPI_MCA_rmaps_base_oversubscribe=1",
          "OMPI_MCA_shmem_RUNTIME_QUERY_hint=mmap",
          "PMIX_RANK=1"};
}

LaunchFacts facts_under(Words parent_argv, std::string parent_program) {
  LaunchFacts facts;
  facts.own_argv = {"build/tandem", "train", "--config", "run config.json"};
  facts.parent_argv = std::move(parent_argv);
  facts.parent_program = std::move(parent_program);
  facts.environment = open_mpi_environment();
  facts.cpus = 16;
  return facts;
}

TEST(MpiLaunch, MpirunsOwnWordsWhenItIsTheParent) {
  const Words launcher = {"/usr/bin/mpirun",
                          "--allow-run-as-root",
                          "--oversubscribe",
                          "-np",
                          "2",
                          "--mca",
                          "odls_base_sigkill_timeout",
                          "60",
                          "-x",
                          "A=1"};
  Words parent = launcher;
  for (const char* word : {"build/tandem", "train", "--config", "run config.json"})
    parent.push_back(word);
  EXPECT_EQ(launcher_words(facts_under(parent, "/usr/bin/orterun"), 2), launcher);
  // Known by its own name too when its executable cannot be read.
  EXPECT_EQ(launcher_words(facts_under(parent, ""), 2), launcher);
}

TEST(MpiLaunch, RebuiltFromTheUsersParametersOtherwise) {
  const Words expected = {"mpirun", "--oversubscribe",           "-np", "2",
                          "--mca",  "odls_base_sigkill_timeout", "60"};
  // A rank on another node (its parent is orted), one behind a wrapper script, one whose
  // parent's command does not end with its own, and one of an MPMD launch.
  EXPECT_EQ(
      launcher_words(facts_under({"/usr/bin/orted", "-mca", "ess", "env"}, "/usr/bin/orted"), 2),
      expected);
  EXPECT_EQ(launcher_words(facts_under({"bash", "wrap.sh"}, "/usr/bin/bash"), 2), expected);
  EXPECT_EQ(launcher_words(facts_under({"mpirun", "-np", "2", "./wrap.sh"}, "/usr/bin/orterun"), 2),
            expected);
  EXPECT_EQ(launcher_words(facts_under({"mpirun", "-np", "1", "build/tandem", "train", "--config",
                                        "run config.json", ":", "-np", "1", "build/tandem", "train",
                                        "--config", "run config.json"},
                                       "/usr/bin/orterun"),
                           2),
            expected);
  // A tracer is no launcher, though the command it runs ends with this process's.
  EXPECT_EQ(launcher_words(facts_under({"strace", "-f", "build/tandem", "train", "--config",
                                        "run config.json"},
                                       "/usr/bin/strace"),
                           2),
            expected);
}

TEST(MpiLaunch, RebuiltWithRootsFlagAndTheOversubscriptionItNeeds) {
  LaunchFacts facts = facts_under({}, "");
  facts.environment = {"OMPI_MCA_orte_launch=1", "OMPI_MCA_btl=self,vader"};
  facts.root = true;
  facts.cpus = 2;
  EXPECT_EQ(launcher_words(facts, 3), (Words{"mpirun", "--allow-run-as-root", "--oversubscribe",
                                             "-np", "3", "--mca", "btl", "self,vader"}));
  facts.environment.clear();
  facts.root = false;
  EXPECT_EQ(launcher_words(facts, 2), (Words{"mpirun", "-np", "2"}));
}

TEST(MpiLaunch, ThisProcessKnowsItsOwnCommandLine) {
  const LaunchFacts facts = this_process_launch();
  ASSERT_FALSE(facts.own_argv.empty());
  EXPECT_NE(facts.own_argv[0].find("test_mpi_launch"), std::string::npos);
  EXPECT_FALSE(facts.parent_argv.empty());
  EXPECT_FALSE(facts.environment.empty());
}

// A real rank's environment: of all the OMPI_MCA_ variables mpirun sets, only the user's
// come back as options.
TEST(MpiLaunch, ARealOpenMpiRanksEnvironmentGivesBackTheUsersOptions) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  for (char** variable = environ; *variable != nullptr; ++variable) {
    if (std::string(*variable).rfind("OMPI_MCA_", 0) == 0)
      GTEST_SKIP() << "this environment sets " << *variable;
  }
  const std::string command = std::string("mpirun ") +
                              (::geteuid() == 0 ? "--allow-run-as-root " : "") +
                              "--oversubscribe -np 1 --mca odls_base_sigkill_timeout 60 env";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  LaunchFacts facts;
  char line[8192];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    std::string variable(line);
    if (!variable.empty() && variable.back() == '\n') variable.pop_back();
    facts.environment.push_back(variable);
  }
  ASSERT_EQ(::pclose(pipe), 0) << command;
  facts.cpus = 1;
  EXPECT_EQ(launcher_words(facts, 1), (Words{"mpirun", "--oversubscribe", "-np", "1", "--mca",
                                             "odls_base_sigkill_timeout", "60"}));
}

}  // namespace
}  // namespace tandem
