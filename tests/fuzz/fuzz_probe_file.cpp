// Probe files (`--hardware-compute`, `--hardware-links`): read, applied over a preset as
// `tandem plan` and `tandem train --hardware` apply them, and validated. A file with a
// "device" key is a compute file, any other a links file.
#include "core/json.h"
#include "fuzz_file.h"
#include "plan/hardware.h"

TANDEM_FUZZ_FILE_READER("probe.json", [](const std::string& path) {
  const nlohmann::json probe = tandem::json_read_file(path, "probe file");
  tandem::Hardware hw = tandem::hardware_preset("cpu-local");
  if (probe.is_object() && probe.contains("device")) {
    tandem::hardware_apply_compute(hw, probe);
  } else {
    tandem::hardware_apply_links(hw, probe);
  }
  tandem::hardware_validate(hw);
})
