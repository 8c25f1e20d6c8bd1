// The public Tokenizer's state, for the files of the library API that make one (a loaded
// model's own tokenizer).
#pragma once

#include <tandem/tokenizer.h>

#include <memory>

#include "io/tokenizer.h"

namespace tandem::api {

struct Tokenizer::Impl {
  std::unique_ptr<::tandem::Tokenizer> t;
};

}  // namespace tandem::api
