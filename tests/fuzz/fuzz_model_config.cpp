// Model configs (`--model FILE.json`): read, built on their preset and family, validated;
// then the sizes every later layer derives from a valid config, which must not overflow.
#include "fuzz_file.h"
#include "model/config.h"

TANDEM_FUZZ_FILE_READER("model.json", [](const std::string& path) {
  const tandem::ModelConfig c = tandem::model_config_resolve(path);
  volatile int64_t sink = c.num_params() + c.num_params_padded() + c.qkv_dim() + c.attn_dim() +
                          c.mlp_in_dim() + c.rotary_dim() + c.head_dim();
  (void)sink;
})
