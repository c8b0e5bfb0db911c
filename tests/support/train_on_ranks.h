// Training runs on in-process ranks (comm/local_group.h) for the data-parallel and DeMo
// tests: every rank's result or error, and the check that all ranks agree.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/comm/local_group.h"
#include "tandem/core/error.h"
#include "tandem/train/trainer.h"

namespace tandem::testing {

struct RankResults {
  std::vector<TrainResult> by_rank;
  std::vector<std::string> errors;  // empty where the rank succeeded
};

inline RankResults train_on_ranks(int world, const nlohmann::json& json,
                                  TrainOptions options = {}) {
  options.show_progress = false;
  RankResults results;
  results.by_rank.resize(world);
  results.errors.resize(world);
  const TrainConfig config = parse_train_config(json);
  run_local_ranks(world, [&](Communicator& comm) {
    try {
      results.by_rank[comm.rank()] = train(config, options, comm);
    } catch (const Error& e) {
      results.errors[comm.rank()] = e.what();
    }
  });
  return results;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline std::vector<float> losses(const TrainResult& r) {
  std::vector<float> out;
  for (const StepRecord& s : r.steps) out.push_back(s.loss);
  return out;
}

// Every rank finished, and all ranks agree on the state and the losses.
inline void expect_ranks_agree(const RankResults& results, const std::string& what) {
  for (size_t r = 0; r < results.by_rank.size(); r++) {
    ASSERT_EQ(results.errors[r], "") << what << ", rank " << r;
    EXPECT_EQ(results.by_rank[r].state_digest, results.by_rank[0].state_digest) << what;
    EXPECT_EQ(losses(results.by_rank[r]), losses(results.by_rank[0])) << what;
  }
}

}  // namespace tandem::testing
