// Small collectives that keep ranks in step: agreeing that every rank succeeded (so all
// fail together instead of leaving some blocked in the next collective), handing rank 0's
// text to every rank, and refusing ranks whose settings differ from rank 0's.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tandem/comm/communicator.h"

namespace tandem {

// Whether every rank passed `ok` (every rank calls it).
bool all_ranks_ok(Communicator& comm, bool ok);

// Every rank passes the error it met, "" for none (every rank calls it): when any rank met
// one, every rank throws ErrorOnEveryRank together, a rank that met one with its own message,
// the others with `elsewhere` ("rank 0 refused ...: its error says why"), marked not their own.
void fail_together(Communicator& comm, const std::string& error, std::string_view elsewhere);

// The largest of every rank's `value` (every rank calls it; a world of one: its own).
int max_over_ranks(Communicator& comm, int value);
// The smallest of every rank's `value` (every rank calls it; a world of one: its own).
size_t min_over_ranks(Communicator& comm, size_t value);

// "rank R of N: ", how an error of a job of several ranks names its rank.
std::string rank_of_world(const Communicator& comm);

// `text` of rank `root` on every rank (every rank calls it; others' text is ignored).
std::string broadcast_string(Communicator& comm, const std::string& text, int root);

// The first key (dotted path) whose value differs between two JSON documents; "" if none.
std::string first_json_difference(const nlohmann::json& a, const nlohmann::json& b,
                                  const std::string& path = "");

// Every rank compares `mine` with rank 0's and all throw together if any differs: the
// differing rank names the first key that differs ("... differs from rank 0's at
// 'optimizer.params.lr'; <fix>"), the others say another rank's error names it.
void require_same_on_every_rank(Communicator& comm, const nlohmann::json& mine,
                                std::string_view what, std::string_view fix);

// Every rank compares an XXH3-64 of `bytes` bytes at `data` with every other's, and all
// throw together if any differs, naming the ranks whose hash differs from rank 0's:
// "<what> differ(s) between the ranks (rank 2: 1f..., rank 0: 3a...); <fix>".
void require_same_bits_on_every_rank(Communicator& comm, const void* data, size_t bytes,
                                     std::string_view what, std::string_view fix);

}  // namespace tandem
