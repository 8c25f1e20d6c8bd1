// TrainConfig from and to the JSON of `tandem train --config`.
#include <tandem/config.h>

#include <nlohmann/json.hpp>

#include <charconv>
#include <cstdlib>
#include <string>

#include "api/convert.h"
#include "api/errors.h"
#include "core/error.h"
#include "train/options.h"

namespace tandem::api {

TrainConfig train_config_from_json(const std::string& json) {
  return translate_errors([&] {
    // The library's defaults (TrainConfig's), then the keys given, parsed and checked as
    // `tandem train` parses and checks a config file.
    ::tandem::TrainOptions o = to_options(TrainConfig{});
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(json);
    } catch (const nlohmann::json::parse_error& e) {
      TD_THROW("training config is not JSON: {}", e.what());
    }
    ::tandem::train_options_apply_json(o, j);
    ::tandem::train_options_validate(o);
    return from_options(o);
  });
}

std::string train_config_to_json(const TrainConfig& config) {
  return translate_errors([&] {
    nlohmann::json j = ::tandem::train_options_to_json(to_options(config));
    for (const char* key : {"hardware", "hardware-compute", "hardware-links"}) j.erase(key);
    // The fp32 settings as the shortest decimals that read back as the same float (0.9,
    // not 0.899999976).
    for (const char* key :
         {"lr", "min-lr-ratio", "weight-decay", "beta1", "beta2", "eps", "grad-clip"}) {
      char buf[32];
      const auto r = std::to_chars(buf, buf + sizeof buf, j[key].get<float>());
      j[key] = std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
    }
    return j.dump();
  });
}

}  // namespace tandem::api
