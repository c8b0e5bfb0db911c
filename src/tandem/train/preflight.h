// Checks made before the first step, so that a run that cannot finish fails at once, not
// after hours of training: every rank was given the same run, the plan fits the host's
// memory, the disk holds a checkpoint, the files the run will write can be written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace tandem {

class Communicator;
struct TokenSplit;
struct TrainConfig;
struct TrainOptions;
struct TrainingMemoryPlan;

// Refuses to start when the ranks were given different configs, data or options that
// decide when they stop: every rank compares its own with rank 0's, and all fail together
// naming the first difference (a collective).
void check_ranks_agree(Communicator& comm, const TrainConfig& config, const TokenSplit& data,
                       const TrainOptions& options);

// Before anything is allocated: a plan beyond the machine's memory ends in swapping or the
// OOM killer, hours in. Refused on every rank when any rank's plan does not fit its host,
// unless `allow_overcommit` (a collective: each rank has a plan of its own).
void check_plan_fits_host(const TrainingMemoryPlan& plan, bool allow_overcommit,
                          Communicator& comm);

// Throws naming both numbers when the filesystem of `dir` has less than `needed` bytes
// free; `what` says what needs them ("one checkpoint of this model").
void check_free_space(const std::filesystem::path& dir, uint64_t needed, const std::string& what);

// Creates `path`'s directory and checks that the file can be opened for writing (a file
// it creates for the check is removed again); throws naming `option` (--trace) and why.
void check_writable_file(const std::filesystem::path& path, const std::string& option);

}  // namespace tandem
