// Model presets and shapes for the public API.
#include <tandem/model.h>

#include "api/convert.h"
#include "api/errors.h"
#include "model/config.h"

namespace tandem::api {

ModelInfo load_model_info(const std::string& preset_or_path) {
  return translate_errors([&] {
    int64_t step = 0;
    const ::tandem::ModelConfig c = resolve_model(preset_or_path, &step);
    return model_info(c, step);
  });
}

std::vector<std::string> model_presets() {
  return translate_errors([] { return ::tandem::preset_names(); });
}

}  // namespace tandem::api
