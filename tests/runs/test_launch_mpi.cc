// `tandem train` launched by mpirun, each process one rank (real OpenMPI on this machine's
// cores): the ranks give the bits of one process accumulating their micro-batches; ranks
// started differently are refused naming the difference; a rank killed mid-run stops the
// job in bounded time and leaves the last checkpoint intact.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/comm/cpu_binding.h"
#include "tandem/comm/local_group.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/format.h"
#include "tandem/core/thread_pool.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;

const std::string kTandem = testing::tandem_binary().string();

// mpirun as CI runs it: as root, more ranks than cores allowed.
std::string mpirun() {
  const testing::CommandResult which = testing::run_command("command -v mpirun");
  if (which.exit_code != 0) return "";
  return "mpirun --allow-run-as-root --oversubscribe";
}

class LaunchMpi : public ::testing::Test {
 public:
  void SetUp() override {
    launcher_ = mpirun();
    if (launcher_.empty())
      GTEST_SKIP() << "mpirun not found: install openmpi-bin (make deps does) to run this test";
    testing::write_small_corpus(dir_ / "data.txt");
  }

  const fs::path& dir() const { return dir_.path(); }
  const std::string& launcher() const { return launcher_; }

  fs::path write_config(const std::string& name, int accum, int stage) {
    nlohmann::json json = testing::tiny_run_config(dir_ / "data.txt", dir_ / name);
    json["model"]["n_embd"] = 64;
    json["gradient_accumulation_steps"] = accum;
    json["zero_optimization"] = {{"stage", stage}, {"reduce_bucket_size", 20000}};
    json["train"]["steps"] = 6;
    json["train"]["eval_interval"] = 3;
    json["train"]["checkpoint_interval"] = 1;
    const fs::path path = dir_ / (name + ".json");
    write_file_atomic(path, json.dump(2));
    return path;
  }

  // The state digest of the last metrics record.
  static std::string digest(const fs::path& metrics) {
    std::ifstream in(metrics);
    std::string line, last;
    while (std::getline(in, line))
      if (line.find("state_digest") != std::string::npos) last = line;
    if (last.empty()) return "";
    return nlohmann::json::parse(last)["state_digest"].get<std::string>();
  }

  // (Public: the helpers below the fixture use them.)
  std::string launcher_;
  testing::ScratchDir dir_{"launch_mpi"};
};

TEST_F(LaunchMpi, TwoRanksGiveTheBitsOfOneProcessAccumulatingTwoMicroBatches) {
  const fs::path one = write_config("one", 2, 0);
  // A plain process, with all the machine's OpenMP threads, while each rank below gets
  // fewer: the bits must not depend on the thread count either.
  const testing::CommandResult single = testing::run_command(
      kTandem + " train --config " + one.string() + " --metrics " + (dir_ / "one.jsonl").string());
  ASSERT_EQ(single.exit_code, 0) << single.output;

  const fs::path two = write_config("two", 1, 2);
  const testing::CommandResult ranks =
      testing::run_command(launcher_ + " -np 2 " + kTandem + " train --config " + two.string() +
                           " --metrics " + (dir_ / "two.jsonl").string());
  ASSERT_EQ(ranks.exit_code, 0) << ranks.output;
  EXPECT_NE(ranks.output.find("2 ranks (mpi), ZeRO stage 2"), std::string::npos) << ranks.output;
  // Rank 0 alone reports.
  size_t finals = 0;
  for (size_t at = 0; (at = ranks.output.find("tandem: 6 steps", at)) != std::string::npos; at++)
    finals++;
  EXPECT_EQ(finals, 1u) << ranks.output;

  const std::string want = digest(dir_ / "one.jsonl");
  ASSERT_EQ(want.size(), 16u);
  EXPECT_EQ(digest(dir_ / "two.jsonl"), want);
  EXPECT_EQ(read_file_bytes(resolve_checkpoint(dir_ / "one") / "model.safetensors"),
            read_file_bytes(resolve_checkpoint(dir_ / "two") / "model.safetensors"));
  // One optimizer file from one process, two shards from two ranks: the same moments.
  const TrainingState a = load_training_checkpoint(dir_ / "one");
  const TrainingState b = load_training_checkpoint(dir_ / "two");
  EXPECT_TRUE(a.optimizer_state == b.optimizer_state);
  EXPECT_TRUE(
      fs::exists(resolve_checkpoint(dir_ / "two") / "optimizer_shard_00001_of_00002.safetensors"));
}

// A rank mpirun bound to one core while its launcher may use more is warned about, naming its
// CPU and the option that gives it the rest; unbound, it is not.
TEST_F(LaunchMpi, ARankBoundToOneCoreIsWarnedAbout) {
  const size_t cpus = allowed_cpus().size();
  if (cpus < 2)
    GTEST_SKIP() << "this process may run on " << cpus
                 << " CPU: a rank bound to one core leaves nothing idle to warn about";
  const fs::path config = write_config("bound", 1, 0);
  const auto train = [&](const std::string& binding, const std::string& name) {
    return testing::run_command(launcher_ + " " + binding + " -np 1 " + kTandem +
                                " train --set train.steps=1 --set train.output_dir=" +
                                (dir_ / name).string() + " --config " + config.string());
  };
  const testing::CommandResult bound = train("--bind-to core", "bound");
  ASSERT_EQ(bound.exit_code, 0) << bound.output;
  EXPECT_CONTAINS(bound.output, cat("tandem: warning: rank 0 on ", this_rank_cpus().host,
                                    " may run on 1 of the ", cpus, " CPUs its launcher may (CPU "));
  EXPECT_CONTAINS(bound.output, "give it the rest with `mpirun --bind-to none`");
  const testing::CommandResult unbound = train("--bind-to none", "unbound");
  ASSERT_EQ(unbound.exit_code, 0) << unbound.output;
  EXPECT_EQ(unbound.output.find("may run on"), std::string::npos) << unbound.output;
}

// Real MPI, a world size that divides neither the parameters nor a power of two: every
// stage under the cpu, device and interleave schedules gives one process's bits. Stage 3
// with a live buffer of two layers and a prefetch of one: blocks are gathered, evicted and
// prefetched every step.
TEST_F(LaunchMpi, EveryStageAndScheduleOnThreeRanksGivesOneProcesssBits) {
  const fs::path one = write_config("single", 3, 0);
  ASSERT_EQ(testing::run_command(kTandem + " train --config " + one.string() +
                                 " --set train.checkpoint_interval=0 --set train.eval_interval=0"
                                 " --set train.steps=4 --metrics " +
                                 (dir_ / "single.jsonl").string())
                .exit_code,
            0);
  const std::string want = digest(dir_ / "single.jsonl");
  ASSERT_EQ(want.size(), 16u);
  for (int stage : {0, 1, 2, 3}) {
    for (const char* schedule : {"cpu", "device", "interleave"}) {
      const std::string name = cat("s", stage, "_", schedule);
      const fs::path config = write_config(name, 1, stage);
      const fs::path metrics = dir_ / (name + ".jsonl");
      const std::string stage3 =
          stage != 3 ? ""
                     : " --set zero_optimization.stage3_param_persistence_threshold=1000"
                       " --set zero_optimization.stage3_max_live_parameters=100000"
                       " --set zero_optimization.stage3_prefetch_bucket_size=50000";
      const testing::CommandResult run = testing::run_command(
          launcher_ + " -np 3 " + kTandem + " train --config " + config.string() + stage3 +
          " --set offload_optimizer.schedule=" + schedule +
          " --set zero_optimization.sub_group_size=20000 --set train.checkpoint_interval=0"
          " --set train.eval_interval=0 --set train.steps=4 --metrics " +
          metrics.string());
      ASSERT_EQ(run.exit_code, 0) << run.output;
      EXPECT_EQ(digest(metrics), want) << "stage " << stage << ", schedule " << schedule;
    }
  }
}

// DeMo under real MPI: three processes give the bits of three in-process ranks (the
// exchange's packing and the decode's rank order do not depend on the transport), the
// replica check runs, and a run stopped and resumed under mpirun continues bit for bit.
TEST_F(LaunchMpi, DemoOnThreeRanksGivesInProcessRanksBitsAndResumesBitExactly) {
  auto demo_config = [&](const std::string& name) {
    nlohmann::json json = testing::tiny_run_config(dir_ / "data.txt", dir_ / name);
    json["model"]["n_embd"] = 64;
    json["gradient_accumulation_steps"] = 1;
    json["optimizer"] = {{"type", "DeMo"}, {"params", {{"lr", 3e-3}, {"compression_topk", 8}}}};
    json["demo"] = {{"replica_check_interval", 2}};
    json["zero_optimization"] = {{"sub_group_size", 5000}};
    json["offload_optimizer"] = {{"schedule", "interleave"}};
    json["train"]["steps"] = 6;
    json["train"]["eval_interval"] = 3;
    json["train"]["checkpoint_interval"] = 3;
    return json;
  };
  std::vector<std::string> digests(3);
  TrainOptions options;
  options.show_progress = false;
  options.save_checkpoints = false;
  const TrainConfig local = parse_train_config(demo_config("local"));
  run_local_ranks(3, [&](Communicator& comm) {
    digests[comm.rank()] = train(local, options, comm).state_digest;
  });
  ASSERT_EQ(digests[0].size(), 16u);

  const fs::path straight = dir_ / "straight.json";
  write_file_atomic(straight, demo_config("straight").dump(2));
  const testing::CommandResult run =
      testing::run_command(launcher_ + " -np 3 " + kTandem + " train --config " +
                           straight.string() + " --metrics " + (dir_ / "straight.jsonl").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("with DeMo"), std::string::npos) << run.output;
  EXPECT_EQ(digest(dir_ / "straight.jsonl"), digests[0]);
  const std::string metrics = read_file_text(dir_ / "straight.jsonl");
  EXPECT_NE(metrics.find("\"replicas_identical\":true"), std::string::npos) << metrics;

  const fs::path split = dir_ / "split.json";
  write_file_atomic(split, demo_config("split").dump(2));
  const std::string train = launcher_ + " -np 3 " + kTandem + " train --config " + split.string();
  ASSERT_EQ(testing::run_command(train + " --stop-at-step 3").exit_code, 0);
  const testing::CommandResult resumed =
      testing::run_command(train + " --resume " + (dir_ / "split").string() + " --metrics " +
                           (dir_ / "split.jsonl").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed"), std::string::npos) << resumed.output;
  // Each rank streamed the weights and its own DeMo state: the bytes and the time, said.
  EXPECT_NE(resumed.output.find(" read in "), std::string::npos) << resumed.output;
  EXPECT_EQ(digest(dir_ / "split.jsonl"), digests[0]);
}

// A resume where one rank cannot read its part: every rank agrees it failed before any says
// "resumed", so the output holds the refusal and no announcement that misleads (issue 44).
TEST_F(LaunchMpi, AResumeOneRankRefusesIsNotAnnouncedByAnother) {
  nlohmann::json json = testing::tiny_run_config(dir_ / "data.txt", dir_ / "shards");
  json["model"]["n_embd"] = 64;
  json["gradient_accumulation_steps"] = 1;
  json["optimizer"] = {{"type", "DeMo"}, {"params", {{"lr", 3e-3}, {"compression_topk", 8}}}};
  json["train"]["steps"] = 2;
  json["train"]["eval_interval"] = 0;
  json["train"]["checkpoint_interval"] = 2;
  const fs::path config = dir_ / "shards.json";
  write_file_atomic(config, json.dump(2));
  const std::string train = launcher_ + " -np 2 " + kTandem + " train --config " + config.string();
  const testing::CommandResult first = testing::run_command(train);
  ASSERT_EQ(first.exit_code, 0) << first.output;

  // Rank 1's shard taken out of the manifest: rank 0 reads its own and would resume.
  const fs::path manifest = dir_ / "shards" / "checkpoints" / "step_00000002" / "manifest.json";
  nlohmann::json listed = nlohmann::json::parse(read_file_text(manifest));
  nlohmann::json& shards = listed["optimizer_shards"]["shards"];
  ASSERT_EQ(shards.size(), 2u) << listed.dump();
  shards.erase(1);
  write_file_atomic(manifest, listed.dump(2));

  const testing::CommandResult resumed = testing::run_command(
      train + " --resume " + (dir_ / "shards").string() + " --set train.steps=4");
  EXPECT_NE(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("no optimizer shard of rank 1"), std::string::npos)
      << resumed.output;
  EXPECT_EQ(resumed.output.find("tandem: resumed"), std::string::npos)
      << "a rank announced a resume that another refused:\n"
      << resumed.output;
}

TEST_F(LaunchMpi, RanksStartedDifferentlyAreRefusedNamingTheKey) {
  const fs::path config = write_config("differ", 1, 1);
  const std::string train = kTandem + " train --config " + config.string();
  const testing::CommandResult run = testing::run_command(
      launcher_ + " -np 1 " + train + " : -np 1 " + train + " --set optimizer.params.lr=0.01");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("rank 1 of 2: the configuration or data of this rank differs from "
                            "rank 0's at 'optimizer.params.lr'"),
            std::string::npos)
      << run.output;
  EXPECT_FALSE(fs::exists(dir_ / "differ" / "checkpoints" / "latest"));

  const testing::CommandResult stops = testing::run_command(
      launcher_ + " -np 1 " + train + " : -np 1 " + train + " --stop-at-step 2");
  EXPECT_NE(stops.exit_code, 0) << stops.output;
  EXPECT_NE(stops.output.find("at 'options.stop_at_step'"), std::string::npos) << stops.output;
}

// An error every rank meets at start (a config key, a data file, an earlier run's directory) is
// printed once, by rank 0, and the ranks stop together without MPI_Abort (whose report would
// follow tandem's error); an error one rank meets alone is printed by that rank, naming it.
TEST_F(LaunchMpi, AStartUpErrorIsPrintedOnceAndEndsTheJobWithoutAnAbort) {
  const fs::path config = write_config("startup", 1, 1);
  const std::string train = kTandem + " train --config " + config.string();
  const auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
    return n;
  };
  for (const std::string& set :
       {std::string("train.stepz=3"), std::string("data.train_path=") + (dir_ / "none").string()}) {
    const testing::CommandResult run =
        testing::run_command(launcher_ + " -np 2 " + train + " --set " + set);
    EXPECT_EQ(run.exit_code, 1) << run.output;
    EXPECT_EQ(count(run.output, "tandem: error: "), 1u) << set << "\n" << run.output;
    EXPECT_EQ(count(run.output, "rank 0 of 2"), 0u) << set << "\n" << run.output;
    EXPECT_EQ(run.output.find("MPI_ABORT"), std::string::npos) << set << "\n" << run.output;
  }
  const testing::CommandResult alone =
      testing::run_command(launcher_ + " -np 1 " + train + " : -np 1 " + train +
                           " --set data.train_path=" + (dir_ / "none").string());
  EXPECT_EQ(alone.exit_code, 1) << alone.output;
  EXPECT_EQ(count(alone.output, "tandem: error: "), 1u) << alone.output;
  EXPECT_NE(alone.output.find("tandem: error: rank 1 of 2: " + (dir_ / "none").string() +
                              ": no such file"),
            std::string::npos)
      << alone.output;
  EXPECT_EQ(alone.output.find("MPI_ABORT"), std::string::npos) << alone.output;
}

// A 2-rank run that would go on for a long time, whose rank 1 gets `signal` once rank 0
// has saved 3 checkpoints; returns the job's output, having checked that it ended in
// bounded time (not by timeout(1)) and that the latest checkpoint loads.
testing::CommandResult run_until_rank_one_gets(LaunchMpi& test, const std::string& name,
                                               const std::string& signal,
                                               const std::string& mpirun_options) {
  nlohmann::json json = nlohmann::json::parse(read_file_text(test.write_config(name, 1, 2)));
  json["train"]["steps"] = 100000;
  const fs::path config = test.dir() / (name + ".json");
  write_file_atomic(config, json.dump(2));
  const std::string train = kTandem + " train --config " + config.string();
  const std::string rank_one = "bash -c '" + train + " & pid=$!; while [ ! -e " +
                               (test.dir() / name / "checkpoints/step_00000003").string() +
                               " ]; do sleep 0.05; done; kill -" + signal + " $pid; wait $pid'";
  const auto start = std::chrono::steady_clock::now();
  const testing::CommandResult run =
      testing::run_command("timeout 120 " + test.launcher() + " " + mpirun_options + " -np 1 " +
                           train + " : -np 1 " + rank_one);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.exit_code, 124) << "the job hung until timeout(1) stopped it:\n" << run.output;
  EXPECT_LT(seconds, 60.0) << run.output;
  // Whatever step the job reached, the latest checkpoint loads with every checksum right.
  const TrainingState state = load_training_checkpoint(test.dir() / name);
  EXPECT_GE(state.step, 3);
  return run;
}

TEST_F(LaunchMpi, AKilledRankStopsTheJobAndTheLastCheckpointIsIntact) {
  // SIGKILL: no chance to say goodbye; mpirun sees the process end and stops the job.
  run_until_rank_one_gets(*this, "killed", "KILL", "");
}

TEST_F(LaunchMpi, AHungRankIsNamedWithinTheTimeoutAndTheJobStops) {
  // SIGSTOP: alive and silent; rank 0 gives up on it after TANDEM_COMM_TIMEOUT_S.
  const testing::CommandResult run =
      run_until_rank_one_gets(*this, "hung", "STOP", "-x TANDEM_COMM_TIMEOUT_S=2");
  // Rank 0 names rank 1, whether it was waiting for its data or for it to take rank 0's.
  EXPECT_NE(run.output.find("tandem: error: rank 0 of 2: "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("rank(s) 1 "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(" within 2 s "), std::string::npos) << run.output;
}

TEST_F(LaunchMpi, BenchZeroMeasuresEveryStageAtEveryWorldSize) {
  const fs::path config = write_config("bench", 1, 0);
  const testing::CommandResult run =
      testing::run_command(kTandem + " bench zero --config " + config.string() +
                           " --world-sizes 1,2 --steps 2 --warmup 1 --json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // Progress lines on stderr, then the JSON on the last line.
  std::string last = run.output;
  while (!last.empty() && last.back() == '\n') last.pop_back();
  last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
  EXPECT_NE(run.output.find("tandem bench zero: stage 2, 2 ranks"), std::string::npos);
  const nlohmann::json cases = nlohmann::json::parse(last);
  ASSERT_EQ(cases.size(), 8u) << run.output;  // stages 0-3 at 1 and 2 ranks
  const double P = 117504;                    // the test model's parameters
  const double S = 131072;                    // one rank's partition, padded to 2^14 elements
  for (const nlohmann::json& c : cases) {
    const int world = c["world_size"], stage = c["stage"];
    const std::string what = cat("stage ", stage, ", ", world, " ranks: ", c.dump());
    EXPECT_GT(c["seconds_per_step"].get<double>(), 0) << what;
    EXPECT_GT(c["device_bytes"].get<double>(), 0) << what;
    // The stages agree on the bits at a world size.
    const nlohmann::json& first_of_world = cases[world == 1 ? 0 : 4];
    EXPECT_EQ(c["state_digest"], first_of_world["state_digest"]) << what;
    const double sent = c["comm_bytes_sent_per_step"];
    // overlap_comm is on by default: with several MPI ranks the collectives on the model's
    // buffers run on their own thread (over an MPI_THREAD_MULTIPLE duplicate), timed apart
    // from the training thread's waits for them.
    const double collective_ms = c["collective_ms_per_step"];
    EXPECT_EQ(collective_ms > 0, world > 1) << what;
    EXPECT_LE(c["collective_wait_ms_per_step"].get<double>(),
              1e3 * c["seconds_per_step"].get<double>())
        << what;
    if (world == 1) {
      EXPECT_EQ(sent, 0) << what;
      // fp32 working params and gradients (4 + 4) and the fp32 params, m, v (12); from
      // stage 2 the gradients, at stage 3 the working params too, in the padded partition.
      const double states[] = {20 * P, 20 * P, 16 * P + 4 * S, 12 * P + 8 * S};
      EXPECT_EQ(c["model_state_bytes"].get<double>(), states[stage]) << what;
    } else {
      // About 2P fp32 values times (N - 1) / N per rank, at every stage.
      EXPECT_NEAR(sent, 4 * P, 0.3 * 4 * P) << what;
      if (stage > 0) {
        EXPECT_LT(c["model_state_bytes"].get<double>(), 20 * P) << what;
      }
    }
  }
  EXPECT_NE(cases[0]["state_digest"], cases[4]["state_digest"]);  // another global batch
}

}  // namespace
}  // namespace tandem
