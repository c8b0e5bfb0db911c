// The optimizer families (optim/optimizer_family.h): each row agrees with the update rule
// it makes, its name reads back in any case, its parameters are its own in a config, and the
// flags the rest of tandem reads (per-rank state, gradient reduction, cuts, calibration)
// say what the rule does.

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/comm/local_group.h"
#include "tandem/config/train_config.h"
#include "tandem/core/thread_pool.h"
#include "tandem/model/model_family.h"
#include "tandem/offload/update_rule.h"
#include "tandem/optim/optimizer_family.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using testing::error_of;

// Every tensor's DCT blocks hold at least the DeMo default's 32 coefficients.
ModelConfig tiny_model() {
  ModelConfig model;
  model.vocab_size = 64;
  model.context_length = 32;
  model.n_layer = 1;
  model.n_head = 2;
  model.n_embd = 32;
  return model;
}

json config_with(std::string_view type) {
  return {{"data", {{"train_path", "unused.txt"}}}, {"optimizer", {{"type", std::string(type)}}}};
}

TEST(OptimizerFamily, EveryRowAgreesWithTheRuleItMakes) {
  const ParamLayout layout = model_layout(tiny_model());
  LocalGroup group(1);
  const std::unique_ptr<Communicator> comm = group.communicator(0);
  ThreadPool pool(1);
  std::set<std::string> names;
  for (const OptimizerFamily& family : optimizer_families()) {
    SCOPED_TRACE(std::string(family.name));
    EXPECT_TRUE(names.insert(std::string(family.name)).second) << "two rows of one name";
    EXPECT_EQ(family.defaults.type, family.type);
    EXPECT_EQ(&optimizer_family(family.type), &family);
    EXPECT_EQ(find_optimizer_family(ascii_lower(family.name)), &family);
    const std::unique_ptr<UpdateRule> rule = family.make_rule(family.defaults, layout, *comm, pool);
    const std::vector<std::string> arrays(family.state_arrays.begin(), family.state_arrays.end());
    EXPECT_EQ(rule->state_arrays(), arrays);
    ASSERT_FALSE(arrays.empty());
    EXPECT_EQ(arrays[0], "param");
    EXPECT_EQ(family.state_names(), std::vector<std::string>(arrays.begin() + 1, arrays.end()));
    EXPECT_EQ(family.state_bytes_per_param(), arrays.size() * sizeof(float));
    // Stage 0 is the only stage for state that is not reduced and partitioned.
    if (!family.reduces_gradients) {
      EXPECT_TRUE(family.state_per_rank);
    }
    const std::vector<size_t> cuts = family.subgroup_cut_points(layout);
    EXPECT_EQ(cuts.empty(), !family.cuts_at_tensor_ends);
    if (!cuts.empty()) {
      EXPECT_EQ(cuts.back(), layout.num_elements());
    }
  }
  EXPECT_EQ(find_optimizer_family("Lion"), nullptr);
}

TEST(OptimizerFamily, EachTypeReadsItsOwnParamsAndRoundTrips) {
  for (const OptimizerFamily& family : optimizer_families()) {
    SCOPED_TRACE(std::string(family.name));
    const TrainConfig config = parse_train_config(config_with(family.name));
    EXPECT_EQ(config.optimizer.type, family.type);
    EXPECT_EQ(config.optimizer.weight_decay, family.defaults.weight_decay);
    const json written = to_json(config);
    EXPECT_EQ(written["optimizer"]["type"], std::string(family.name));
    std::set<std::string> keys;
    for (const auto& [key, value] : written["optimizer"]["params"].items()) keys.insert(key);
    std::set<std::string> declared;
    for (const JsonKey<OptimizerConfig>& key : family.params)
      declared.insert(std::string(key.name));
    EXPECT_EQ(keys, declared);
    EXPECT_EQ(to_json(parse_train_config(written)), written);
    // Another family's own keys are refused, naming the family they belong to.
    for (const OptimizerFamily& other : optimizer_families())
      for (const JsonKey<OptimizerConfig>& key : other.params) {
        if (declared.count(std::string(key.name)) != 0) continue;
        json wrong = config_with(family.name);
        wrong["optimizer"]["params"][std::string(key.name)] = 1;
        EXPECT_CONTAINS(error_of([&] { parse_train_config(wrong); }),
                        cat("optimizer.params.", key.name, " is a parameter of optimizer.type ",
                            other.name, ", not of ", family.name));
      }
  }
}

TEST(OptimizerFamily, WhatARowCannotRunWithIsRefusedNamingIt) {
  for (const OptimizerFamily& family : optimizer_families()) {
    SCOPED_TRACE(std::string(family.name));
    json config = config_with(family.name);
    config["zero_optimization"] = {{"stage", 1}};
    if (family.reduces_gradients)
      EXPECT_EQ(parse_train_config(config).zero.stage, 1);
    else
      EXPECT_CONTAINS(error_of([&] { parse_train_config(config); }),
                      cat("optimizer.type ", family.name, " needs zero_optimization.stage 0"));
    config = config_with(family.name);
    config["offload_optimizer"] = {{"schedule", "auto"}};
    if (family.calibrate_rates != nullptr)
      EXPECT_EQ(parse_train_config(config).offload.schedule, UpdateSchedule::kAuto);
    else
      EXPECT_CONTAINS(error_of([&] { parse_train_config(config); }),
                      cat("offload_optimizer.schedule auto is not available with optimizer.type ",
                          family.name));
  }
}

}  // namespace
}  // namespace tandem
