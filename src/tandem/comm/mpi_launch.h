// How this job's ranks were launched, as a command to start them again: what `tandem
// train` prints after a signal as the command that continues the run. The launcher's own
// options (a grace period such as `--mca odls_base_sigkill_timeout 60`, `--oversubscribe`,
// a hostfile, bindings) belong to the job as much as tandem's options do: a continued job
// without them would lose its grace period.
//
// The exact answer, where it exists: a rank that mpirun (OpenMPI's orterun, or mpiexec)
// started on this machine is mpirun's child, and mpirun's command line (/proc/PPID/cmdline)
// ends with this process's own: what comes before it is the launcher and its options,
// word for word. Elsewhere (a rank on another node, whose parent is OpenMPI's orted; a
// wrapper between mpirun and tandem; another launcher), the words are rebuilt: `mpirun`,
// --allow-run-as-root when root, -np N, and every MCA parameter the user gave, which
// OpenMPI hands every rank as OMPI_MCA_<name>=<value> (--oversubscribe becomes
// rmaps_base_oversubscribe=1, --bind-to binding_policy, ...), less the ones mpirun sets
// for every job (orte_*, ess*, pmix, ...). That loses what is no MCA parameter (-x, a
// hostfile, --timeout), which only the exact answer keeps.
#pragma once

#include <string>
#include <vector>

namespace tandem {

// What a rank can learn of how it was launched.
struct LaunchFacts {
  std::vector<std::string> own_argv;     // this process's command line (/proc/self/cmdline)
  std::vector<std::string> parent_argv;  // its parent's (/proc/PPID/cmdline); empty if unknown
  std::string parent_program;            // the parent's executable (/proc/PPID/exe)
  std::vector<std::string> environment;  // NAME=value, this process's
  bool root = false;                     // running as root (OpenMPI then wants a flag)
  unsigned cpus = 0;                     // the machine's CPUs
};

// This process's facts, read from /proc and its environment.
LaunchFacts this_process_launch();

// The words that start `ranks` ranks as `facts`' job was started, up to the program
// (excluded): {"mpirun", "--oversubscribe", "-np", "2", "--mca",
// "odls_base_sigkill_timeout", "60"}.
std::vector<std::string> launcher_words(const LaunchFacts& facts, int ranks);

// launcher_words of this process, as shell words joined by spaces, ready to paste before
// the program and its arguments.
std::string launcher_command(int ranks);

}  // namespace tandem
