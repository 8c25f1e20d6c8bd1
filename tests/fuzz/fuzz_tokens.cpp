// Token files: tandem's own format and llm.c's .bin files, through tokens_read (which
// tells them apart by their magic).
#include "fuzz_file.h"
#include "io/tokens.h"

TANDEM_FUZZ_FILE_READER("input.tok", [](const std::string& path) { tandem::tokens_read(path); })
