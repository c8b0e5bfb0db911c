#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

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
    const std::string text = read_file_text(args->input);
    TANDEM_CHECK(!text.empty(), "--input ", args->input,
                 ": the file is empty; there is nothing to tokenize");
    std::error_code ec;
    TANDEM_CHECK(!std::filesystem::is_directory(args->output, ec), "--output ", args->output,
                 ": is a directory; name the shard file to write (e.g. data.bin)");
    const auto tokens = ByteTokenizer().encode(text);
    write_token_shard(args->output, tokens, ShardTokenType::kUint16);
    std::fprintf(stderr, "tandem: wrote %zu tokens to %s\n", tokens.size(), args->output.c_str());
  });
}

}  // namespace tandem::cli
