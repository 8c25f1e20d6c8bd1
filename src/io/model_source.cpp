// The two kinds of model directory behind ModelSource.
#include "io/model_source.h"

#include <filesystem>

#include "core/error.h"

namespace fs = std::filesystem;

namespace tandem {

namespace {

class TandemSource : public ModelSource {
 public:
  explicit TandemSource(std::string dir)
      : dir_(std::move(dir)), meta_(checkpoint_read_meta(dir_)) {}
  const std::string& dir() const override { return dir_; }
  const ModelConfig& config() const override { return meta_.model; }
  std::string describe() const override {
    return fmt::format("tandem checkpoint (step {})", meta_.step);
  }
  int64_t step() const override { return meta_.step; }
  std::vector<std::vector<float>> load_params() const override {
    return checkpoint_load_params(dir_);
  }
  std::vector<std::vector<float>> load_param_shard(const FlatLayout& flat,
                                                   int shard_rank) const override {
    return checkpoint_load_param_shard(dir_, flat, shard_rank);
  }
  std::vector<float> load_unit_pieces(int unit, const std::vector<TpPiece>& pieces) const override {
    if (!reader_) reader_ = std::make_unique<CheckpointParamReader>(dir_);
    return reader_->read_pieces(unit, pieces);
  }

 private:
  std::string dir_;
  CheckpointMeta meta_;
  // Opened by the first piece load and kept, so the index is read and each file verified
  // once however many units are loaded.
  mutable std::unique_ptr<CheckpointParamReader> reader_;
};

class HfSource : public ModelSource {
 public:
  explicit HfSource(const std::string& dir) : model_(dir) {}
  const std::string& dir() const override { return model_.dir(); }
  const ModelConfig& config() const override { return model_.config().model; }
  std::string describe() const override {
    return fmt::format("Hugging Face {}", hf_arch_class(model_.config().arch));
  }
  std::vector<std::vector<float>> load_params() const override { return model_.load_params(); }
  std::vector<std::vector<float>> load_param_shard(const FlatLayout& flat,
                                                   int shard_rank) const override {
    return model_.load_param_shard(flat, shard_rank);
  }
  std::vector<float> load_unit_pieces(int unit, const std::vector<TpPiece>& pieces) const override {
    return model_.read_pieces(unit, pieces);
  }
  HfTokens tokens() const override { return model_.config().tokens; }
  HfNaming hf_naming() const override { return model_.naming(); }
  std::vector<std::string> notes() const override { return model_.config().notes; }

 private:
  HfModel model_;
};

}  // namespace

std::unique_ptr<ModelSource> ModelSource::open(const std::string& dir) {
  std::error_code ec;
  TD_CHECK(fs::exists(dir, ec), "'{}' does not exist", dir);
  TD_CHECK(fs::is_directory(dir, ec),
           "'{}' is not a directory (a tandem checkpoint or a Hugging Face model directory)", dir);
  if (fs::exists(fs::path(dir) / "index.json", ec)) return std::make_unique<TandemSource>(dir);
  if (fs::exists(fs::path(dir) / "config.json", ec)) return std::make_unique<HfSource>(dir);
  TD_THROW(
      "'{}' is neither a tandem checkpoint (no index.json; incomplete?) nor a Hugging Face model "
      "directory (no config.json)",
      dir);
}

std::vector<std::vector<float>> tp_load_params(const ModelSource& source, const ModelLayout& global,
                                               const ModelLayout& local) {
  model_check_same(source.config(), fmt::format("'{}'", source.dir()), global.config());
  TD_CHECK(global.num_units() == local.num_units(),
           "a tensor-parallel rank of {} units for a model of {}", local.num_units(),
           global.num_units());
  std::vector<std::vector<float>> params;
  for (int u = 0; u < local.num_units(); ++u)
    params.push_back(source.load_unit_pieces(u, tp_unit_pieces(global, local, u)));
  return params;
}

std::vector<std::vector<float>> load_units(const ModelSource& source, const ModelLayout& model,
                                           const std::vector<bool>& units) {
  model_check_same(source.config(), fmt::format("'{}'", source.dir()), model.config());
  TD_CHECK(units.size() == static_cast<size_t>(model.num_units()),
           "a choice of {} units for a model of {}", units.size(), model.num_units());
  std::vector<std::vector<float>> params(units.size());
  for (int u = 0; u < model.num_units(); ++u)
    if (units[static_cast<size_t>(u)])
      params[static_cast<size_t>(u)] =
          source.load_unit_pieces(u, {TpPiece{0, model.unit(u).numel, false}});
  return params;
}

bool model_source_is_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

ModelConfig model_resolve(const std::string& preset_json_or_dir, int64_t* step) {
  if (step != nullptr) *step = 0;
  if (!model_source_is_dir(preset_json_or_dir)) return model_config_resolve(preset_json_or_dir);
  const std::unique_ptr<ModelSource> source = ModelSource::open(preset_json_or_dir);
  if (step != nullptr) *step = source->step();
  return source->config();
}

void model_check_same(const ModelConfig& got, const std::string& what,
                      const ModelConfig& expected) {
  ModelConfig a = got, b = expected;
  a.name = b.name = "";
  TD_CHECK(a == b, "{} holds model '{}' ({}), but the run asks for '{}' ({})", what, got.name,
           model_config_to_json(got).dump(), expected.name, model_config_to_json(expected).dump());
}

}  // namespace tandem
