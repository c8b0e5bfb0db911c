#include "tandem/bench/zero_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "tandem/comm/mpi_communicator.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/format.h"
#include "tandem/core/timer.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {

std::string find_mpirun() {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const fs::path candidate = fs::path(dirs.substr(start, end - start)) / "mpirun";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    start = end + 1;
  }
  return "";
}

// The files of one run, removed with it.
struct RunDir {
  RunDir() {
    std::string name = (fs::temp_directory_path() / "tandem_bench_zero_XXXXXX").string();
    TANDEM_CHECK(::mkdtemp(name.data()) != nullptr, "bench zero: cannot create a directory in ",
                 fs::temp_directory_path().string(), " (", std::strerror(errno), ")");
    path = name;
  }
  ~RunDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;
  fs::path path;
};

ZeroBenchCase run_case(const ZeroBenchOptions& options, int world, int stage,
                       const std::string& mpirun) {
  RunDir dir;
  const fs::path metrics = dir.path / "metrics.jsonl", log = dir.path / "log.txt";
  std::string command;
  if (world > 1) {
    command = shell_word(mpirun) + mpirun_options(world) + " ";
  }
  command += shell_word(options.tandem_binary.string()) + " train --config " +
             shell_word(options.config.string());
  std::vector<std::string> sets = options.overrides;
  for (const std::string& s :
       {cat("zero_optimization.stage=", stage), cat("train.steps=", options.warmup + options.steps),
        std::string("train.eval_interval=0"), std::string("train.sample_bytes=0"),
        std::string("train.checkpoint_interval=0"),
        cat("train.output_dir=", (dir.path / "run").string())})
    sets.push_back(s);
  for (const std::string& s : sets) command += " --set " + shell_word(s);
  command += " --metrics " + shell_word(metrics.string()) + " >" + shell_word(log.string()) +
             " 2>&1 </dev/null";
  const int status = std::system(command.c_str());
  if (status != 0) {
    std::string output = fs::exists(log) ? read_file_text(log.string()) : "";
    if (output.size() > 4000) output = "..." + output.substr(output.size() - 4000);
    fail("bench zero: the run of stage ", stage, " on ", world, " ranks failed:\n", output);
  }
  ZeroBenchCase c;
  c.world_size = world;
  c.stage = stage;
  std::ifstream in(metrics);
  std::string line;
  std::vector<double> seconds, tokens, sent, received, collective, waited;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("plan")) {
      const nlohmann::json& plan = record["plan"];
      c.model_state_bytes = plan["model_state_bytes"].get<size_t>();
      c.device_bytes = plan["device_bytes"].get<size_t>();
      c.pinned_host_bytes = plan["pinned_host_bytes"].get<size_t>();
      c.host_bytes = plan["host_bytes"].get<size_t>();
    } else if (record.contains("state_digest")) {
      c.state_digest = record["state_digest"].get<std::string>();
    } else if (record.contains("loss") && record["step"].get<int>() > options.warmup) {
      seconds.push_back(record["ms"].get<double>() / 1e3);
      tokens.push_back(record["tokens_per_s"].get<double>());
      sent.push_back(record["comm_bytes_sent"].get<double>());
      received.push_back(record["comm_bytes_received"].get<double>());
      collective.push_back(record.value("collective_ms", 0.0));
      waited.push_back(record.value("collective_wait_ms", 0.0));
    }
  }
  TANDEM_CHECK(!seconds.empty(), "bench zero: the run of stage ", stage, " on ", world,
               " ranks wrote no timed step to its metrics");
  c.seconds_per_step = median(seconds);
  c.tokens_per_s = median(tokens);
  c.comm_bytes_sent = median(sent);
  c.comm_bytes_received = median(received);
  c.collective_ms = median(collective);
  c.collective_wait_ms = median(waited);
  return c;
}

}  // namespace

std::vector<ZeroBenchCase> run_zero_bench(const ZeroBenchOptions& options) {
  TANDEM_CHECK(options.steps >= 1 && options.warmup >= 0,
               "bench zero: --steps must be at least 1 and --warmup at least 0");
  std::string mpirun;
  if (std::any_of(options.world_sizes.begin(), options.world_sizes.end(),
                  [](int n) { return n > 1; })) {
    mpirun = find_mpirun();
    TANDEM_CHECK(!mpirun.empty(),
                 "bench zero: world sizes above 1 are launched with mpirun, which is not on PATH; "
                 "install openmpi-bin (make deps does) or use --world-sizes 1");
  }
  std::vector<ZeroBenchCase> cases;
  for (int world : options.world_sizes) {
    TANDEM_CHECK(world >= 1, "bench zero: world size ", world, " must be at least 1");
    for (int stage : options.stages) {
      if (options.progress) options.progress(cat("stage ", stage, ", ", world, " ranks"));
      cases.push_back(run_case(options, world, stage, mpirun));
    }
  }
  return cases;
}

std::string zero_bench_table(const std::vector<ZeroBenchCase>& cases) {
  std::string out =
      cat("ranks  stage  s/step    tokens/s  model states  device      pinned host  host        "
          "sent/step   received/step  comm ms  waited ms  state digest\n");
  for (const ZeroBenchCase& c : cases) {
    char row[512];
    std::snprintf(
        row, sizeof row,
        "%5d  %5d  %8.4f  %9.0f  %-12s  %-10s  %-11s  %-10s  %-10s  %-13s  %7.1f  %9.1f  %s\n",
        c.world_size, c.stage, c.seconds_per_step, c.tokens_per_s,
        format_bytes(c.model_state_bytes).c_str(), format_bytes(c.device_bytes).c_str(),
        format_bytes(c.pinned_host_bytes).c_str(), format_bytes(c.host_bytes).c_str(),
        format_bytes(static_cast<size_t>(c.comm_bytes_sent)).c_str(),
        format_bytes(static_cast<size_t>(c.comm_bytes_received)).c_str(), c.collective_ms,
        c.collective_wait_ms, c.state_digest.c_str());
    out += row;
  }
  return out +
         "(bytes per rank, rank 0's: it holds the largest partition; comm ms: its collectives "
         "on the model's buffers, run beside compute with overlap_comm, of which the training "
         "thread waited for `waited ms`)\n";
}

nlohmann::json zero_bench_json(const std::vector<ZeroBenchCase>& cases) {
  nlohmann::json out = nlohmann::json::array();
  for (const ZeroBenchCase& c : cases)
    out.push_back({{"world_size", c.world_size},
                   {"stage", c.stage},
                   {"seconds_per_step", c.seconds_per_step},
                   {"tokens_per_s", c.tokens_per_s},
                   {"model_state_bytes", c.model_state_bytes},
                   {"device_bytes", c.device_bytes},
                   {"pinned_host_bytes", c.pinned_host_bytes},
                   {"host_bytes", c.host_bytes},
                   {"comm_bytes_sent_per_step", c.comm_bytes_sent},
                   {"comm_bytes_received_per_step", c.comm_bytes_received},
                   {"collective_ms_per_step", c.collective_ms},
                   {"collective_wait_ms_per_step", c.collective_wait_ms},
                   {"state_digest", c.state_digest}});
  return out;
}

}  // namespace tandem
