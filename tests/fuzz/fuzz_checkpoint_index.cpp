// Checkpoint indexes: the input is index.json of a checkpoint folder that holds the shard
// files of the one- and two-shard fixtures, loaded as export and resume load it.
#include "checkpoint_fixture.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tandem::fuzz::checkpoint_copy_shards("one-shard");
  tandem::fuzz::checkpoint_copy_shards("two-shards");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::fuzz::write_input(data, size, "index.json");
  tandem::fuzz::accept_errors(tandem::fuzz::checkpoint_load_all, tandem::fuzz::temp_dir().string());
  return 0;
}
