// safetensors files: the length prefix, the JSON header and the data offsets, through
// safetensors_read.
#include "fuzz_file.h"
#include "io/safetensors.h"

TANDEM_FUZZ_FILE_READER("input.safetensors",
                        [](const std::string& path) { tandem::safetensors_read(path); })
