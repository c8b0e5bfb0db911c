// Checks made before the first step, so that a run that cannot finish fails at once, not
// after hours of training: the disk holds a checkpoint, the files the run will write can
// be written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace tandem {

// Throws naming both numbers when the filesystem of `dir` has less than `needed` bytes
// free; `what` says what needs them ("one checkpoint of this model").
void check_free_space(const std::filesystem::path& dir, uint64_t needed, const std::string& what);

// Creates `path`'s directory and checks that the file can be opened for writing (a file
// it creates for the check is removed again); throws naming `option` (--trace) and why.
void check_writable_file(const std::filesystem::path& path, const std::string& option);

}  // namespace tandem
