#include "tandem/comm/mpi_launch.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "tandem/core/format.h"

extern char** environ;

namespace tandem {
namespace {

// A /proc cmdline: the arguments, each ended by a NUL. Empty when it cannot be read.
std::vector<std::string> read_cmdline(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> words;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\0', start);
    if (end == std::string::npos) end = text.size();
    words.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return words;
}

// Whether a program's file name is an MPI launcher's: mpirun, mpiexec, OpenMPI's orterun
// (what Debian's mpirun is) or PRRTE's prterun, with any suffix (mpirun.openmpi).
bool is_launcher(std::string_view path) {
  const std::string_view name = path.substr(path.rfind('/') + 1);
  for (std::string_view launcher : {"mpirun", "mpiexec", "orterun", "prterun"}) {
    if (name.substr(0, launcher.size()) == launcher) return true;
  }
  return false;
}

// MCA parameters OpenMPI 4.1's mpirun (and orted) set for every rank of every job, whatever
// the user asked: its wiring (the job's ids, daemons' addresses, session directories) and
// its own view of the node (mpi_oversubscribe is 0 or 1 by the slots, --oversubscribe or
// not). Found by comparing ranks' environments with and without the user's options.
bool set_for_every_job(std::string_view name) {
  if (name.substr(0, 5) == "orte_") return true;
  for (std::string_view internal : {"ess", "ess_base_jobid", "ess_base_vpid", "initial_wdir",
                                    "mpi_oversubscribe", "pmix", "shmem_RUNTIME_QUERY_hint"}) {
    if (name == internal) return true;
  }
  return false;
}

// The words before the program rebuilt from what every rank knows (the header says when).
std::vector<std::string> rebuilt_launcher_words(const LaunchFacts& facts, int ranks) {
  std::vector<std::string> words = {"mpirun"};
  if (facts.root) words.push_back("--allow-run-as-root");
  std::vector<std::pair<std::string, std::string>> parameters;  // name, value
  bool oversubscribe = ranks > static_cast<int>(facts.cpus);
  constexpr std::string_view kPrefix = "OMPI_MCA_";
  for (const std::string& variable : facts.environment) {
    const size_t equals = variable.find('=');
    if (variable.compare(0, kPrefix.size(), kPrefix) != 0 || equals == std::string::npos) continue;
    const std::string name = variable.substr(kPrefix.size(), equals - kPrefix.size());
    const std::string value = variable.substr(equals + 1);
    if (name.empty() || set_for_every_job(name)) continue;
    if (name == "rmaps_base_oversubscribe" && value == "1") {
      oversubscribe = true;  // --oversubscribe, as the user most likely wrote it
      continue;
    }
    parameters.emplace_back(name, value);
  }
  if (oversubscribe) words.push_back("--oversubscribe");
  words.push_back("-np");
  words.push_back(std::to_string(ranks));
  std::sort(parameters.begin(), parameters.end());  // the environment's order is no one's
  for (const auto& [name, value] : parameters) words.insert(words.end(), {"--mca", name, value});
  return words;
}

}  // namespace

LaunchFacts this_process_launch() {
  LaunchFacts facts;
  facts.own_argv = read_cmdline("/proc/self/cmdline");
  const std::string parent = "/proc/" + std::to_string(::getppid());
  facts.parent_argv = read_cmdline(parent + "/cmdline");
  std::error_code ec;
  facts.parent_program = std::filesystem::read_symlink(parent + "/exe", ec).string();
  for (char** variable = environ; variable != nullptr && *variable != nullptr; ++variable)
    facts.environment.emplace_back(*variable);
  facts.root = ::geteuid() == 0;
  facts.cpus = std::thread::hardware_concurrency();
  return facts;
}

std::vector<std::string> launcher_words(const LaunchFacts& facts, int ranks) {
  // The parent's command line, when the parent is a launcher whose command ends with this
  // process's: the words before ours, exactly as typed. Not for an MPMD launch (`mpirun -np 1
  // a : -np 1 b`), whose words before the last program hold another one.
  const std::vector<std::string>& mine = facts.own_argv;
  const std::vector<std::string>& parent = facts.parent_argv;
  if (!mine.empty() && parent.size() > mine.size() &&
      (is_launcher(facts.parent_program) || is_launcher(parent[0])) &&
      std::equal(mine.begin(), mine.end(), parent.end() - mine.size())) {
    std::vector<std::string> words(parent.begin(), parent.end() - mine.size());
    if (std::find(words.begin(), words.end(), ":") == words.end()) return words;
  }
  return rebuilt_launcher_words(facts, ranks);
}

std::string launcher_command(int ranks) {
  std::string command;
  for (const std::string& word : launcher_words(this_process_launch(), ranks)) {
    if (!command.empty()) command += ' ';
    command += shell_word(word);
  }
  return command;
}

}  // namespace tandem
