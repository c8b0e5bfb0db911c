// The `tandem` command end to end: a tiny training run with metrics, sampling from
// its checkpoint, and bad input. Every failure must be one line on stderr naming the
// file (or key) and the problem, a non-zero exit status, and no checkpoint lost.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/core/file_io.h"
#include "tandem/core/format.h"
#include "tandem/core/host_memory.h"
#include "tandem/data/byte_tokenizer.h"
#include "tandem/data/token_shard.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/train/step_settings.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::ScratchDir;

const std::string kTandem = testing::tandem_binary().string();

class CliTest : public ::testing::Test {
 protected:
  CliTest() : dir_("cli") { testing::write_small_corpus(dir_ / "data.txt"); }

  // Writes a tiny config (optionally edited) and returns its path.
  fs::path write_config(const nlohmann::json& edits = nlohmann::json::object()) {
    nlohmann::json config = testing::tiny_run_config(dir_ / "data.txt", dir_ / "run");
    config.merge_patch(edits);
    const fs::path path = dir_ / "config.json";
    write_file_atomic(path, config.dump(2));
    return path;
  }

  testing::CommandResult tandem(const std::string& args) {
    return run_command(kTandem + " " + args + " </dev/null");
  }

  // The error line must be the last line of output, start with "tandem: error:" and
  // contain every fragment.
  static void expect_error(const testing::CommandResult& result,
                           const std::vector<std::string>& fragments) {
    EXPECT_NE(result.exit_code, 0) << result.output;
    std::string last = result.output;
    while (!last.empty() && last.back() == '\n') last.pop_back();
    last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
    EXPECT_EQ(last.rfind("tandem: error: ", 0), 0u) << result.output;
    for (const std::string& fragment : fragments)
      EXPECT_NE(last.find(fragment), std::string::npos)
          << "missing '" << fragment << "' in: " << result.output;
  }

  ScratchDir dir_;
};

TEST_F(CliTest, TrainWritesMetricsCheckpointAndSample) {
  const fs::path config = write_config({{"train", {{"sample_bytes", 50}}}});
  const fs::path metrics = dir_ / "metrics.jsonl";
  const auto result = tandem("train --config " + config.string() + " --metrics " +
                             metrics.string() + " --set train.steps=10");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("step     10/10"), std::string::npos) << result.output;

  std::ifstream in(metrics);
  std::string line;
  int steps = 0, evals = 0, checkpoints = 0;
  std::string last_line;
  while (std::getline(in, line)) {
    last_line = line;
    const auto record = nlohmann::json::parse(line);
    if (record.contains("state_digest")) continue;
    if (record.contains("plan")) {
      EXPECT_EQ(steps, 0) << "the plan comes first: " << line;
      EXPECT_GT(record["plan"]["device_bytes"].get<double>(), 0) << line;
      continue;
    }
    if (record.contains("val_loss")) {
      evals++;
      EXPECT_TRUE(record["val_loss"].is_number());
      continue;
    }
    if (record.contains("checkpoint")) {
      checkpoints++;
      EXPECT_EQ(record["step"], 10) << line;
      EXPECT_EQ(record["checkpoint_lazy"], false) << "the last one is synchronous: " << line;
      EXPECT_GE(record["checkpoint_stall_ms"].get<double>(), 0.0) << line;
      EXPECT_GE(record["checkpoint_flush_ms"].get<double>(), 0.0) << line;
      continue;
    }
    steps++;
    EXPECT_EQ(record["step"], steps);
    for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s", "ms", "forward_ms",
                            "backward_ms", "update_ms", "h2d_bytes", "d2h_bytes"})
      EXPECT_TRUE(record.contains(key)) << key << " missing in " << line;
  }
  EXPECT_EQ(steps, 10);
  EXPECT_EQ(evals, 2);        // eval_interval 5
  EXPECT_EQ(checkpoints, 1);  // at the end
  // The final record carries the digest of params, m and v.
  const auto final_record = nlohmann::json::parse(last_line);
  ASSERT_TRUE(final_record.contains("state_digest")) << last_line;
  EXPECT_EQ(final_record["state_digest"].get<std::string>().size(), 16u);
  EXPECT_EQ(final_record["step"], 10);
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step_00000010/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step_00000010/config.json"));

  const auto sample = tandem("sample --checkpoint " + (dir_ / "run").string() +
                             " --prompt ROMEO: --bytes 40 --seed 3");
  ASSERT_EQ(sample.exit_code, 0) << sample.output;
  EXPECT_EQ(sample.output.rfind("ROMEO:", 0), 0u) << sample.output;
  EXPECT_GE(sample.output.size(), 6u + 40u);

  // A model of 10 steps samples control bytes too: printed escaped (printable_text), and
  // as they are with --raw.
  const std::string many =
      "sample --checkpoint " + (dir_ / "run").string() + " --bytes 3000 --seed 5";
  const auto escaped = tandem(many);
  const auto raw = tandem(many + " --raw");
  ASSERT_EQ(escaped.exit_code, 0) << escaped.output;
  ASSERT_EQ(raw.exit_code, 0) << raw.output;
  EXPECT_EQ(escaped.output, printable_text(raw.output.substr(0, raw.output.size() - 1)) + "\n");
  EXPECT_NE(escaped.output.find("\\x"), std::string::npos) << "no byte needed escaping";
  // What is left is printable ASCII, newlines, tabs and whole UTF-8 sequences (a lead byte
  // and as many continuation bytes as it announces, none overlong or past U+10FFFF).
  const std::string& out = escaped.output;
  for (size_t i = 0; i < out.size();) {
    const auto u = static_cast<unsigned char>(out[i]);
    if ((u >= 0x20 && u < 0x7F) || u == '\n' || u == '\t') {
      i++;
      continue;
    }
    const size_t length = u >= 0xC2 && u <= 0xDF   ? 2
                          : u >= 0xE0 && u <= 0xEF ? 3
                          : u >= 0xF0 && u <= 0xF4 ? 4
                                                   : 0;
    ASSERT_NE(length, 0u) << "byte " << int(u) << " at " << i;
    ASSERT_LE(i + length, out.size()) << "a cut UTF-8 sequence at " << i;
    const auto second = static_cast<unsigned char>(out[i + 1]);
    ASSERT_FALSE((u == 0xE0 && second < 0xA0) || (u == 0xF0 && second < 0x90) ||
                 (u == 0xF4 && second > 0x8F))
        << "an overlong or out-of-range sequence at " << i;
    for (size_t k = 1; k < length; k++)
      ASSERT_EQ(static_cast<unsigned char>(out[i + k]) & 0xC0, 0x80) << "at " << i + k;
    i += length;
  }
}

TEST_F(CliTest, MissingDataFileIsNamed) {
  const auto result =
      tandem("train --config " + write_config().string() + " --set data.train_path=nowhere.txt");
  expect_error(result, {"nowhere.txt", "no such file"});
}

TEST_F(CliTest, ConfigTypoIsNamedWithASuggestion) {
  const auto result = tandem("train --config " + write_config().string() + " --set train.stepz=5");
  expect_error(result, {"train.stepz", "did you mean 'steps'"});
}

TEST_F(CliTest, MalformedConfigFileIsNamed) {
  write_file_atomic(dir_ / "bad.json", "{\"model\": {\"n_layer\": 2,}\n");
  expect_error(tandem("train --config " + (dir_ / "bad.json").string()), {"bad.json"});
}

TEST_F(CliTest, ShardWithWrongMagicIsNamed) {
  std::vector<int32_t> header(256, 0);
  header[0] = 12345;
  header[1] = 1;
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  write_file_atomic(dir_ / "bad.bin", bytes);
  const auto result = tandem("train --config " + write_config().string() +
                             " --set data.train_path=" + (dir_ / "bad.bin").string());
  expect_error(result, {"bad.bin", "magic"});
}

TEST_F(CliTest, TruncatedShardIsNamed) {
  std::vector<int32_t> tokens(5000, 65);
  write_token_shard(dir_ / "cut.bin", tokens, ShardTokenType::kUint16);
  fs::resize_file(dir_ / "cut.bin", 1024 + 2 * 4000);
  const auto result = tandem("train --config " + write_config().string() +
                             " --set data.train_path=" + (dir_ / "cut.bin").string());
  expect_error(result, {"cut.bin", "truncated"});
}

TEST_F(CliTest, TokenizeWritesAShardThatTrains) {
  const fs::path shard = dir_ / "data.bin";
  ASSERT_EQ(
      tandem("tokenize --input " + (dir_ / "data.txt").string() + " --output " + shard.string())
          .exit_code,
      0);
  const auto result = tandem("train --config " + write_config().string() +
                             " --set train.steps=2 --set data.train_path=" + shard.string());
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

// tokenize streams the text (a shard byte for byte that of the whole text's tokens), will
// not write over its own input, and says when the input is not text.
TEST_F(CliTest, TokenizeNeverReplacesItsInputAndSaysWhenItIsNotText) {
  const std::string text = read_file_text(dir_ / "data.txt");
  ASSERT_EQ(tandem("tokenize --input " + (dir_ / "data.txt").string() + " --output " +
                   (dir_ / "data.bin").string())
                .exit_code,
            0);
  EXPECT_EQ(read_token_shard(dir_ / "data.bin"), ByteTokenizer().encode(text));
  // The same file under another name.
  const auto same = tandem("tokenize --input " + (dir_ / "data.txt").string() + " --output " +
                           (dir_ / "." / "data.txt").string());
  EXPECT_NE(same.exit_code, 0);
  EXPECT_CONTAINS(same.output, "is the --input file; writing the shard would replace the text");
  EXPECT_EQ(read_file_text(dir_ / "data.txt"), text);
  write_file_atomic(dir_ / "binary.dat", std::string("ab\0cd", 5));
  const auto binary = tandem("tokenize --input " + (dir_ / "binary.dat").string() + " --output " +
                             (dir_ / "binary.bin").string());
  EXPECT_EQ(binary.exit_code, 0) << binary.output;
  EXPECT_CONTAINS(binary.output, "holds a NUL byte (the first at byte 2): it is not text");
  EXPECT_EQ(read_token_shard(dir_ / "binary.bin"), (std::vector<int32_t>{'a', 'b', 0, 'c', 'd'}));
}

// A plan beyond the machine's memory is refused before anything is allocated, naming the
// figures and the flag that allows it (a 1.5 B-parameter GPT-2 in fp32 on the cpu device
// needs about 85 GiB; this machine has less).
TEST_F(CliTest, APlanBeyondTheMachinesMemoryIsRefusedUnlessAllowed) {
  if (host_memory_bytes() >= (size_t{80} << 30)) GTEST_SKIP() << "this machine has 80 GiB or more";
  const auto result =
      tandem("train --config " + (testing::source_dir() / "configs/gpt2-1.5b.json").string() +
             " --set device.type=cpu --set device.memory_gb=200 --set bf16.enabled=false"
             " --set train.checkpoint_memory_mb=256 --set data.train_path=" +
             (dir_ / "data.txt").string() + " --set train.output_dir=" + (dir_ / "big").string());
  expect_error(result,
               {"of host memory (pinned ", "more than the machine's",
                "lower train.checkpoint_memory_mb", "pass --allow-host-overcommit to run anyway"});
  EXPECT_FALSE(fs::exists(dir_ / "big" / "checkpoints"));
  // Under the default (0: what the machine has left) that setting would take nothing off:
  // the message does not offer it.
  const auto automatic =
      tandem("train --config " + (testing::source_dir() / "configs/gpt2-1.5b.json").string() +
             " --set device.type=cpu --set device.memory_gb=200 --set bf16.enabled=false"
             " --set data.train_path=" +
             (dir_ / "data.txt").string() + " --set train.output_dir=" + (dir_ / "big").string());
  expect_error(automatic, {"more than the machine's", "pass --allow-host-overcommit"});
  EXPECT_EQ(automatic.output.find("checkpoint_memory_mb"), std::string::npos) << automatic.output;
}

TEST_F(CliTest, CorruptCheckpointIsRefusedAndKept) {
  const fs::path config = write_config();
  ASSERT_EQ(tandem("train --config " + config.string() + " --set train.steps=3").exit_code, 0);
  const fs::path weights = dir_ / "run/checkpoints/step_00000003/model.safetensors";
  std::vector<uint8_t> bytes = read_file_bytes(weights);
  bytes[bytes.size() / 2] ^= 0x40;
  write_file_atomic(weights, bytes);

  expect_error(tandem("sample --checkpoint " + (dir_ / "run").string()),
               {"model.safetensors", "checksum mismatch"});
  expect_error(tandem("train --config " + config.string() + " --set train.steps=6 --resume " +
                      (dir_ / "run").string()),
               {"model.safetensors", "checksum mismatch"});
  // Nothing was overwritten: the damaged checkpoint is still there, as it was.
  EXPECT_EQ(read_file_bytes(weights), bytes);
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoints/step_00000006"));
}

// sample of a run directory chooses as --resume does: a damaged newest checkpoint is passed
// over, naming it and why, for the newest intact one; with none intact it names them all.
// (Only the files sample reads count: damaged optimizer state does not stop it.)
TEST_F(CliTest, SampleFallsBackFromADamagedNewestCheckpointNamingBoth) {
  const fs::path config = write_config({{"train", {{"checkpoint_interval", 2}}}});
  ASSERT_EQ(tandem("train --config " + config.string() + " --set train.steps=4").exit_code, 0);
  const fs::path root = dir_ / "run/checkpoints";
  const std::string run = (dir_ / "run").string();
  const auto intact = tandem("sample --checkpoint " + run + " --bytes 20 --seed 3");
  ASSERT_EQ(intact.exit_code, 0) << intact.output;
  EXPECT_EQ(intact.output.find("damaged"), std::string::npos) << intact.output;

  const fs::path newest = root / "step_00000004/model.safetensors";
  std::vector<uint8_t> bytes = read_file_bytes(newest);
  bytes[bytes.size() / 2] ^= 0x40;
  write_file_atomic(newest, bytes);
  const auto fallback = tandem("sample --checkpoint " + run + " --bytes 20 --seed 3");
  ASSERT_EQ(fallback.exit_code, 0) << fallback.output;
  EXPECT_CONTAINS(fallback.output,
                  "tandem: step_00000004 is damaged (" + newest.string() + ": checksum mismatch");
  EXPECT_CONTAINS(fallback.output, "; sampling from step_00000002 instead\n");
  // The same text as sampling from step 2 by name.
  const auto by_name =
      tandem("sample --checkpoint " + (root / "step_00000002").string() + " --bytes 20 --seed 3");
  ASSERT_EQ(by_name.exit_code, 0) << by_name.output;
  EXPECT_EQ(fallback.output.substr(fallback.output.find(" instead\n") + 9), by_name.output);
  // Named on its own, the damaged one is refused, naming the intact one beside it.
  expect_error(tandem("sample --checkpoint " + (root / "step_00000004").string()),
               {"checksum mismatch",
                (root / "step_00000002").string() + " (step 2) verifies: sample from it"});
  // Damaged optimizer state is not what sample reads.
  const fs::path optimizer = root / "step_00000002/optimizer.safetensors";
  ASSERT_TRUE(fs::exists(optimizer));
  std::vector<uint8_t> state = read_file_bytes(optimizer);
  state[state.size() / 2] ^= 0x40;
  write_file_atomic(optimizer, state);
  EXPECT_EQ(tandem("sample --checkpoint " + run + " --bytes 20 --seed 3").output, fallback.output);

  // None intact: one error naming every checkpoint tried.
  fs::resize_file(root / "step_00000002/model.safetensors", 100);
  expect_error(tandem("sample --checkpoint " + run),
               {"no checkpoint verifies (", (root / "step_00000004").string(),
                (root / "step_00000002").string(), "no intact checkpoint to sample from"});
}

TEST_F(CliTest, FreshRunRefusesToOverwriteAnEarlierRun) {
  const fs::path config = write_config();
  ASSERT_EQ(tandem("train --config " + config.string() + " --set train.steps=2").exit_code, 0);
  const fs::path weights = dir_ / "run/checkpoints/step_00000002/model.safetensors";
  const std::vector<uint8_t> before = read_file_bytes(weights);
  expect_error(tandem("train --config " + config.string() + " --set train.steps=2"),
               {"already holds checkpoints", "--resume"});
  EXPECT_EQ(read_file_bytes(weights), before);
}

// Every command-line value is checked, and the message names it: counts that must be
// positive or non-negative, a directory where a file is needed, an unknown command, an
// empty file to tokenize; more threads than CPUs is a warning.
TEST_F(CliTest, EveryBadCommandLineValueIsNamed) {
  const std::string config = write_config().string();
  write_file_atomic(dir_ / "empty.txt", "");
  const std::string d = dir_.path().string();
  const struct {
    std::string args, wanted;
  } cases[] = {
      {"foo --config " + config, "unknown command 'foo'; the commands are train, "},
      {"bench foo",
       "unknown command 'bench foo'; the commands of 'tandem bench' are plan, adamw, "},
      {"train --config " + d, d + ": is a directory; name a file"},
      {"train --config " + config + " --stop-at-step -3",
       "--stop-at-step: must be a number >= 0, got -3"},
      {"train --config " + config + " --metrics " + d, "--metrics " + d + ": is a directory"},
      {"tokenize --input " + (dir_ / "empty.txt").string() + " --output " + d + "/x.bin",
       "the file is empty; there is nothing to tokenize"},
      {"tokenize --input " + d + " --output " + d + "/x.bin", ": is a directory; name a file"},
      {"tokenize --input /dev/zero --output " + d + "/x.bin",
       "--input /dev/zero: is not a regular file (a device or a pipe)"},
      {"tokenize --input " + (dir_ / "data.txt").string() + " --output " + d + "/no/x.bin",
       "its directory " + d + "/no does not exist; create it first"},
      {"tokenize --input " + (dir_ / "data.txt").string() + " --output " + d,
       "--output " + d + ": is a directory"},
      {"sample --checkpoint " + d + " --temperature -1", "--temperature: must be a number >= 0"},
      {"plan --config " + config + " --world-size 0", "--world-size: must be a number > 0"},
      // What plan shows, train does: a snapshot pool below its minimum is refused by both.
      {"plan --config " + config + " --set train.checkpoint_memory_mb=0.01",
       "a pool to stream it through needs at least 64.00 KiB; raise train.checkpoint_memory_mb"},
      {"plan --config " + config + " --set device.memory_gb=1e30",
       "device.memory_gb must be a number > 0 and at most 1048576, got 1e+30"},
      // Every update already on the CPU: the advice does not offer to offload more.
      {"plan --config " + config +
           " --set device.memory_gb=0.00001 --set offload_optimizer.schedule=cpu",
       "but device.memory_gb = 1e-05; raise device.memory_gb, lower "
       "train_micro_batch_size_per_gpu"},
  };
  for (const auto& c : cases) {
    const testing::CommandResult result = tandem(c.args);
    EXPECT_NE(result.exit_code, 0) << c.args;
    EXPECT_CONTAINS(result.output, c.wanted) << c.args;
    EXPECT_EQ(result.output.find("internal error"), std::string::npos) << c.args;
  }
  const unsigned cpus = std::thread::hardware_concurrency();
  const testing::CommandResult threads =
      tandem(cat("bench adamw --params 1e4 --repetitions 1 --threads ", 2 * cpus + 1));
  EXPECT_EQ(threads.exit_code, 0) << threads.output;
  EXPECT_CONTAINS(threads.output, cat("is more than this machine's ", cpus, " CPUs"));
}

TEST_F(CliTest, BenchAdamWPrintsOneJsonObjectWithTheRatio) {
  const auto result = tandem(
      "bench adamw --params 100000 --grad-dtype bf16 --param-dtype fp16 "
      "--threads 2 --repetitions 2 --json");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto json = nlohmann::json::parse(result.output);
  for (const char* key : {"params_per_s", "gb_per_s", "triad_gb_per_s", "ratio"}) {
    ASSERT_TRUE(json.contains(key)) << key;
    EXPECT_GT(json[key].get<double>(), 0.0) << key;
  }
  EXPECT_EQ(json["bytes_per_param"], 28.0);
  EXPECT_EQ(json["threads"], 2);
  EXPECT_NEAR(json["ratio"].get<double>(),
              json["gb_per_s"].get<double>() / json["triad_gb_per_s"].get<double>(), 1e-9);
}

TEST_F(CliTest, BenchAdamWRefusesAnUnknownDtype) {
  const auto result = tandem("bench adamw --params 1000 --grad-dtype fp8");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("--grad-dtype"), std::string::npos) << result.output;
}

TEST_F(CliTest, PlanPrintsTiersScheduleAndPrediction) {
  const auto result = tandem("plan --config " + write_config().string() +
                             " --set offload_optimizer.schedule=interleave"
                             " --set zero_optimization.sub_group_size=2000");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const char* part : {"schedule: interleave", "device-staged",
                           "device:", "pinned host:", "host:", "predicted update time:"})
    EXPECT_NE(result.output.find(part), std::string::npos) << part << " in " << result.output;
}

// DeMo at compression_topk 32 on the tiny model, whose layer norms and 16-wide biases have
// DCT blocks of 16: clamped per tensor, as the reference does (a refused config before),
// and said in one line by `tandem plan` and at the start of the run.
TEST_F(CliTest, DemoClampsTheTopkToSmallerBlocksAndSaysSo) {
  const fs::path config =
      write_config({{"optimizer", {{"type", "DeMo"}, {"params", {{"compression_topk", 32}}}}}});
  const std::string note =
      "DeMo: optimizer.params.compression_topk 32 is clamped to the DCT block of 14 tensors "
      "(sent whole, as the reference does): ";
  const auto plan = tandem("plan --config " + config.string());
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_CONTAINS(plan.output, note);
  const std::string line = plan.output.substr(plan.output.find(note));
  EXPECT_CONTAINS(line.substr(0, line.find('\n')), " (16), ");
  EXPECT_CONTAINS(line.substr(0, line.find('\n')), " and 10 more");
  const auto run = tandem("train --config " + config.string() + " --set train.steps=2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_CONTAINS(run.output, "tandem: " + note);
  // Where every block holds compression_topk coefficients, nothing is said.
  const auto fits =
      tandem("plan --config " + config.string() + " --set optimizer.params.compression_topk=16");
  ASSERT_EQ(fits.exit_code, 0) << fits.output;
  EXPECT_EQ(fits.output.find("clamped"), std::string::npos) << fits.output;
}

TEST_F(CliTest, PlanShowsOneRankOfADataParallelRun) {
  const std::string config = write_config().string();
  const auto result = tandem("plan --config " + config +
                             " --world-size 3 --rank 1 --set zero_optimization.stage=2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // On the cpu device the ranks time the update together, as a run's ranks on one machine's
  // cores would: 3, or as many as this machine has CPUs (at least 2).
  const std::string together =
      cat("each the slowest of ", ranks_planning_here(3), " ranks measuring at once");
  for (const std::string& part :
       {std::string("rank 1 of 3"), std::string("ZeRO stage 2 over 3 ranks: this rank updates"),
        std::string("memory per tier (per rank)"), together})
    EXPECT_NE(result.output.find(part), std::string::npos) << part << " in " << result.output;
  // A plan for many ranks measures with no more ranks than this machine's CPUs.
  const auto many = tandem("plan --config " + config + " --world-size 4096");
  ASSERT_EQ(many.exit_code, 0) << many.output;
  EXPECT_CONTAINS(many.output, cat("each the slowest of ", ranks_planning_here(4096), " ranks"));
  expect_error(tandem("plan --config " + config + " --world-size 2 --rank 2"),
               {"--rank 2 is not a rank of --world-size 2"});
}

TEST_F(CliTest, PlanChoosesAutoSettingsAndShowsTheRunnersUp) {
  const std::string autos =
      " --set train_batch_size=8 --set train_micro_batch_size_per_gpu=auto"
      " --set gradient_accumulation_steps=auto --set activation_checkpointing.interval=auto";
  const auto result = tandem("plan --config " + write_config().string() + autos);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const char* part : {"step plan: 8 sequences (128 tokens) per optimizer step",
                           "measured on the cpu device", "chosen: micro-batch", "runner-up 1: ",
                           "exposed update", "memory per tier", "largest micro-batch that fits"})
    EXPECT_NE(result.output.find(part), std::string::npos) << part << " in " << result.output;
  // The same batch in tokens, over 2 ranks at stage 2, planned by 2 in-process ranks: each
  // candidate's communication at the rate they measure.
  const auto ranks =
      tandem("plan --config " + write_config().string() +
             " --set train_batch_tokens=128 --set train_micro_batch_size_per_gpu=auto"
             " --set gradient_accumulation_steps=auto"
             " --set zero_optimization.stage=2 --world-size 2");
  ASSERT_EQ(ranks.exit_code, 0) << ranks.output;
  for (const char* part :
       {"step plan: 4 sequences (64 tokens) per optimizer step and rank",
        "communication between the 2 ranks measured: local all-reduce", "+ communication ",
        // Both ranks calibrate, as a run's ranks on this machine's cores do.
        "2 ranks in step, the slowest's, median of 5 passes",
        "each the slowest of 2 ranks measuring at once"})
    EXPECT_NE(ranks.output.find(part), std::string::npos) << part << " in " << ranks.output;
  // The modelled GPU plans from its assumed FLOPs.
  const auto modelled = tandem("plan --config " + write_config().string() + autos +
                               " --set device.type=cuda --set bf16.enabled=true");
  ASSERT_EQ(modelled.exit_code, 0) << modelled.output;
  if (cuda_device_count() == 0) {
    EXPECT_NE(modelled.output.find("TFLOPS of model FLOPs"), std::string::npos) << modelled.output;
  }
  expect_error(tandem("plan --config " + write_config().string() +
                      " --set train_micro_batch_size_per_gpu=auto"),
               {"train_batch_size is not set"});
}

// The planner's choice against the grid it chose from, each candidate trained (the numbers
// are the benchmark's to judge; here: every candidate ran, and recompute changed no bit).
TEST_F(CliTest, BenchPlanTrainsEveryCandidate) {
  const auto result = tandem(
      "bench plan --json --rounds 1 --steps 1 --warmup 0 --config " + write_config().string() +
      " --set train_batch_size=4 --set train_micro_batch_size_per_gpu=auto"
      " --set gradient_accumulation_steps=auto --set activation_checkpointing.interval=auto");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::json report =
      nlohmann::json::parse(result.output.substr(result.output.rfind("\n{") + 1));
  ASSERT_EQ(report["rows"].size(), 9u) << report;  // 1x4, 2x2, 4x1, each with 3 recomputes
  std::map<int, std::string> digest_of_split;
  for (const nlohmann::json& row : report["rows"]) {
    EXPECT_GT(row["measured_tokens_per_s"].get<double>(), 0) << row;
    EXPECT_GT(row["predicted_tokens_per_s"].get<double>(), 0) << row;
    const auto [it, first] = digest_of_split.emplace(row["micro_batch"].get<int>(),
                                                     row["state_digest"].get<std::string>());
    if (!first) {
      EXPECT_EQ(it->second, row["state_digest"]) << row;
    }
  }
  const double ratio = report["chosen_to_best_measured"].get<double>();
  EXPECT_GT(ratio, 0);
  EXPECT_LE(ratio, 1);
  expect_error(tandem("bench plan --config " + write_config().string()),
               {"has none", "train_batch_size"});
}

// Over in-process ranks: the ranks plan (the communication costed) and train every candidate.
TEST_F(CliTest, BenchPlanOverRanksCostsTheirCommunication) {
  const auto result =
      tandem("bench plan --json --rounds 1 --steps 1 --warmup 0 --world-size 2 --config " +
             write_config().string() +
             " --set train_batch_size=8 --set train_micro_batch_size_per_gpu=auto"
             " --set gradient_accumulation_steps=auto --set zero_optimization.stage=2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::json report =
      nlohmann::json::parse(result.output.substr(result.output.rfind("\n{") + 1));
  EXPECT_EQ(report["world_size"], 2);
  EXPECT_CONTAINS(report["plan"].get<std::string>(),
                  "communication between the 2 ranks measured: local all-reduce");
  ASSERT_EQ(report["rows"].size(), 3u) << report;  // 4 sequences a rank: 1x4, 2x2, 4x1
  for (const nlohmann::json& row : report["rows"]) {
    EXPECT_GT(row["measured_tokens_per_s"].get<double>(), 0) << row;
    EXPECT_EQ(row["micro_batch"].get<int>() * row["gradient_accumulation_steps"].get<int>(), 4);
  }
}

TEST_F(CliTest, ADeviceTooSmallStopsBeforeTraining) {
  const fs::path config = write_config();
  const std::string too_small = " --set device.memory_gb=0.0001";
  expect_error(tandem("plan --config " + config.string() + too_small),
               {"device memory too small", "device.memory_gb"});
  expect_error(tandem("train --config " + config.string() + too_small),
               {"device memory too small", "device.memory_gb"});
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoints"));
  // The CPU schedule keeps the optimizer state off the device and fits where
  // the default does not.
  const auto fits = tandem("train --config " + config.string() +
                           " --set train.steps=2 --set device.memory_gb=0.0012"
                           " --set offload_optimizer.schedule=cpu");
  EXPECT_EQ(fits.exit_code, 0) << fits.output;
}

TEST_F(CliTest, TraceHasALanePerKindOfWorkAndASlicePerSubgroup) {
  const fs::path trace = dir_ / "trace.json";
  const auto result = tandem("train --config " + write_config().string() +
                             " --set train.steps=4 --set offload_optimizer.schedule=interleave"
                             " --set zero_optimization.sub_group_size=3000 --trace " +
                             trace.string() + " --trace-steps 2-3");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto events = nlohmann::json::parse(read_file_text(trace))["traceEvents"];
  std::map<int, std::string> lanes;
  for (const auto& e : events)
    if (e["ph"] == "M" && e["name"] == "thread_name") lanes[e["tid"]] = e["args"]["name"];
  std::map<std::string, int> slices_per_lane;
  std::set<std::string> subgroups_updated;
  for (const auto& e : events) {
    if (e["ph"] != "X") continue;
    slices_per_lane[lanes.at(e["tid"])]++;
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    const std::string name = e["name"];
    if (name.ends_with(" adamw")) subgroups_updated.insert(name.substr(0, name.size() - 6));
  }
  for (const char* lane :
       {"compute", "host-to-device", "device-to-host", "cpu update", "device update", "update"})
    EXPECT_GT(slices_per_lane[lane], 0) << lane;
  EXPECT_EQ(slices_per_lane["update"], 2);  // two traced steps
  // The tiny model has ~11k parameters: 4 subgroups of 3000, every one updated.
  EXPECT_EQ(subgroups_updated.size(), 4u);
}

TEST_F(CliTest, GpuBenchmarksSayWhyTheyCannotRunWithoutAGpu) {
  std::string why;
  if (cuda_device_count(&why) > 0)
    GTEST_SKIP() << "a GPU is present; this test is for machines without one";
  for (const char* command : {"bench pcie --bytes 1000", "bench adamw --device cuda --params 1000"})
    expect_error(tandem(command), {"cannot use a CUDA GPU", "device.type"});
  expect_error(tandem("train --config " + write_config().string() + " --set device.type=cuda"),
               {"cannot use a CUDA GPU", "device.type"});
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoints"));
}

TEST_F(CliTest, BenchDemoReportsTheStepAndTheDctAgainstSgemm) {
  const auto result = tandem("bench demo --json --repetitions 1 --threads 1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto json = nlohmann::json::parse(result.output);
  EXPECT_EQ(json["params"].get<int64_t>(), 7084800);  // one GPT-2 small layer's tensors
  for (const char* key : {"step_seconds", "params_per_s", "dct_gflop_per_s", "sgemm_gflop_per_s"})
    EXPECT_GT(json[key].get<double>(), 0.0) << key;
  EXPECT_DOUBLE_EQ(json["dct_to_sgemm"].get<double>(),
                   json["dct_gflop_per_s"].get<double>() / json["sgemm_gflop_per_s"].get<double>());
  EXPECT_EQ(json["threads"].get<int>(), 1);
}

TEST_F(CliTest, BenchStepReportsThroughputAndPhasesWithoutWritingCheckpoints) {
  const auto result = tandem("bench step --config " + write_config().string() +
                             " --steps 3 --warmup 1 --json --set offload_optimizer.schedule=cpu");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto json = nlohmann::json::parse(result.output);
  for (const char* key : {"tokens_per_s", "ms", "forward_ms", "backward_ms", "update_ms"})
    EXPECT_GT(json[key].get<double>(), 0.0) << key;
  // Forward and backward are parts of their step's time, so each one's median is at most
  // the median step (their sum need not be: medians of different steps). The update is not:
  // it counts its time hidden behind the next step's forward too (overlap_forward), which a
  // loaded machine can stretch past a whole step.
  for (const char* key : {"forward_ms", "backward_ms"})
    EXPECT_LE(json[key].get<double>(), json["ms"].get<double>()) << key;
  // Every step's loss, warm-up included.
  ASSERT_EQ(json["losses"].size(), 4u);
  for (const auto& loss : json["losses"]) EXPECT_TRUE(std::isfinite(loss.get<double>()));
  EXPECT_EQ(json["schedule"], "cpu");
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoints"));
}

// Training on the CPU gives the same bits for any OpenMP thread count: every kernel's
// reductions run in an order the thread count does not change, OpenBLAS's products
// included (compute/cpu/matmul.cc; they differed between 1 and 2 threads before). The
// products here have 256 rows, two of matmul's row blocks.
TEST_F(CliTest, TrainingGivesTheSameBitsForAnyThreadCount) {
  const fs::path config =
      write_config({{"model", {{"n_embd", 64}, {"context_length", 64}}},
                    {"train", {{"seq_len", 64}, {"steps", 3}, {"eval_interval", 0}}}});
  std::vector<uint8_t> first_model, first_optimizer;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(cat(threads, " threads"));
    const fs::path out = dir_ / cat("threads", threads);
    const auto result =
        run_command(cat("OMP_NUM_THREADS=", threads, " ", kTandem, " train --config ",
                        config.string(), " --set train.output_dir=", out.string(), " </dev/null"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const fs::path checkpoint = out / "checkpoints" / "step_00000003";
    const std::vector<uint8_t> model = read_file_bytes(checkpoint / "model.safetensors");
    const std::vector<uint8_t> optimizer = read_file_bytes(checkpoint / "optimizer.safetensors");
    ASSERT_FALSE(model.empty());
    if (first_model.empty()) {
      first_model = model;
      first_optimizer = optimizer;
      continue;
    }
    EXPECT_TRUE(model == first_model) << "the weights differ from the 1-thread run's";
    EXPECT_TRUE(optimizer == first_optimizer)
        << "the optimizer state differs from the 1-thread run's";
  }
}

// Test binaries find the repository from where they are, not from the path they were
// built at: the GPU machine runs them from a checkout at another path.
TEST(SourceDir, TheRepositoryIsFoundAboveTheBinary) {
  ScratchDir dir("source_dir");
  fs::create_directories(dir / "data");
  fs::create_directories(dir / "gpu-payload" / "bin");
  write_file_atomic(dir / "data" / "tinyshakespeare.txt", "x");
  EXPECT_TRUE(testing::repository_above(dir / "gpu-payload" / "bin").empty())
      << "no CMakeLists.txt: not a repository";
  write_file_atomic(dir / "CMakeLists.txt", "x");
  EXPECT_EQ(testing::repository_above(dir / "gpu-payload" / "bin"), dir.path());
  EXPECT_EQ(testing::repository_above(dir.path()), dir.path());
  EXPECT_TRUE(fs::exists(testing::source_dir() / "configs" / "shakespeare-char.json"));
}

}  // namespace
}  // namespace tandem
