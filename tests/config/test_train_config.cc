// Run configuration: parsing, defaults, round trip, overrides, and the wording of errors
// (a config error is only useful if it names the key and says what would be accepted).

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/config/train_config.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/model/model_config.h"
#include "tandem/optim/adamw/adamw_rule.h"

namespace tandem {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

json full_config() {
  return json::parse(R"({
    "$schema": "https://example.com/tandem.schema.json",
    "comment": "a note",
    "model": {"vocab_size": 256, "context_length": 128, "n_layer": 4, "n_head": 4, "n_embd": 128},
    "data": {"train_path": "data/tinyshakespeare.txt", "val_path": "", "val_fraction": 0.1},
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.5,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.99], "eps": 1e-8,
                                              "weight_decay": 0.05, "_comment": "x"}},
    "scheduler": {"type": "WarmupCosineLR",
                  "params": {"warmup_num_steps": 100, "cos_min_ratio": 0.2}},
    "train": {"steps": 2000, "seed": 42, "seq_len": 64, "eval_interval": 250,
              "eval_batches": 7, "checkpoint_interval": 1000, "log_interval": 5,
              "output_dir": "runs/x", "sample_bytes": 100}
  })");
}

json minimal_config() { return json{{"data", {{"train_path", "data/t.txt"}}}}; }

// The message of the tandem::Error that parsing `config` throws ("" if none).
std::string parse_error(const json& config) {
  try {
    parse_train_config(config);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// parse_error of the minimal config with one override applied.
std::string error_with(const std::string& assignment) {
  json config = minimal_config();
  apply_config_override(config, assignment);
  return parse_error(config);
}

void expect_same(const TrainConfig& a, const TrainConfig& b) {
  EXPECT_EQ(a.model.vocab_size, b.model.vocab_size);
  EXPECT_EQ(a.model.context_length, b.model.context_length);
  EXPECT_EQ(a.model.n_layer, b.model.n_layer);
  EXPECT_EQ(a.model.n_head, b.model.n_head);
  EXPECT_EQ(a.model.n_embd, b.model.n_embd);
  EXPECT_EQ(a.data.train_path, b.data.train_path);
  EXPECT_EQ(a.data.val_path, b.data.val_path);
  EXPECT_EQ(a.data.val_fraction, b.data.val_fraction);
  // Exact float equality on purpose: the round trip must not lose a bit.
  EXPECT_EQ(a.optimizer.lr, b.optimizer.lr);
  // The type's own settings (floats written as the shortest decimal that reads back).
  EXPECT_EQ(to_json(a)["optimizer"], to_json(b)["optimizer"]);
  EXPECT_EQ(a.optimizer.weight_decay, b.optimizer.weight_decay);
  EXPECT_EQ(a.scheduler.warmup_num_steps, b.scheduler.warmup_num_steps);
  EXPECT_EQ(a.scheduler.cos_min_ratio, b.scheduler.cos_min_ratio);
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.train.seed, b.train.seed);
  EXPECT_EQ(a.train.seq_len, b.train.seq_len);
  EXPECT_EQ(a.train.eval_interval, b.train.eval_interval);
  EXPECT_EQ(a.train.eval_batches, b.train.eval_batches);
  EXPECT_EQ(a.train.checkpoint_interval, b.train.checkpoint_interval);
  EXPECT_EQ(a.train.log_interval, b.train.log_interval);
  EXPECT_EQ(a.train.output_dir, b.train.output_dir);
  EXPECT_EQ(a.train.sample_bytes, b.train.sample_bytes);
  EXPECT_EQ(a.train.checkpoint_memory_mb, b.train.checkpoint_memory_mb);
  EXPECT_EQ(a.offload.schedule, b.offload.schedule);
  EXPECT_EQ(a.offload.sub_group_size, b.offload.sub_group_size);
  EXPECT_EQ(a.offload.ratio, b.offload.ratio);
  EXPECT_EQ(a.offload.stride, b.offload.stride);
  EXPECT_EQ(a.offload.staging_buffers, b.offload.staging_buffers);
  EXPECT_EQ(a.device.type, b.device.type);
  EXPECT_EQ(a.device.memory_gb, b.device.memory_gb);
  EXPECT_EQ(a.bf16, b.bf16);
  EXPECT_EQ(a.micro_batch_size, b.micro_batch_size);
  EXPECT_EQ(a.gradient_accumulation_steps, b.gradient_accumulation_steps);
  EXPECT_EQ(a.gradient_clipping, b.gradient_clipping);
}

// A file in a fresh temporary directory, removed with it.
class TempFile {
 public:
  explicit TempFile(const std::string& contents) {
    dir_ = fs::temp_directory_path() / ("tandem_test_train_config_" + std::to_string(::getpid()) +
                                        "_" + std::to_string(counter_++));
    fs::create_directories(dir_);
    path_ = dir_ / "config.json";
    std::ofstream(path_) << contents;
  }
  ~TempFile() { fs::remove_all(dir_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path dir_, path_;
};

// ---- ModelConfig -------------------------------------------------------------------------

TEST(ModelConfig, NumParametersMatchesGpt2Small) {
  // GPT-2 124M with llm.c's padded vocabulary: the well-known 124,475,904.
  ModelConfig c{
      .vocab_size = 50304, .context_length = 1024, .n_layer = 12, .n_head = 12, .n_embd = 768};
  EXPECT_EQ(c.num_parameters(), 124475904);
  // And the unpadded 50257 vocabulary: 124,439,808 (Hugging Face's count).
  c.vocab_size = 50257;
  EXPECT_EQ(c.num_parameters(), 124439808);
}

TEST(ModelConfig, NumParametersSmall) {
  const ModelConfig c{
      .vocab_size = 10, .context_length = 4, .n_layer = 2, .n_head = 1, .n_embd = 2};
  // wte 20 + wpe 8 + 2 layers * (12*4 + 13*2 = 74) + final LayerNorm 4.
  EXPECT_EQ(c.num_parameters(), 20 + 8 + 2 * 74 + 4);
}

TEST(ModelConfig, ValidateAcceptsDefaults) { EXPECT_NO_THROW(ModelConfig{}.validate()); }

TEST(ModelConfig, ValidateNamesFieldAndAllowedHeads) {
  ModelConfig c;
  c.n_head = 5;
  try {
    c.validate();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model.n_head = 5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.n_embd = 384"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1, 2, 3, 4, 6, 8, 12"), std::string::npos) << msg;
  }
}

TEST(ModelConfig, ValidateRanges) {
  const auto message = [](ModelConfig c) -> std::string {
    try {
      c.validate();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  ModelConfig c;
  c.vocab_size = 0;
  EXPECT_NE(message(c).find("model.vocab_size = 0"), std::string::npos) << message(c);
  c = ModelConfig{};
  c.vocab_size = (1 << 24) + 1;
  EXPECT_NE(message(c).find("16777216"), std::string::npos) << message(c);
  c = ModelConfig{};
  c.context_length = -3;
  EXPECT_NE(message(c).find("model.context_length"), std::string::npos);
  c = ModelConfig{};
  c.n_layer = 0;
  EXPECT_NE(message(c).find("model.n_layer"), std::string::npos);
  c = ModelConfig{};
  c.n_embd = 0;
  EXPECT_NE(message(c).find("model.n_embd"), std::string::npos);
  c = ModelConfig{};
  c.n_head = 0;
  EXPECT_NE(message(c).find("model.n_head"), std::string::npos);
}

// ---- parse_train_config ----------------------------------------------------------------

TEST(ParseTrainConfig, FullConfig) {
  const TrainConfig c = parse_train_config(full_config());
  EXPECT_EQ(c.model.vocab_size, 256);
  EXPECT_EQ(c.model.context_length, 128);
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.n_embd, 128);
  EXPECT_EQ(c.data.train_path, "data/tinyshakespeare.txt");
  EXPECT_EQ(c.data.val_path, "");
  EXPECT_EQ(c.data.val_fraction, 0.1);
  EXPECT_EQ(c.micro_batch_size, 16);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.gradient_clipping, 0.5f);
  EXPECT_EQ(c.optimizer.lr, 3e-4);  // as written: a double
  EXPECT_EQ(own_settings<AdamWSettings>(c.optimizer).beta1, 0.9f);
  EXPECT_EQ(own_settings<AdamWSettings>(c.optimizer).beta2, 0.99f);
  EXPECT_EQ(own_settings<AdamWSettings>(c.optimizer).eps, 1e-8f);
  EXPECT_EQ(c.optimizer.weight_decay, 0.05);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 100);
  EXPECT_EQ(c.scheduler.cos_min_ratio, 0.2);
  EXPECT_EQ(c.train.steps, 2000);
  EXPECT_EQ(c.train.seed, 42u);
  EXPECT_EQ(c.train.seq_len, 64);
  EXPECT_EQ(c.seq_len(), 64);
  EXPECT_EQ(c.train.eval_interval, 250);
  EXPECT_EQ(c.train.eval_batches, 7);
  EXPECT_EQ(c.train.checkpoint_interval, 1000);
  EXPECT_EQ(c.train.log_interval, 5);
  EXPECT_EQ(c.train.output_dir, "runs/x");
  EXPECT_EQ(c.train.sample_bytes, 100);
}

TEST(ParseTrainConfig, DefaultsWhenKeysAbsent) {
  const TrainConfig c = parse_train_config(minimal_config());
  TrainConfig expected;
  expected.data.train_path = "data/t.txt";
  expect_same(c, expected);
  EXPECT_EQ(c.seq_len(), c.model.context_length);
}

TEST(ParseTrainConfig, EmptySectionsAndCaseInsensitiveOptimizerType) {
  json config = minimal_config();
  config["model"] = json::object();
  config["train"] = json::object();
  config["optimizer"] = {{"type", "adamw"}};
  config["scheduler"] = {{"type", "WarmupCosineLR"}, {"params", json::object()}};
  EXPECT_NO_THROW(parse_train_config(config));
}

TEST(ParseTrainConfig, IntegralFloatsAndBigSeed) {
  json config = minimal_config();
  config["train"] = {{"steps", 100.0}, {"seed", 18446744073709551615ull}};
  const TrainConfig c = parse_train_config(config);
  EXPECT_EQ(c.train.steps, 100);
  EXPECT_EQ(c.train.seed, UINT64_MAX);
}

TEST(ParseTrainConfig, RoundTripThroughJson) {
  TrainConfig c = parse_train_config(full_config());
  // Values with no short decimal form, to check that no bit is lost.
  c.optimizer.lr = 1.0 / 3.0;
  own_settings<AdamWSettings>(c.optimizer).eps = 1.17549435e-38f;
  c.scheduler.cos_min_ratio = 0.1;
  c.train.seed = UINT64_MAX - 1;
  c.data.val_path = "data/val.txt";
  c.data.val_fraction = 0.0;
  c.bf16 = true;
  const json written = to_json(c);
  EXPECT_TRUE(written["optimizer"]["params"]["betas"].is_array());
  expect_same(parse_train_config(written), c);
  // Also through text, as a run directory stores it.
  expect_same(parse_train_config(json::parse(written.dump(2))), c);
  // Short decimals stay short in the text ("0.99", not "0.9900000095367432").
  EXPECT_NE(written.dump().find("0.99"), std::string::npos);
  EXPECT_EQ(written.dump().find("0.9900000"), std::string::npos) << written.dump();
}

TEST(ParseTrainConfig, RoundTripDefaults) {
  TrainConfig c;
  // (Not `= "x"`: GCC 12 at -O3 warns falsely (-Wrestrict) on that assignment here.)
  c.data.train_path = std::string(1, 'x');
  expect_same(parse_train_config(to_json(c)), c);
}

TEST(ParseTrainConfig, UnknownKeySuggestsClosest) {
  json config = full_config();
  config["optimizer"]["params"]["lrr"] = 1e-3;
  const std::string msg = parse_error(config);
  EXPECT_NE(msg.find("unknown key 'optimizer.params.lrr'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'lr'?"), std::string::npos) << msg;
  EXPECT_NE(msg.find("allowed keys: lr, betas, eps, weight_decay"), std::string::npos) << msg;
}

TEST(ParseTrainConfig, UnknownKeyWithoutSuggestion) {
  json config = minimal_config();
  config["wandb"] = {{"project", "x"}};
  const std::string msg = parse_error(config);
  EXPECT_NE(msg.find("unknown key 'wandb'"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("did you mean"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train_micro_batch_size_per_gpu"), std::string::npos) << msg;
}

TEST(ParseTrainConfig, UnknownKeysInEachSection) {
  EXPECT_NE(error_with("model.n_layers=4").find("did you mean 'n_layer'?"), std::string::npos);
  EXPECT_NE(error_with("train.warmup=4").find("unknown key 'train.warmup'"), std::string::npos);
  EXPECT_NE(error_with("data.trainpath=x").find("did you mean 'train_path'?"), std::string::npos);
  EXPECT_NE(error_with("scheduler.params.warmup_steps=10").find("'warmup_num_steps'"),
            std::string::npos);
  // A params key one level too high points at where it belongs.
  EXPECT_NE(error_with("optimizer.lr=1e-3").find("did you mean 'optimizer.params.lr'?"),
            std::string::npos)
      << error_with("optimizer.lr=1e-3");
  // Two neighbours swapped are one slip; a key cut short is the one key it begins.
  EXPECT_NE(error_with("train.stpes=3").find("did you mean 'steps'?"), std::string::npos)
      << error_with("train.stpes=3");
  EXPECT_NE(
      error_with("train_micro_batch_size=3").find("did you mean 'train_micro_batch_size_per_gpu'?"),
      std::string::npos)
      << error_with("train_micro_batch_size=3");
}

// An integer out of range says its bound once, whether it came as a signed, an unsigned
// or a float JSON number, and one beyond int64 is refused, not clamped.
TEST(ParseTrainConfig, AnIntegerOutOfRangeSaysItsBoundOnce) {
  const std::string seq = error_with("train.seq_len=99999");
  EXPECT_NE(seq.find("train.seq_len must be an integer in [0, 256] (at most model.context_length "
                     "= 256; 0 means model.context_length), got 99999"),
            std::string::npos)
      << seq;
  const std::string steps = error_with("train.steps=1e19");
  EXPECT_NE(steps.find("train.steps must be a positive integer (at most 9223372036854775807), "
                       "got 1e+19"),
            std::string::npos)
      << steps;
  EXPECT_NE(error_with("train.steps=18446744073709551615").find("(at most 9223372036854775807)"),
            std::string::npos);
}

// Enumerated values are read without regard to case, every one of them.
TEST(ParseTrainConfig, EnumeratedValuesIgnoreCase) {
  json config = minimal_config();
  config["device"] = {{"type", "CPU"}};
  config["offload_optimizer"] = {{"schedule", "Interleave"}};
  config["train"]["checkpoint_failure"] = "Continue";
  const TrainConfig parsed = parse_train_config(config);
  EXPECT_EQ(parsed.device.type, DeviceKind::kHostOnly);
  EXPECT_EQ(parsed.offload.schedule, UpdateSchedule::kInterleave);
  EXPECT_EQ(parsed.train.checkpoint_failure, CheckpointFailure::kContinue);
}

TEST(ParseTrainConfig, CommentKeysIgnoredEverywhere) {
  json config = minimal_config();
  config["_comment"] = "top";
  config["data"]["comment"] = "data";
  config["train"] = {{"$schema", "x"}, {"comment", {1, 2}}};
  EXPECT_NO_THROW(parse_train_config(config));
}

TEST(ParseTrainConfig, TypeErrorsNameKeyTypeAndValue) {
  json config = minimal_config();
  config["train"] = {{"steps", "100"}};
  EXPECT_NE(parse_error(config).find("train.steps must be a positive integer, got \"100\" (a "
                                     "string)"),
            std::string::npos)
      << parse_error(config);
  EXPECT_NE(error_with("train.steps=100.5")
                .find("train.steps must be a positive integer, got "
                      "100.5"),
            std::string::npos);
  EXPECT_NE(error_with("train.output_dir=7").find("train.output_dir must be a string, got 7"),
            std::string::npos);
  EXPECT_NE(error_with("optimizer.params.lr=true")
                .find("optimizer.params.lr must be a number > "
                      "0, got true (a boolean)"),
            std::string::npos);
  EXPECT_NE(error_with("optimizer.params=3").find("optimizer.params must be an object"),
            std::string::npos);
  EXPECT_NE(error_with("train.seed=-1").find("train.seed must be an unsigned 64-bit integer"),
            std::string::npos);
  EXPECT_NE(error_with("train.seed=\"1\"").find("train.seed"), std::string::npos);
  EXPECT_NE(parse_error(json::array()).find("must be a JSON object"), std::string::npos);
}

TEST(ParseTrainConfig, Bf16IsAnEnabledFlag) {
  EXPECT_FALSE(parse_train_config(minimal_config()).bf16);
  json config = minimal_config();
  config["bf16"] = {{"enabled", true}};
  const TrainConfig c = parse_train_config(config);
  EXPECT_TRUE(c.bf16);
  EXPECT_EQ(c.storage_dtype(), StorageDType::kBF16);
  EXPECT_CONTAINS(error_with("bf16.enabled=1"), "bf16.enabled must be true or false, got 1");
  EXPECT_CONTAINS(error_with("bf16.enable=true"), "unknown key 'bf16.enable'");
}

TEST(ParseTrainConfig, TypeValuesListAllowed) {
  const std::string opt = error_with("optimizer.type=Lion");
  EXPECT_NE(opt.find("optimizer.type must be one of: \"AdamW\", \"DeMo\", \"SGD\""),
            std::string::npos)
      << opt;
  EXPECT_NE(opt.find("Lion"), std::string::npos) << opt;
  const std::string sched = error_with("scheduler.type=Linear");
  EXPECT_NE(sched.find("scheduler.type must be one of: \"WarmupCosineLR\""), std::string::npos)
      << sched;
}

TEST(ParseTrainConfig, RangeErrors) {
  const struct {
    const char* assignment;
    const char* expected;
  } cases[] = {
      {"optimizer.params.lr=0", "optimizer.params.lr must be a number > 0, got 0"},
      {"optimizer.params.lr=-1e-3", "optimizer.params.lr must be a number > 0"},
      {"optimizer.params.lr=1e39", "optimizer.params.lr must be a number > 0"},  // inf as float
      {"optimizer.params.betas=[0.9]", "optimizer.params.betas must be an array of two numbers"},
      {"optimizer.params.betas=[0.9,1.0]", "optimizer.params.betas[1] must be a number in [0, 1)"},
      {"optimizer.params.betas=[-0.1,0.9]", "optimizer.params.betas[0]"},
      {"optimizer.params.betas=0.9", "optimizer.params.betas must be an array"},
      {"optimizer.params.eps=0", "optimizer.params.eps must be a number > 0"},
      {"optimizer.params.eps=1e-50", "optimizer.params.eps must be a number > 0"},
      {"optimizer.params.weight_decay=-0.1", "optimizer.params.weight_decay must be a number >= 0"},
      {"scheduler.params.warmup_num_steps=-1",
       "scheduler.params.warmup_num_steps must be a non-negative integer"},
      {"scheduler.params.cos_min_ratio=1.5",
       "scheduler.params.cos_min_ratio must be a number in "
       "[0, 1]"},
      {"train_micro_batch_size_per_gpu=0",
       "train_micro_batch_size_per_gpu must be a positive integer, or \"auto\" (tandem chooses), "
       "got 0"},
      {"train_micro_batch_size_per_gpu=3000000000",
       "train_micro_batch_size_per_gpu must be a positive integer, or \"auto\" (tandem chooses) "
       "(at most 2147483647), got 3000000000"},
      {"train.steps=1e30", "train.steps must be a positive integer (at most 9223372036854775807)"},
      {"gradient_accumulation_steps=0", "gradient_accumulation_steps must be a positive integer"},
      {"gradient_clipping=-1", "gradient_clipping must be a number >= 0"},
      {"train.steps=0", "train.steps must be a positive integer, got 0"},
      {"train.seq_len=-1", "train.seq_len must be an integer in [0, 256]"},
      {"train.eval_interval=-1", "train.eval_interval must be a non-negative integer"},
      {"train.checkpoint_interval=-1", "train.checkpoint_interval must be a non-negative"},
      {"train.log_interval=-5", "train.log_interval must be a non-negative integer"},
      {"train.eval_batches=0", "train.eval_batches must be a positive integer"},
      {"train.sample_bytes=-1", "train.sample_bytes must be a non-negative integer"},
      {"train.checkpoint_memory_mb=-1",
       "train.checkpoint_memory_mb must be a number >= 0 (0: automatic), got -1"},
      {"train.output_dir=\"\"", "train.output_dir must not be empty"},
      {"data.train_path=\"\"", "data.train_path must not be empty"},
      {"data.val_fraction=0", "data.val_fraction must be a number in (0, 1)"},
      {"data.val_fraction=1", "data.val_fraction must be a number in (0, 1)"},
      {"model.n_head=5", "model.n_head = 5 does not divide model.n_embd = 384"},
      {"model.n_layer=0", "model.n_layer must be a positive integer, got 0"},
      {"model.vocab_size=100000000", "model.vocab_size = 100000000 is out of range"},
  };
  for (const auto& c : cases) {
    const std::string msg = error_with(c.assignment);
    EXPECT_NE(msg.find(c.expected), std::string::npos)
        << c.assignment << "\n  got:      " << msg << "\n  expected: " << c.expected;
  }
}

TEST(ParseTrainConfig, SeqLenBoundedByContextLength) {
  json config = minimal_config();
  config["model"] = {{"context_length", 128}};
  config["train"] = {{"seq_len", 129}};
  const std::string msg = parse_error(config);
  EXPECT_NE(msg.find("train.seq_len"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.context_length = 128"), std::string::npos) << msg;
  config["train"]["seq_len"] = 128;
  EXPECT_EQ(parse_train_config(config).seq_len(), 128);
  config["train"]["seq_len"] = 0;
  EXPECT_EQ(parse_train_config(config).seq_len(), 128);
}

TEST(ParseTrainConfig, ValFractionFreeWithValPath) {
  json config = minimal_config();
  config["data"]["val_path"] = "data/val.txt";
  config["data"]["val_fraction"] = 0;
  EXPECT_NO_THROW(parse_train_config(config));
}

TEST(ParseTrainConfig, TrainPathRequired) {
  const std::string msg = parse_error(json::object());
  EXPECT_NE(msg.find("data.train_path is required"), std::string::npos) << msg;
}

// ---- apply_config_override -------------------------------------------------------------

TEST(ConfigOverride, NumberStringArrayBoolean) {
  json config = full_config();
  apply_config_override(config, "optimizer.params.lr=3e-5");
  apply_config_override(config, "train.output_dir=runs/y");
  apply_config_override(config, "optimizer.params.betas=[0.8,0.9]");
  apply_config_override(config, "data.val_path=\"quoted=with=equals\"");
  apply_config_override(config, "train.steps=10");
  EXPECT_TRUE(config["train"]["steps"].is_number_integer());
  const TrainConfig c = parse_train_config(config);
  EXPECT_EQ(c.optimizer.lr, 3e-5);
  EXPECT_EQ(c.train.output_dir, "runs/y");
  EXPECT_EQ(own_settings<AdamWSettings>(c.optimizer).beta1, 0.8f);
  EXPECT_EQ(own_settings<AdamWSettings>(c.optimizer).beta2, 0.9f);
  EXPECT_EQ(c.data.val_path, "quoted=with=equals");
  EXPECT_EQ(c.train.steps, 10);
}

TEST(ConfigOverride, CreatesNestedObjects) {
  json config = minimal_config();
  apply_config_override(config, "scheduler.params.warmup_num_steps=7");
  EXPECT_EQ(parse_train_config(config).scheduler.warmup_num_steps, 7);
  json empty;
  apply_config_override(empty, "a.b.c=1");
  EXPECT_EQ(empty["a"]["b"]["c"], 1);
}

TEST(ConfigOverride, RefusesToDescendIntoNonObject) {
  json config = full_config();
  try {
    apply_config_override(config, "optimizer.params.lr.x=1");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'optimizer.params.lr' is 0.0003"), std::string::npos)
        << e.what();
  }
}

TEST(ConfigOverride, Malformed) {
  json config = minimal_config();
  try {
    apply_config_override(config, "foo");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "no '=' in override 'foo'; expected key=value, e.g. train.steps=100");
  }
  EXPECT_THROW(apply_config_override(config, "=3"), Error);
  EXPECT_THROW(apply_config_override(config, "train..steps=3"), Error);
  EXPECT_THROW(apply_config_override(config, "train.=3"), Error);
}

TEST(ConfigOverride, UnknownKeyCaughtByParse) {
  const std::string msg = error_with("train.stepz=3");
  EXPECT_NE(msg.find("unknown key 'train.stepz'; did you mean 'steps'?"), std::string::npos) << msg;
}

// ---- load_train_config -----------------------------------------------------------------

TEST(LoadTrainConfig, LoadsAndAppliesOverrides) {
  TempFile file(full_config().dump(2));
  const TrainConfig c =
      load_train_config(file.path(), {"train.steps=5", "optimizer.params.lr=1e-2"});
  EXPECT_EQ(c.train.steps, 5);
  EXPECT_EQ(c.optimizer.lr, 1e-2);
  EXPECT_EQ(c.model.n_embd, 128);
}

TEST(LoadTrainConfig, SyntaxErrorNamesFileLineAndColumn) {
  // Missing comma at the end of line 3: the parser stops at the last character of the
  // unexpected "model" token, line 4, column 9 (the position nlohmann itself reports).
  TempFile file(
      "{\n  \"data\": {\"train_path\": \"x\"},\n  \"train\": {\"steps\": 1}\n  \"model\": {}\n}\n");
  try {
    load_train_config(file.path(), {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file.path().string() + ":4:9: JSON syntax error"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("[json.exception"), std::string::npos) << msg;
  }
}

TEST(LoadTrainConfig, DuplicateKeyRefused) {
  TempFile file(R"({"data": {"train_path": "x"}, "optimizer": {"params": {"lr": 1, "lr": 2}}})");
  try {
    load_train_config(file.path(), {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate key 'optimizer.params.lr'"), std::string::npos)
        << e.what();
  }
}

TEST(LoadTrainConfig, ConfigErrorNamesFileAndKey) {
  TempFile file(R"({"data": {"train_path": "x"}, "train": {"steps": 0}})");
  try {
    load_train_config(file.path(), {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file.path().string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("train.steps must be a positive integer"), std::string::npos) << msg;
  }
}

TEST(LoadTrainConfig, MissingFileNamed) {
  const fs::path missing = fs::temp_directory_path() / "tandem_no_such_config.json";
  try {
    load_train_config(missing, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing.string()), std::string::npos) << e.what();
  }
}

TEST(LoadTrainConfig, ShippedShakespeareConfigParses) {
  const fs::path path = testing::source_dir() / "configs" / "shakespeare-char.json";
  ASSERT_TRUE(fs::exists(path)) << path << " is missing";
  const TrainConfig c = load_train_config(path, {});
  EXPECT_FALSE(c.data.train_path.empty());
  expect_same(parse_train_config(to_json(c)), c);
}

// Every shipped config loads, its model is valid, and it survives the round trip through
// to_json: a config added to configs/ (a benchmark's, a big model's) cannot rot unseen. A
// fine-tuning config whose model is its train.init_from's (made by a README command, so
// absent here) is read with a transformers-made model directory in its place.
TEST(LoadTrainConfig, EveryShippedConfigParses) {
  int count = 0;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(testing::source_dir() / "configs")) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    const json raw = json::parse(read_file_text(entry.path()));
    std::vector<std::string> overrides;
    if (!raw.contains("model") && raw.contains("train") && raw["train"].contains("init_from")) {
      overrides.push_back("train.init_from=" +
                          (testing::source_dir() / "tests" / "fixtures" / "hf_qwen3").string());
      overrides.push_back("train.seq_len=0");  // the stand-in's context
    }
    const TrainConfig c = load_train_config(entry.path(), overrides);
    EXPECT_GT(c.model.num_parameters(), 0);
    expect_same(parse_train_config(to_json(c)), c);
    count++;
  }
  EXPECT_GE(count, 9) << "configs/ has lost files";
}

TEST(ParseTrainConfig, OffloadSettings) {
  json config = minimal_config();
  config["zero_optimization"] = {{"sub_group_size", 4096}};
  config["offload_optimizer"] = {{"schedule", "interleave"}, {"stride", 3}, {"staging_buffers", 1}};
  config["device"] = {{"type", "cpu"}, {"memory_gb", 0.5}};
  const TrainConfig c = parse_train_config(config);
  EXPECT_EQ(c.offload.schedule, UpdateSchedule::kInterleave);
  EXPECT_EQ(c.offload.sub_group_size, 4096u);
  EXPECT_EQ(c.offload.stride, 3);
  EXPECT_EQ(c.offload.staging_buffers, 1);
  EXPECT_EQ(c.device.memory_gb, 0.5);
  expect_same(parse_train_config(to_json(c)), c);

  config["offload_optimizer"] = {{"schedule", "sometimes"}};
  std::string msg = parse_error(config);
  EXPECT_NE(msg.find("offload_optimizer.schedule must be one of: \"device\", \"cpu\", \"ratio\", "
                     "\"interleave\", \"auto\"; got \"sometimes\""),
            std::string::npos)
      << msg;
  config["offload_optimizer"] = {{"schedule", "ratio"}, {"ratio", 1.5}};
  msg = parse_error(config);
  EXPECT_NE(msg.find("offload_optimizer.ratio"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[0, 1]"), std::string::npos) << msg;
  config["offload_optimizer"] = {{"schedule", "interleave"}, {"stride", 0}};
  msg = parse_error(config);
  EXPECT_NE(msg.find("offload_optimizer.stride"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tandem
