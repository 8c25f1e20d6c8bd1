// The model as a list of units: the embedding, each transformer block, and the final
// norm with the head. Each unit's parameters live in one flat fp32 buffer; a unit's
// forward and backward read the gathered buffers of the units it needs (the GPT-2 head
// also reads the embedding unit's tied token matrix).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace tandem {

enum class UnitKind { embedding, block, head };

// Every parameter a unit may hold. A unit holds the ones its description asks for; the
// composition finds them by id (UnitLayout::at), never by name.
enum class ParamId : uint8_t {
  wte,      // embedding: token rows [Vp, C]
  wpe,      // embedding: learned positions [context, C]
  norm1_w,  // block: the attention branch's norm
  norm1_b,
  qkv_w,  // fused [q heads; k heads; v heads] x C
  qkv_b,
  proj_w,  // attention output [C, H*D]
  proj_b,
  norm2_w,  // the MLP branch's norm
  norm2_b,
  fc_w,  // first MLP product: [F, C], or [2F, C] = [gate; up] for SwiGLU
  fc_b,
  fc2_w,  // second MLP product [C, F]
  fc2_b,
  normf_w,  // head: the final norm
  normf_b,
  head_w,  // untied head [Vp, C] (a tensor-parallel rank: its head_rows() rows)
  count
};
constexpr int kParamIds = static_cast<int>(ParamId::count);

struct ParamSpec {
  ParamId id = ParamId::wte;
  std::string name;            // "wte", "qkv_w", ... (checkpoint and export names)
  std::vector<int64_t> shape;  // e.g. {3C, C}
  int64_t offset = 0;          // in elements, within the unit's flat buffer
  int64_t numel = 0;
  bool decay = false;  // AdamW weight decay applies (matrices and embeddings)
  enum class Init { normal, residual, zeros, ones } init = Init::normal;
};

struct UnitLayout {
  UnitKind kind = UnitKind::block;
  int index = 0;     // position in the unit list
  int layer = -1;    // block number, -1 for the embedding and head
  std::string name;  // "embedding", "block.3", "head"
  std::vector<ParamSpec> params;
  int64_t numel = 0;  // sum of the parameter sizes, without padding
  // Offset of each parameter id in the flat buffer, -1 where the unit has none.
  int64_t offsets[kParamIds];
  bool has(ParamId id) const { return offsets[static_cast<int>(id)] >= 0; }
  // The parameter's offset; throws when the unit has no such parameter.
  int64_t at(ParamId id) const;
  const ParamSpec& param(ParamId id) const;
};

// The unit list of a model and the initial values of its parameters.
class ModelLayout {
 public:
  explicit ModelLayout(const ModelConfig& config);
  const ModelConfig& config() const { return config_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitLayout& unit(int i) const { return units_.at(static_cast<size_t>(i)); }
  const std::vector<UnitLayout>& units() const { return units_; }
  int64_t total_numel() const;
  // Units (other than itself) whose parameters unit i reads: the tied head reads unit 0.
  std::vector<int> reads(int i) const;
  // Writes elements [begin, end) of unit i's flat buffer into out[0, end - begin);
  // elements past unit.numel (flat-buffer padding) are zero. Every element depends only on
  // (seed, model, unit, parameter, position), never on how the buffer is split.
  void init_slice(int unit, uint64_t seed, int64_t begin, int64_t end, float* out) const;

 private:
  ModelConfig config_;
  std::vector<UnitLayout> units_;
};

}  // namespace tandem
