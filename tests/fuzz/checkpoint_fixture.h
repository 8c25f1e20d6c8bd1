// The checkpoints the two checkpoint harnesses start from: real checkpoints written by
// `tandem train` (tests/fuzz/make_corpus.py), one at one shard and one at two, kept under
// tests/fuzz/checkpoints/. Their shard files are copied into the harness's folder once.
#pragma once

#include <filesystem>
#include <string>

#include "fuzz_file.h"
#include "io/shard_checkpoint.h"

namespace tandem::fuzz {

inline std::filesystem::path checkpoint_fixture(const std::string& name) {
  return std::filesystem::path(TANDEM_SOURCE_DIR) / "tests" / "fuzz" / "checkpoints" / name;
}

// Copies the shard files of the fixture checkpoint `name` into temp_dir().
inline void checkpoint_copy_shards(const std::string& name) {
  for (const auto& entry : std::filesystem::directory_iterator(checkpoint_fixture(name))) {
    if (entry.path().filename().string().rfind("step-", 0) != 0) continue;
    std::filesystem::copy_file(entry.path(), temp_dir() / entry.path().filename(),
                               std::filesystem::copy_options::overwrite_existing);
  }
}

// What export and generate do with a checkpoint directory: the index, then the whole
// model, which reads every shard file (and across the two-shard fixture's boundary). A
// resume at another world size reads through the same index check and shard reader.
inline void checkpoint_load_all(const std::string& dir) {
  checkpoint_load_params(dir);
}

}  // namespace tandem::fuzz
