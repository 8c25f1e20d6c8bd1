// Hugging Face weights in tandem's units: the mapping of every tandem parameter to the
// Hugging Face tensors it is made of (rows of which tensor, transposed or not, permuted or
// not), the reader that converts any element range of a unit's flat buffer from the mapped
// files, and the writer of a Hugging Face directory.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/dtype.h"
#include "core/error.h"
#include "io/file.h"
#include "io/hf.h"

namespace fs = std::filesystem;

namespace tandem {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

// One Hugging Face tensor making up rows [row0, row0 + rows) of a tandem parameter seen as
// [R, K] (a vector is [R, 1]). Tandem element (row0 + i, k) is, in the tensor's flat
// elements: i * K + k; with `transposed` (GPT-2's Conv1D stores [K, rows]) k * rows + i; with
// `heads` > 0, i is first permuted from tandem's fused (3, H, D) rows to GPT-NeoX's
// per-head (H, 3, D) rows.
struct Piece {
  std::string name;
  std::vector<int64_t> shape;
  int64_t row0 = 0, rows = 0;
  bool transposed = false;
  int heads = 0, head_dim = 0;
  int order = 0;  // position in the Hugging Face state dict (export order)

  int64_t source_row(int64_t i) const {
    if (heads == 0) return i;
    const int64_t hd = int64_t{heads} * head_dim;
    const int64_t which = i / hd, h = (i / head_dim) % heads, d = i % head_dim;
    return (h * 3 + which) * head_dim + d;
  }
  // Flat index of tandem element (row0 + i, k) is base + k * stride.
  int64_t base(int64_t i, int64_t K) const {
    return transposed ? source_row(i) : source_row(i) * K;
  }
  int64_t stride() const { return transposed ? rows : 1; }
};

struct ParamMap {
  int unit = 0;
  const ParamSpec* spec = nullptr;
  int64_t R = 0, K = 0;
  std::vector<Piece> pieces;  // by row0

  const Piece* piece_of(int64_t r) const {
    for (const Piece& p : pieces)
      if (r >= p.row0 && r < p.row0 + p.rows) return &p;
    return nullptr;  // vocabulary padding rows
  }
};

// Builds the mapping of every parameter of `layout` for one architecture and naming.
class MapBuilder {
 public:
  MapBuilder(const ModelLayout& layout, HfArch arch, const HfNaming& naming)
      : layout_(layout), c_(layout.config()), arch_(arch), naming_(naming) {}

  std::vector<ParamMap> build() {
    for (const UnitLayout& u : layout_.units())
      for (const ParamSpec& p : u.params) add(u, p);
    return std::move(maps_);
  }

 private:
  // Names of the tensors of block l (GPT-2 block names are relative to "h.l.").
  std::string block(int l, const std::string& rest) const {
    switch (arch_) {
      case HfArch::gpt2:
        return fmt::format("{}h.{}.{}", gpt2_prefix(), l, rest);
      case HfArch::llama:
        return fmt::format("model.layers.{}.{}", l, rest);
      case HfArch::neox:
        return fmt::format("gpt_neox.layers.{}.{}", l, rest);
    }
    return rest;
  }
  std::string gpt2_prefix() const { return naming_.gpt2_prefix ? "transformer." : ""; }

  // Appends a piece: `order` ranks it within its unit in the Hugging Face state dict.
  void piece(ParamMap& m, std::string name, std::vector<int64_t> shape, int64_t row0, int64_t rows,
             int order, bool transposed = false, int heads = 0) {
    Piece p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.row0 = row0;
    p.rows = rows;
    p.transposed = transposed;
    p.heads = heads;
    p.head_dim = c_.head_dim();
    p.order = m.unit * 64 + order;
    m.pieces.push_back(std::move(p));
  }

  void add(const UnitLayout& u, const ParamSpec& ps) {
    ParamMap m;
    m.unit = u.index;
    m.spec = &ps;
    m.R = ps.shape[0];
    m.K = ps.numel / std::max<int64_t>(m.R, 1);
    const int64_t C = c_.d_model, V = c_.vocab, F = c_.d_ff, D = c_.head_dim();
    const int64_t Hq = int64_t{c_.n_head} * D, Hkv = int64_t{c_.n_kv_head} * D;
    const int l = u.layer;
    switch (arch_) {
      case HfArch::gpt2:
        gpt2(m, ps.id, l, C, V, F);
        break;
      case HfArch::llama:
        llama(m, ps.id, l, C, V, F, Hq, Hkv);
        break;
      case HfArch::neox:
        neox(m, ps.id, l, C, V, F);
        break;
    }
    TD_CHECK(!m.pieces.empty(), "{} has no tensor for tandem parameter {}.{}", hf_arch_class(arch_),
             u.name, ps.name);
    maps_.push_back(std::move(m));
  }

  void gpt2(ParamMap& m, ParamId id, int l, int64_t C, int64_t V, int64_t F) {
    const std::string P = gpt2_prefix();
    switch (id) {
      case ParamId::wte:
        return piece(m, P + "wte.weight", {V, C}, 0, V, 0);
      case ParamId::wpe:
        return piece(m, P + "wpe.weight", {c_.context, C}, 0, c_.context, 1);
      case ParamId::norm1_w:
        return piece(m, block(l, "ln_1.weight"), {C}, 0, C, 0);
      case ParamId::norm1_b:
        return piece(m, block(l, "ln_1.bias"), {C}, 0, C, 1);
      case ParamId::qkv_w:
        return piece(m, block(l, "attn.c_attn.weight"), {C, 3 * C}, 0, 3 * C, 2, true);
      case ParamId::qkv_b:
        return piece(m, block(l, "attn.c_attn.bias"), {3 * C}, 0, 3 * C, 3);
      case ParamId::proj_w:
        return piece(m, block(l, "attn.c_proj.weight"), {C, C}, 0, C, 4, true);
      case ParamId::proj_b:
        return piece(m, block(l, "attn.c_proj.bias"), {C}, 0, C, 5);
      case ParamId::norm2_w:
        return piece(m, block(l, "ln_2.weight"), {C}, 0, C, 6);
      case ParamId::norm2_b:
        return piece(m, block(l, "ln_2.bias"), {C}, 0, C, 7);
      case ParamId::fc_w:
        return piece(m, block(l, "mlp.c_fc.weight"), {C, F}, 0, F, 8, true);
      case ParamId::fc_b:
        return piece(m, block(l, "mlp.c_fc.bias"), {F}, 0, F, 9);
      case ParamId::fc2_w:
        return piece(m, block(l, "mlp.c_proj.weight"), {F, C}, 0, C, 10, true);
      case ParamId::fc2_b:
        return piece(m, block(l, "mlp.c_proj.bias"), {C}, 0, C, 11);
      case ParamId::normf_w:
        return piece(m, P + "ln_f.weight", {C}, 0, C, 0);
      case ParamId::normf_b:
        return piece(m, P + "ln_f.bias", {C}, 0, C, 1);
      case ParamId::head_w:
        return piece(m, "lm_head.weight", {V, C}, 0, V, 2);
      case ParamId::count:
        return;
    }
  }

  void llama(ParamMap& m, ParamId id, int l, int64_t C, int64_t V, int64_t F, int64_t Hq,
             int64_t Hkv) {
    switch (id) {
      case ParamId::wte:
        return piece(m, "model.embed_tokens.weight", {V, C}, 0, V, 0);
      case ParamId::qkv_w:
        piece(m, block(l, "self_attn.q_proj.weight"), {Hq, C}, 0, Hq, 0);
        piece(m, block(l, "self_attn.k_proj.weight"), {Hkv, C}, Hq, Hkv, 1);
        return piece(m, block(l, "self_attn.v_proj.weight"), {Hkv, C}, Hq + Hkv, Hkv, 2);
      case ParamId::proj_w:
        return piece(m, block(l, "self_attn.o_proj.weight"), {C, Hq}, 0, C, 3);
      case ParamId::fc_w:
        piece(m, block(l, "mlp.gate_proj.weight"), {F, C}, 0, F, 4);
        return piece(m, block(l, "mlp.up_proj.weight"), {F, C}, F, F, 5);
      case ParamId::fc2_w:
        return piece(m, block(l, "mlp.down_proj.weight"), {C, F}, 0, C, 6);
      case ParamId::norm1_w:
        return piece(m, block(l, "input_layernorm.weight"), {C}, 0, C, 7);
      case ParamId::norm2_w:
        return piece(m, block(l, "post_attention_layernorm.weight"), {C}, 0, C, 8);
      case ParamId::normf_w:
        return piece(m, "model.norm.weight", {C}, 0, C, 0);
      case ParamId::head_w:
        return piece(m, "lm_head.weight", {V, C}, 0, V, 1);
      default:
        return;  // no other parameter exists in a Llama layout (hf_arch_for checked it)
    }
  }

  void neox(ParamMap& m, ParamId id, int l, int64_t C, int64_t V, int64_t F) {
    const int H = c_.n_head;
    switch (id) {
      case ParamId::wte:
        return piece(m, "gpt_neox.embed_in.weight", {V, C}, 0, V, 0);
      case ParamId::norm1_w:
        return piece(m, block(l, "input_layernorm.weight"), {C}, 0, C, 0);
      case ParamId::norm1_b:
        return piece(m, block(l, "input_layernorm.bias"), {C}, 0, C, 1);
      case ParamId::norm2_w:
        return piece(m, block(l, "post_attention_layernorm.weight"), {C}, 0, C, 2);
      case ParamId::norm2_b:
        return piece(m, block(l, "post_attention_layernorm.bias"), {C}, 0, C, 3);
      case ParamId::qkv_w:
        return piece(m, block(l, "attention.query_key_value.weight"), {3 * C, C}, 0, 3 * C, 4,
                     false, H);
      case ParamId::qkv_b:
        return piece(m, block(l, "attention.query_key_value.bias"), {3 * C}, 0, 3 * C, 5, false, H);
      case ParamId::proj_w:
        return piece(m, block(l, "attention.dense.weight"), {C, C}, 0, C, 6);
      case ParamId::proj_b:
        return piece(m, block(l, "attention.dense.bias"), {C}, 0, C, 7);
      case ParamId::fc_w:
        return piece(m, block(l, "mlp.dense_h_to_4h.weight"), {F, C}, 0, F, 8);
      case ParamId::fc_b:
        return piece(m, block(l, "mlp.dense_h_to_4h.bias"), {F}, 0, F, 9);
      case ParamId::fc2_w:
        return piece(m, block(l, "mlp.dense_4h_to_h.weight"), {C, F}, 0, C, 10);
      case ParamId::fc2_b:
        return piece(m, block(l, "mlp.dense_4h_to_h.bias"), {C}, 0, C, 11);
      case ParamId::normf_w:
        return piece(m, "gpt_neox.final_layer_norm.weight", {C}, 0, C, 0);
      case ParamId::normf_b:
        return piece(m, "gpt_neox.final_layer_norm.bias", {C}, 0, C, 1);
      case ParamId::head_w:
        return piece(m, naming_.neox_head, {V, C}, 0, V, 2);
      default:
        return;
    }
  }

  const ModelLayout& layout_;
  const ModelConfig& c_;
  HfArch arch_;
  HfNaming naming_;
  std::vector<ParamMap> maps_;
};

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

// Buffers that old files hold beside the parameters: the causal mask, its fill value and
// the rotary frequencies, all of which tandem computes itself. Matched by exact name.
bool is_known_buffer(HfArch arch, const HfNaming& naming, int n_layer, const std::string& name) {
  for (int l = 0; l < n_layer; ++l) {
    switch (arch) {
      case HfArch::gpt2: {
        const std::string h =
            fmt::format("{}h.{}.attn.", naming.gpt2_prefix ? "transformer." : "", l);
        if (name == h + "bias" || name == h + "masked_bias") return true;
        break;
      }
      case HfArch::llama:
        if (name == fmt::format("model.layers.{}.self_attn.rotary_emb.inv_freq", l)) return true;
        break;
      case HfArch::neox: {
        const std::string a = fmt::format("gpt_neox.layers.{}.attention.", l);
        if (name == a + "bias" || name == a + "masked_bias" || name == a + "rotary_emb.inv_freq")
          return true;
        break;
      }
    }
  }
  return false;
}

// The head's own copy of a tied embedding, which some files hold: the name it would have
// untied, and the embedding it must equal.
std::pair<std::string, std::string> tied_copy(HfArch arch, const HfNaming& naming) {
  switch (arch) {
    case HfArch::gpt2:
      return {"lm_head.weight", naming.gpt2_prefix ? "transformer.wte.weight" : "wte.weight"};
    case HfArch::llama:
      return {"lm_head.weight", "model.embed_tokens.weight"};
    case HfArch::neox:
      return {naming.neox_head, "gpt_neox.embed_in.weight"};
  }
  return {};
}

bool is_float_dtype(const std::string& d) {
  return d == "F32" || d == "F16" || d == "BF16";
}

// out[j] = element base + j * stride of a tensor of dtype `dtype`, as fp32, for j < n.
void convert(const std::string& dtype, const uint8_t* src, int64_t base, int64_t stride, int64_t n,
             float* out) {
  if (dtype == "F32") {
    for (int64_t j = 0; j < n; ++j) std::memcpy(out + j, src + (base + j * stride) * 4, 4);
  } else {
    const bool bf16 = dtype == "BF16";
    for (int64_t j = 0; j < n; ++j) {
      uint16_t h;
      std::memcpy(&h, src + (base + j * stride) * 2, 2);
      out[j] = bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
}

}  // namespace

struct HfModel::Source {
  const SafeTensorsMap* file = nullptr;
  const SafeTensorInfo* info = nullptr;
};

struct HfModel::Plan {
  std::vector<ParamMap> maps;
  std::vector<std::vector<size_t>> by_unit;  // indices into maps, per unit
  std::map<std::string, Source> sources;     // every tensor of the directory, by name
};

HfModel::HfModel(const std::string& dir) : dir_(dir), plan_(std::make_unique<Plan>()) {
  config_ = hf_config_read(dir);
  layout_ = std::make_unique<ModelLayout>(config_.model);
  const HfArch arch = config_.arch;

  // The files: one, or the shards an index names.
  const std::string single = (fs::path(dir) / kSingleFile).string();
  const std::string index_path = (fs::path(dir) / kIndexFile).string();
  const bool has_single = fs::exists(single), has_index = fs::exists(index_path);
  TD_CHECK(!(has_single && has_index),
           "'{}' holds both {} and {}; remove the one that is not the model", dir, kSingleFile,
           kIndexFile);
  TD_CHECK(has_single || has_index,
           "'{}' has config.json but no {} or {} (tandem reads safetensors weights only)", dir,
           kSingleFile, kIndexFile);
  std::map<std::string, std::string> weight_map;  // tensor -> file name (sharded)
  std::vector<std::string> names;                 // file names
  if (has_single) {
    names.push_back(kSingleFile);
  } else {
    const ordered_json ix = json_read_unique(index_path);
    TD_CHECK(ix.is_object() && ix.contains("weight_map") && ix["weight_map"].is_object(),
             "'{}' has no \"weight_map\" object", index_path);
    for (const auto& [key, value] : ix.items())
      TD_CHECK(key == "weight_map" || key == "metadata", "'{}': unknown key '{}'", index_path, key);
    TD_CHECK(!ix.contains("metadata") || ix["metadata"].is_object(),
             "'{}': \"metadata\" is not an object", index_path);
    for (const auto& [tensor, file] : ix["weight_map"].items()) {
      TD_CHECK(file.is_string(), "'{}': tensor '{}' maps to {}, not a file name", index_path,
               tensor, file.dump());
      const std::string f = file.get<std::string>();
      TD_CHECK(!f.empty() && fs::path(f).filename().string() == f && f != "." && f != "..",
               "'{}': tensor '{}' maps to '{}', not a file of the directory", index_path, tensor,
               f);
      weight_map[tensor] = f;
      if (std::find(names.begin(), names.end(), f) == names.end()) names.push_back(f);
    }
  }
  std::sort(names.begin(), names.end());
  std::map<std::string, const SafeTensorsMap*> by_name;
  for (const std::string& f : names) {
    const std::string path = (fs::path(dir) / f).string();
    TD_CHECK(fs::exists(path), "'{}' names '{}', which does not exist", index_path, path);
    files_.push_back(std::make_unique<SafeTensorsMap>(path));
    by_name[f] = files_.back().get();
  }

  // Every tensor once: a name in two files is an error, and so is one the index does not
  // put in the file that holds it.
  for (const auto& file : files_) {
    for (const SafeTensorInfo& t : file->tensors()) {
      const auto [it, fresh] = plan_->sources.try_emplace(t.name, Source{file.get(), &t});
      TD_CHECK(fresh, "tensor '{}' appears in both '{}' and '{}'", t.name, it->second.file->path(),
               file->path());
    }
  }
  for (size_t i = 0; has_index && i < files_.size(); ++i) {
    for (const SafeTensorInfo& t : files_[i]->tensors()) {
      const auto w = weight_map.find(t.name);
      TD_CHECK(w != weight_map.end(), "'{}' holds tensor '{}', which '{}' does not list",
               files_[i]->path(), t.name, index_path);
      TD_CHECK(w->second == names[i], "'{}' holds tensor '{}', which '{}' puts in '{}'",
               files_[i]->path(), t.name, index_path, w->second);
    }
  }
  for (const auto& [tensor, f] : weight_map)
    TD_CHECK(plan_->sources.count(tensor), "'{}' puts tensor '{}' in '{}', which does not hold it",
             index_path, tensor, by_name.at(f)->path());

  // Spellings: the GPT-2 prefix and the GPT-NeoX head's name follow the files.
  const auto& src = plan_->sources;
  if (arch == HfArch::gpt2) naming_.gpt2_prefix = !src.count("wte.weight");
  if (arch == HfArch::neox && !config_.model.tied_head) {
    TD_CHECK(!(src.count("embed_out.weight") && src.count("lm_head.weight")),
             "'{}' holds both 'embed_out.weight' and 'lm_head.weight' (one head only)", dir);
    if (src.count("lm_head.weight")) naming_.neox_head = "lm_head.weight";
  }

  // Every tensor the model needs, in shape and of a float dtype.
  plan_->maps = MapBuilder(*layout_, arch, naming_).build();
  plan_->by_unit.resize(static_cast<size_t>(layout_->num_units()));
  std::set<std::string> used;
  for (size_t i = 0; i < plan_->maps.size(); ++i) {
    const ParamMap& m = plan_->maps[i];
    plan_->by_unit[static_cast<size_t>(m.unit)].push_back(i);
    for (const Piece& p : m.pieces) {
      const auto it = src.find(p.name);
      TD_CHECK(it != src.end(), "'{}' lacks tensor '{}' (shape {}) that {} needs", dir, p.name,
               shape_str(p.shape), hf_arch_class(arch));
      const SafeTensorInfo& t = *it->second.info;
      TD_CHECK(t.shape == p.shape, "'{}': tensor '{}' has shape {}; config.json makes it {}",
               it->second.file->path(), p.name, shape_str(t.shape), shape_str(p.shape));
      TD_CHECK(is_float_dtype(t.dtype),
               "'{}': tensor '{}' has dtype {}; tandem reads F32, F16 and BF16 weights",
               it->second.file->path(), p.name, t.dtype);
      used.insert(p.name);
    }
  }
  // Every other tensor is a named buffer or a tied head's copy of the embedding.
  const auto [copy, embedding] = tied_copy(arch, naming_);
  for (const auto& [name, s] : src) {
    if (used.count(name) || is_known_buffer(arch, naming_, config_.model.n_layer, name)) continue;
    TD_CHECK(config_.model.tied_head && name == copy,
             "'{}' holds tensor '{}', which {} does not have (shape {})", s.file->path(), name,
             hf_arch_class(arch), shape_str(s.info->shape));
    const Source& e = src.at(embedding);
    TD_CHECK(s.info->dtype == e.info->dtype && s.info->shape == e.info->shape &&
                 std::memcmp(s.file->data(*s.info), e.file->data(*e.info),
                             static_cast<size_t>(s.info->end - s.info->begin)) == 0,
             "'{}' holds tensor '{}', which differs from '{}' though config.json ties the head "
             "to the embedding",
             s.file->path(), name, embedding);
  }
}

HfModel::~HfModel() = default;

void HfModel::read_range(int unit, int64_t begin, int64_t end, float* out) const {
  const UnitLayout& u = layout_->unit(unit);
  TD_CHECK(0 <= begin && begin <= end, "read_range [{}, {}) of unit {}", begin, end, u.name);
  std::fill(out, out + (end - begin), 0.0f);
  // The unit's parameters are in offset order: start at the first that ends past `begin`,
  // so that many short ranges (a tensor-parallel rank's columns) cost little each.
  const std::vector<size_t>& ids = plan_->by_unit[static_cast<size_t>(unit)];
  auto first = std::partition_point(ids.begin(), ids.end(), [&](size_t i) {
    return plan_->maps[i].spec->offset + plan_->maps[i].spec->numel <= begin;
  });
  for (auto it = first; it != ids.end(); ++it) {
    const ParamMap& m = plan_->maps[*it];
    const ParamSpec& ps = *m.spec;
    if (ps.offset >= end) break;
    const int64_t lo = std::max(begin, ps.offset), hi = std::min(end, ps.offset + ps.numel);
    for (int64_t e = lo; e < hi;) {
      const int64_t pos = e - ps.offset, r = pos / m.K, k0 = pos % m.K;
      const int64_t n = std::min(m.K - k0, hi - e);
      if (const Piece* p = m.piece_of(r)) {
        const Source& s = plan_->sources.at(p->name);
        const int64_t row = r - p->row0;
        convert(s.info->dtype, s.file->data(*s.info), p->base(row, m.K) + k0 * p->stride(),
                p->stride(), n, out + (e - begin));
      }
      e += n;
    }
  }
}

std::vector<float> HfModel::read_pieces(int unit, const std::vector<TpPiece>& pieces) const {
  const UnitLayout& u = layout_->unit(unit);
  std::vector<float> out(static_cast<size_t>(tp_pieces_numel(pieces)), 0.0f);
  int64_t at = 0;
  for (const TpPiece& p : pieces) {
    TD_CHECK(p.zeros || (p.begin >= 0 && p.count >= 0 && p.begin + p.count <= u.numel),
             "piece [{}, {}) of unit {} of '{}' is outside its {} parameters", p.begin,
             p.begin + p.count, u.name, dir_, u.numel);
    if (!p.zeros) read_range(unit, p.begin, p.begin + p.count, out.data() + at);
    at += p.count;
  }
  return out;
}

std::vector<std::vector<float>> HfModel::load_params() const {
  std::vector<std::vector<float>> params;
  for (const UnitLayout& u : layout_->units()) {
    std::vector<float> p(static_cast<size_t>(u.numel));
    read_range(u.index, 0, u.numel, p.data());
    params.push_back(std::move(p));
  }
  return params;
}

std::vector<std::vector<float>> HfModel::load_param_shard(const FlatLayout& flat,
                                                          int shard_rank) const {
  TD_CHECK(flat.num_units() == layout_->num_units(),
           "Hugging Face model '{}' has {} units, the layout to load {}", dir_,
           layout_->num_units(), flat.num_units());
  TD_CHECK(shard_rank >= 0 && shard_rank < flat.shard_size(),
           "shard rank {} to load from '{}' is outside [0, {})", shard_rank, dir_,
           flat.shard_size());
  std::vector<std::vector<float>> shards;
  for (int u = 0; u < flat.num_units(); ++u) {
    TD_CHECK(flat.unit(u).numel == layout_->unit(u).numel,
             "'{}' unit {} has {} parameters, the layout to load {}", dir_, layout_->unit(u).name,
             layout_->unit(u).numel, flat.unit(u).numel);
    const int64_t shard = flat.unit(u).shard, begin = flat.shard_begin(u, shard_rank);
    std::vector<float> s(static_cast<size_t>(shard));
    read_range(u, begin, begin + shard, s.data());
    shards.push_back(std::move(s));
  }
  return shards;
}

std::vector<SafeTensor> hf_tensors(const ModelLayout& layout,
                                   const std::vector<std::vector<float>>& params,
                                   const HfExportOptions& options) {
  const HfArch arch = hf_arch_for(layout.config());
  TD_CHECK(params.size() == static_cast<size_t>(layout.num_units()),
           "export of {} units for a model of {}", params.size(), layout.num_units());
  const std::string dtype = options.dtype == "f32"    ? "F32"
                            : options.dtype == "bf16" ? "BF16"
                            : options.dtype == "f16"  ? "F16"
                                                      : "";
  TD_CHECK(!dtype.empty(), "--dtype must be f32, bf16 or f16, got '{}'", options.dtype);
  const size_t esize = safetensors_dtype_size(dtype);
  std::vector<std::pair<int, SafeTensor>> out;
  for (const ParamMap& m : MapBuilder(layout, arch, options.naming).build()) {
    const std::vector<float>& buf = params[static_cast<size_t>(m.unit)];
    TD_CHECK(static_cast<int64_t>(buf.size()) >= m.spec->offset + m.spec->numel,
             "unit {} holds {} values, too few for its parameters", m.unit, buf.size());
    for (const Piece& p : m.pieces) {
      SafeTensor t;
      t.name = p.name;
      t.dtype = dtype;
      t.shape = p.shape;
      t.data.resize(static_cast<size_t>(t.numel()) * esize);
      for (int64_t i = 0; i < p.rows; ++i) {
        const float* row = buf.data() + m.spec->offset + (p.row0 + i) * m.K;
        const int64_t base = p.base(i, m.K), stride = p.stride();
        for (int64_t k = 0; k < m.K; ++k) {
          uint8_t* dst = t.data.data() + static_cast<size_t>(base + k * stride) * esize;
          const float v = row[k];
          if (dtype == "F32") {
            std::memcpy(dst, &v, 4);
          } else {
            const uint16_t h = dtype == "BF16" ? bf16_from_f32(v) : f16_from_f32(v);
            TD_CHECK(dtype == "BF16" || !std::isfinite(v) || (h & 0x7c00u) != 0x7c00u,
                     "value {} of tensor '{}' overflows f16 (largest 65504); export with --dtype "
                     "bf16 or f32",
                     v, p.name);
            std::memcpy(dst, &h, 2);
          }
        }
      }
      out.emplace_back(p.order, std::move(t));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<SafeTensor> tensors;
  for (auto& [order, t] : out) tensors.push_back(std::move(t));
  return tensors;
}

std::vector<HfTensorView> hf_tensor_views(const ModelLayout& layout, const HfNaming& naming) {
  const HfArch arch = hf_arch_for(layout.config());
  std::vector<std::pair<int, HfTensorView>> out;
  for (const ParamMap& m : MapBuilder(layout, arch, naming).build()) {
    for (const Piece& p : m.pieces) {
      HfTensorView v;
      v.name = p.name;
      v.unit = m.unit;
      v.offset = m.spec->offset + p.row0 * m.K;
      const bool matrix = p.shape.size() == 2;
      if (p.heads > 0) {
        // Hugging Face row (h, which, d) is tandem row (which, h, d).
        const int64_t D = p.head_dim, H = p.heads;
        v.shape = {H, 3, D};
        v.strides = {D * m.K, H * D * m.K, m.K};
        if (matrix) {
          v.shape.push_back(m.K);
          v.strides.push_back(1);
        }
      } else if (p.transposed) {
        v.shape = p.shape;  // [K, rows]
        v.strides = {1, m.K};
      } else {
        v.shape = p.shape;
        v.strides = matrix ? std::vector<int64_t>{m.K, 1} : std::vector<int64_t>{1};
      }
      out.emplace_back(p.order, std::move(v));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<HfTensorView> views;
  for (auto& [order, v] : out) views.push_back(std::move(v));
  return views;
}

void hf_export(const std::string& out_dir, const ModelLayout& layout,
               const std::vector<std::vector<float>>& params, const HfExportOptions& options) {
  std::error_code ec;
  TD_CHECK(!fs::exists(out_dir, ec) || (fs::is_directory(out_dir, ec) && fs::is_empty(out_dir, ec)),
           "'{}' exists and is not an empty directory; export to a new directory", out_dir);
  TD_CHECK(options.max_shard_bytes > 0, "--max-shard-size must be positive");
  // Everything that can be refused is refused before a byte is written.
  const ordered_json config = hf_config_json(layout.config(), options.tokens, options.dtype);
  std::vector<SafeTensor> tensors = hf_tensors(layout, params, options);

  // Files in state-dict order: a new one when the next tensor would pass the limit.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t filled = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = tensors[i].data.size();
    if (!shards.back().empty() && filled + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      filled = 0;
    }
    shards.back().push_back(i);
    filled += bytes;
    total += bytes;
  }

  const std::string tmp = out_dir + ".tmp";
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  TD_CHECK(fs::is_directory(tmp), "cannot create '{}': {}", tmp, ec.message());
  try {
    const std::map<std::string, std::string> meta = {{"format", "pt"}};
    ordered_json weight_map = ordered_json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string name =
          shards.size() == 1
              ? std::string(kSingleFile)
              : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
      std::vector<SafeTensor> part;
      for (size_t i : shards[s]) {
        weight_map[tensors[i].name] = name;
        part.push_back(std::move(tensors[i]));
      }
      safetensors_write((fs::path(tmp) / name).string(), part, meta);
    }
    if (shards.size() > 1) {
      const nlohmann::json index = {{"metadata", {{"total_size", total}}},
                                    {"weight_map", nlohmann::json(weight_map)}};
      const std::string text = index.dump(2) + "\n";
      file_write_atomic((fs::path(tmp) / kIndexFile).string(), text.data(), text.size());
    }
    const std::string text = config.dump(2) + "\n";
    file_write_atomic((fs::path(tmp) / "config.json").string(), text.data(), text.size());
    const HfTokens& t = options.tokens;
    if (t.bos || !t.eos.empty() || t.pad) {
      ordered_json gen = ordered_json::object();
      if (t.bos) gen["bos_token_id"] = *t.bos;
      if (t.eos.size() == 1) gen["eos_token_id"] = t.eos[0];
      if (t.eos.size() > 1) gen["eos_token_id"] = t.eos;
      if (t.pad) gen["pad_token_id"] = *t.pad;
      const std::string g = gen.dump(2) + "\n";
      file_write_atomic((fs::path(tmp) / "generation_config.json").string(), g.data(), g.size());
    }
    if (fs::exists(out_dir, ec)) fs::remove(out_dir, ec);  // empty, checked above
    fs::rename(tmp, out_dir, ec);
    TD_CHECK(!ec, "cannot rename '{}' to '{}': {}", tmp, out_dir, ec.message());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace tandem
