// Checkpoint shard files: the input is the shard file of the one-shard fixture, and the
// index beside it is the fixture's with that file's size and checksum updated to the
// input's, so the fuzzer gets past the checksum to the header and the payload.
#include <nlohmann/json.hpp>

#include "checkpoint_fixture.h"
#include "core/json.h"
#include "io/file.h"

namespace {

nlohmann::json& fixture_index() {
  static nlohmann::json index = tandem::json_read_file(
      (tandem::fuzz::checkpoint_fixture("one-shard") / "index.json").string(), "fixture index");
  return index;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json& index = fixture_index();
  nlohmann::json& file = index.at("files").at(0);
  tandem::fuzz::write_input(data, size, file.at("name").get<std::string>());
  file["bytes"] = size;
  file["checksum"] =
      tandem::checksum_hex(tandem::checksum_update(tandem::checksum_init(), data, size));
  const std::string text = index.dump();
  tandem::fuzz::write_input(reinterpret_cast<const uint8_t*>(text.data()), text.size(),
                            "index.json");
  tandem::fuzz::accept_errors(tandem::fuzz::checkpoint_load_all, tandem::fuzz::temp_dir().string());
  return 0;
}
