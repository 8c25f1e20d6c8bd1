// Consolidated model export: every parameter as its own tensor in a safetensors file,
// named "<unit>.<param>" (for example "block.3.qkv_w"), with the model config as metadata.
#pragma once

#include <string>
#include <vector>

#include "model/model.h"

namespace tandem {

// params[u] is unit u's full (unpadded) flat buffer.
void export_safetensors(const ModelLayout& layout, const std::vector<std::vector<float>>& params,
                        const std::string& path);
// Reads a file written by export_safetensors back into per-unit flat buffers; the file's
// shapes must match the layout.
std::vector<std::vector<float>> import_safetensors(const ModelLayout& layout,
                                                   const std::string& path);

}  // namespace tandem
