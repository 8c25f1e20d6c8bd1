// Hugging Face tokenizer.json files, through tokenizer_load: every component is read or
// refused with an error; a file that loads must then encode and decode a varied text
// (added tokens, white space runs, bytes that are not UTF-8) without failing otherwise.
#include <string>
#include <vector>

#include "fuzz_file.h"
#include "io/tokenizer.h"

TANDEM_FUZZ_FILE_READER("tokenizer.json", [](const std::string& path) {
  const std::unique_ptr<tandem::Tokenizer> t = tandem::tokenizer_load(path);
  const std::string text =
      "Hello  world\n\t<s>caf\xC3\xA9 e\xCC\x81 \xFF 123 it's \xF0\x9F\x98\x80";
  const std::vector<uint32_t> ids = t->encode(text, true);
  (void)t->decode(ids, false);
  (void)t->decode(ids, true);
})
