#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "tandem/cli/commands.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/data/byte_tokenizer.h"
#include "tandem/data/token_shard.h"

namespace tandem::cli {

void register_tokenize(CLI::App& app) {
  struct Args {
    std::string input;
    std::string output;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Write a text file as an llm.c token shard (byte-level tokens, uint16)");
  cmd->add_option("--input", args->input, "Text file")->required();
  cmd->add_option("--output", args->output, "Token shard to write (.bin)")->required();
  cmd->callback([args] {
    namespace fs = std::filesystem;
    std::error_code ec;
    TANDEM_CHECK(!fs::is_directory(args->output, ec), "--output ", args->output,
                 ": is a directory; name the shard file to write (e.g. data.bin)");
    const fs::path output_dir = fs::path(args->output).parent_path();
    TANDEM_CHECK(output_dir.empty() || fs::is_directory(output_dir, ec), "--output ", args->output,
                 ": its directory ", output_dir.string(),
                 " does not exist; create it first (mkdir -p ", output_dir.string(), ")");
    // A device or a pipe has no size to read up to (/dev/zero never ends, and says 0).
    TANDEM_CHECK(!fs::exists(args->input, ec) || fs::is_regular_file(args->input, ec) ||
                     fs::is_directory(args->input, ec),
                 "--input ", args->input,
                 ": is not a regular file (a device or a pipe); tokenize reads a text file");
    TANDEM_CHECK(!fs::exists(args->output, ec) || !fs::equivalent(args->input, args->output, ec),
                 "--output ", args->output,
                 ": is the --input file; writing the shard would replace the text; name "
                 "another file (e.g. data.bin)");
    // In blocks: the memory is a block's, whatever the file's size (one token per byte, so
    // the header's count is the file's size).
    File input(args->input, "rb");
    const uint64_t bytes = input.size();
    TANDEM_CHECK(bytes > 0, "--input ", args->input,
                 ": the file is empty; there is nothing to tokenize");
    TokenShardWriter shard(args->output, ShardTokenType::kUint16, bytes);
    std::string block(size_t{1} << 20, '\0');
    uint64_t first_nul = bytes;
    for (uint64_t at = 0; at < bytes; at += block.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), bytes - at));
      input.read_exact(block.data(), n);
      const std::string_view text(block.data(), n);
      if (first_nul == bytes && text.find('\0') != std::string_view::npos)
        first_nul = at + text.find('\0');
      shard.append(ByteTokenizer().encode(text));
    }
    shard.commit();
    if (first_nul < bytes)
      std::fprintf(stderr,
                   "tandem: warning: --input %s holds a NUL byte (the first at byte %llu): it "
                   "is not text; its bytes were tokenized as they are\n",
                   args->input.c_str(), static_cast<unsigned long long>(first_nul));
    std::fprintf(stderr, "tandem: wrote %llu tokens to %s\n",
                 static_cast<unsigned long long>(bytes), args->output.c_str());
  });
}

}  // namespace tandem::cli
