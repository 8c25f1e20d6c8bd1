// Export and import of whole models as safetensors.
#include "io/export.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"

namespace tandem {

void export_safetensors(const ModelLayout& layout, const std::vector<std::vector<float>>& params,
                        const std::string& path) {
  TD_CHECK(params.size() == static_cast<size_t>(layout.num_units()),
           "export of {} units for a model of {}", params.size(), layout.num_units());
  std::vector<SafeTensor> tensors;
  for (const UnitLayout& u : layout.units()) {
    const auto& buf = params[static_cast<size_t>(u.index)];
    TD_CHECK(static_cast<int64_t>(buf.size()) >= u.numel, "unit {} holds {} values, needs {}",
             u.name, buf.size(), u.numel);
    for (const ParamSpec& p : u.params) {
      SafeTensor t;
      t.name = u.name + "." + p.name;
      t.dtype = "F32";
      t.shape = p.shape;
      t.data.resize(static_cast<size_t>(p.numel) * sizeof(float));
      std::memcpy(t.data.data(), buf.data() + p.offset, t.data.size());
      tensors.push_back(std::move(t));
    }
  }
  safetensors_write(
      path, tensors,
      {{"format", "tandem"}, {"model", model_config_to_json(layout.config()).dump()}});
}

std::vector<std::vector<float>> import_safetensors(const ModelLayout& layout,
                                                   const std::string& path) {
  SafeTensorsFile f = safetensors_read(path);
  std::vector<std::vector<float>> params;
  for (const UnitLayout& u : layout.units()) {
    std::vector<float> buf(static_cast<size_t>(u.numel));
    for (const ParamSpec& p : u.params) {
      const SafeTensor& t = f.get(u.name + "." + p.name);
      TD_CHECK(t.dtype == "F32" && t.shape == p.shape,
               "'{}': tensor {} is {} of another shape than the model's", path, t.name, t.dtype);
      std::memcpy(buf.data() + p.offset, t.data.data(), t.data.size());
    }
    params.push_back(std::move(buf));
  }
  return params;
}

}  // namespace tandem
