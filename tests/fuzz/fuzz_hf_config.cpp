// Hugging Face config.json files (a model directory's), through hf_config_read: the
// architecture, the fields tandem uses, checks or knows to be irrelevant, and the refusal of
// every other field and of the settings tandem cannot honour.
#include <filesystem>

#include "fuzz_file.h"
#include "io/hf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::filesystem::path d = tandem::fuzz::temp_dir() / "hf";
    std::filesystem::create_directories(d);
    return d.string();
  }();
  tandem::fuzz::write_input(data, size, "hf/config.json");
  tandem::fuzz::accept_errors([](const std::string& d) { tandem::hf_config_read(d); }, dir);
  return 0;
}
