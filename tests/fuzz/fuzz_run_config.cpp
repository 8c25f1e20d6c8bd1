// Run configs (`tandem train --config FILE`): the file read as the command reads it, the
// options applied and validated.
#include "core/json.h"
#include "fuzz_file.h"
#include "train/options.h"

TANDEM_FUZZ_FILE_READER("run.json", [](const std::string& path) {
  tandem::TrainOptions options;
  tandem::train_options_apply_json(options, tandem::json_read_file(path, "training config"));
  tandem::train_options_validate(options);
})
