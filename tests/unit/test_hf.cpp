// Hugging Face model directories in the library: every tensor of each architecture lands in
// the tandem parameter and element it should (checked against the layouts written out
// here, element by element), F16 and BF16 convert to fp32 exactly, sharded directories
// load like single files, a rank's shard of any layout equals its slice of the whole model,
// export writes back the same bytes, and a model no class expresses is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "hf_test_util.h"
#include "io/file.h"
#include "io/hf.h"
#include "io/model_source.h"
#include "io/safetensors.h"
#include "shard/flat.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using namespace hf_test;

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name =
        fmt::format("tandem_{}_{}_{}", info->test_suite_name(), info->name(), ::getpid());
    for (char& ch : name)
      if (ch == '/') ch = '_';
    path_ = fs::temp_directory_path() / name;
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  ADD_FAILURE() << "expected a tandem::Error";
  return "";
}

// Checks every element of tandem parameter `id` of unit `unit` against expect(row, col)
// (a vector parameter has one column).
void expect_param(const ModelLayout& layout, const std::vector<std::vector<float>>& params,
                  int unit, ParamId id, const std::function<float(int64_t, int64_t)>& expect) {
  const UnitLayout& u = layout.unit(unit);
  const ParamSpec& p = u.param(id);
  const int64_t R = p.shape[0], K = p.numel / R;
  int wrong = 0;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) {
      const float got =
          params[static_cast<size_t>(unit)][static_cast<size_t>(p.offset + r * K + k)];
      const float want = expect(r, k);
      if (std::memcmp(&got, &want, 4) != 0 && wrong++ < 3)
        ADD_FAILURE() << u.name << "." << p.name << " [" << r << ", " << k << "]: " << got
                      << " != " << want;
    }
  EXPECT_EQ(wrong, 0) << u.name << "." << p.name;
}

TEST(HfImport, Gpt2TransposesConv1DAndPadsTheVocabulary) {
  TempDir dir;
  const ordered_json cfg = gpt2_config();
  const std::vector<SafeTensor> ts = random_tensors(gpt2_shapes(cfg), "F32");
  write_dir(dir / "m", cfg, ts);
  HfModel hf(dir / "m");
  const ModelConfig& c = hf.config().model;
  EXPECT_EQ(hf.config().arch, HfArch::gpt2);
  EXPECT_EQ(c.family, Family::gpt2);
  EXPECT_EQ(c.vocab, 100);
  EXPECT_EQ(c.vocab_padded, 128);
  EXPECT_EQ(c.context, 32);
  EXPECT_EQ(c.d_ff, 64);
  EXPECT_EQ(c.mlp, MlpKind::gelu_tanh);
  EXPECT_TRUE(c.tied_head);
  EXPECT_EQ(hf.config().tokens.bos, 98);
  EXPECT_EQ(hf.config().tokens.eos, std::vector<int64_t>{99});
  EXPECT_TRUE(hf.config().notes.empty());
  const std::vector<std::vector<float>> p = hf.load_params();
  const ModelLayout& L = hf.layout();
  const int64_t C = 16, F = 64;
  auto v = [&](const std::string& n) {
    return [&ts, n](int64_t i) { return value_at(by_name(ts, n), i); };
  };
  expect_param(L, p, 0, ParamId::wte, [&](int64_t r, int64_t k) {
    return r < 100 ? v("transformer.wte.weight")(r * C + k) : 0.0f;
  });
  expect_param(L, p, 0, ParamId::wpe,
               [&](int64_t r, int64_t k) { return v("transformer.wpe.weight")(r * C + k); });
  for (int l = 0; l < 2; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    const int u = l + 1;
    auto vec = [&](const std::string& n) {
      return [&, n](int64_t r, int64_t) { return v(h + n)(r); };
    };
    expect_param(L, p, u, ParamId::norm1_w, vec("ln_1.weight"));
    expect_param(L, p, u, ParamId::norm1_b, vec("ln_1.bias"));
    // Conv1D weights are [in, out]: tandem's [out, in] row r, column k is element (k, r).
    expect_param(L, p, u, ParamId::qkv_w,
                 [&](int64_t r, int64_t k) { return v(h + "attn.c_attn.weight")(k * 3 * C + r); });
    expect_param(L, p, u, ParamId::qkv_b, vec("attn.c_attn.bias"));
    expect_param(L, p, u, ParamId::proj_w,
                 [&](int64_t r, int64_t k) { return v(h + "attn.c_proj.weight")(k * C + r); });
    expect_param(L, p, u, ParamId::proj_b, vec("attn.c_proj.bias"));
    expect_param(L, p, u, ParamId::norm2_w, vec("ln_2.weight"));
    expect_param(L, p, u, ParamId::norm2_b, vec("ln_2.bias"));
    expect_param(L, p, u, ParamId::fc_w,
                 [&](int64_t r, int64_t k) { return v(h + "mlp.c_fc.weight")(k * F + r); });
    expect_param(L, p, u, ParamId::fc_b, vec("mlp.c_fc.bias"));
    expect_param(L, p, u, ParamId::fc2_w,
                 [&](int64_t r, int64_t k) { return v(h + "mlp.c_proj.weight")(k * C + r); });
    expect_param(L, p, u, ParamId::fc2_b, vec("mlp.c_proj.bias"));
  }
  expect_param(L, p, 3, ParamId::normf_w,
               [&](int64_t r, int64_t) { return v("transformer.ln_f.weight")(r); });
  expect_param(L, p, 3, ParamId::normf_b,
               [&](int64_t r, int64_t) { return v("transformer.ln_f.bias")(r); });
}

TEST(HfImport, Gpt2WithoutPrefixWithBuffersAndTiedHeadCopy) {
  TempDir dir;
  const ordered_json cfg = gpt2_config();
  std::vector<SafeTensor> ts = random_tensors(gpt2_shapes(cfg, false), "F32");
  // What old files hold beside the parameters: the causal mask and its fill value, and
  // the head's copy of the tied embedding.
  for (int l = 0; l < 2; ++l) {
    ts.push_back(random_tensor("h." + std::to_string(l) + ".attn.bias", {1, 1, 32, 32}, "F32"));
    ts.push_back(random_tensor("h." + std::to_string(l) + ".attn.masked_bias", {}, "F32"));
  }
  SafeTensor head = by_name(ts, "wte.weight");
  head.name = "lm_head.weight";
  ts.push_back(head);
  write_dir(dir / "m", cfg, ts);
  HfModel hf(dir / "m");
  EXPECT_FALSE(hf.naming().gpt2_prefix);
  const std::vector<std::vector<float>> p = hf.load_params();
  expect_param(hf.layout(), p, 0, ParamId::wte, [&](int64_t r, int64_t k) {
    return r < 100 ? value_at(by_name(ts, "wte.weight"), r * 16 + k) : 0.0f;
  });
  // Exported, the names keep the directory's spelling and the buffers are gone.
  HfExportOptions o;
  o.naming = hf.naming();
  const std::vector<SafeTensor> out = hf_tensors(hf.layout(), p, o);
  EXPECT_EQ(out.size(), gpt2_shapes(cfg, false).size());
  for (const SafeTensor& t : out) EXPECT_EQ(t.data, by_name(ts, t.name).data) << t.name;
}

TEST(HfImport, LlamaConcatenatesQkvAndGateUpWithGqa) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    TempDir dir;
    const ordered_json cfg = llama_config(tied);
    const std::vector<SafeTensor> ts = random_tensors(llama_shapes(cfg), "F32");
    write_dir(dir / "m", cfg, ts);
    HfModel hf(dir / "m");
    const ModelConfig& c = hf.config().model;
    EXPECT_EQ(c.family, Family::llama);
    EXPECT_EQ(c.n_head, 4);
    EXPECT_EQ(c.n_kv_head, 2);
    EXPECT_EQ(c.rope_theta, 500000.0f);
    EXPECT_EQ(c.norm_eps, 1e-6f);
    EXPECT_EQ(c.tied_head, tied);
    EXPECT_EQ(c.vocab_padded, 128);
    EXPECT_EQ(hf.config().tokens.eos, (std::vector<int64_t>{2, 3}));
    const std::vector<std::vector<float>> p = hf.load_params();
    const ModelLayout& L = hf.layout();
    const int64_t C = 16, F = 24, Hq = 16, Hkv = 8;
    auto v = [&](const std::string& n, int64_t i) { return value_at(by_name(ts, n), i); };
    expect_param(L, p, 0, ParamId::wte, [&](int64_t r, int64_t k) {
      return r < 90 ? v("model.embed_tokens.weight", r * C + k) : 0.0f;
    });
    for (int l = 0; l < 2; ++l) {
      const std::string b = "model.layers." + std::to_string(l) + ".";
      const int u = l + 1;
      expect_param(L, p, u, ParamId::qkv_w, [&](int64_t r, int64_t k) {
        if (r < Hq) return v(b + "self_attn.q_proj.weight", r * C + k);
        if (r < Hq + Hkv) return v(b + "self_attn.k_proj.weight", (r - Hq) * C + k);
        return v(b + "self_attn.v_proj.weight", (r - Hq - Hkv) * C + k);
      });
      expect_param(L, p, u, ParamId::proj_w, [&](int64_t r, int64_t k) {
        return v(b + "self_attn.o_proj.weight", r * Hq + k);
      });
      expect_param(L, p, u, ParamId::fc_w, [&](int64_t r, int64_t k) {
        return r < F ? v(b + "mlp.gate_proj.weight", r * C + k)
                     : v(b + "mlp.up_proj.weight", (r - F) * C + k);
      });
      expect_param(L, p, u, ParamId::fc2_w,
                   [&](int64_t r, int64_t k) { return v(b + "mlp.down_proj.weight", r * F + k); });
      expect_param(L, p, u, ParamId::norm1_w,
                   [&](int64_t r, int64_t) { return v(b + "input_layernorm.weight", r); });
      expect_param(L, p, u, ParamId::norm2_w,
                   [&](int64_t r, int64_t) { return v(b + "post_attention_layernorm.weight", r); });
    }
    expect_param(L, p, 3, ParamId::normf_w,
                 [&](int64_t r, int64_t) { return v("model.norm.weight", r); });
    if (!tied)
      expect_param(L, p, 3, ParamId::head_w, [&](int64_t r, int64_t k) {
        return r < 90 ? v("lm_head.weight", r * C + k) : 0.0f;
      });
  }
}

TEST(HfImport, NeoxRegroupsPerHeadQkvRows) {
  for (const std::string head : {"embed_out.weight", "lm_head.weight"}) {
    SCOPED_TRACE(head);
    TempDir dir;
    const ordered_json cfg = neox_config();
    const std::vector<SafeTensor> ts = random_tensors(neox_shapes(cfg, head), "F32");
    write_dir(dir / "m", cfg, ts);
    HfModel hf(dir / "m");
    const ModelConfig& c = hf.config().model;
    EXPECT_EQ(c.family, Family::neox);
    EXPECT_EQ(c.residual, ResidualKind::parallel);
    EXPECT_EQ(c.rotary_dim(), 2);
    EXPECT_EQ(c.mlp, MlpKind::gelu_erf);
    EXPECT_EQ(hf.naming().neox_head, head);
    const std::vector<std::vector<float>> p = hf.load_params();
    const ModelLayout& L = hf.layout();
    const int64_t C = 16, H = 2, D = 8;
    auto v = [&](const std::string& n, int64_t i) { return value_at(by_name(ts, n), i); };
    for (int l = 0; l < 2; ++l) {
      const std::string b = "gpt_neox.layers." + std::to_string(l) + ".";
      // Hugging Face rows are (head, q|k|v, channel); tandem's are (q|k|v, head, channel).
      auto hf_row = [&](int64_t r) {
        const int64_t which = r / (H * D), h = (r / D) % H, d = r % D;
        return h * 3 * D + which * D + d;
      };
      expect_param(L, p, l + 1, ParamId::qkv_w, [&](int64_t r, int64_t k) {
        return v(b + "attention.query_key_value.weight", hf_row(r) * C + k);
      });
      expect_param(L, p, l + 1, ParamId::qkv_b, [&](int64_t r, int64_t) {
        return v(b + "attention.query_key_value.bias", hf_row(r));
      });
      expect_param(L, p, l + 1, ParamId::proj_w, [&](int64_t r, int64_t k) {
        return v(b + "attention.dense.weight", r * C + k);
      });
      expect_param(L, p, l + 1, ParamId::fc_b,
                   [&](int64_t r, int64_t) { return v(b + "mlp.dense_h_to_4h.bias", r); });
    }
    expect_param(L, p, 3, ParamId::head_w,
                 [&](int64_t r, int64_t k) { return r < 70 ? v(head, r * C + k) : 0.0f; });
  }
}

TEST(HfDtype, F16ToF32IsExactAndRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0x1f) {
      EXPECT_TRUE(m ? std::isnan(f) : std::isinf(f)) << h;
      continue;
    }
    const double want = e == 0 ? sign * std::ldexp(double(m), -24)
                               : sign * std::ldexp(1.0 + m / 1024.0, int(e) - 15);
    ASSERT_EQ(double(f), want) << "f16 bits " << h;
    ASSERT_EQ(f16_from_f32(f), h) << "f16 bits " << h;
  }
  // Rounding to nearest even, overflow and underflow.
  EXPECT_EQ(f16_from_f32(1.0f + 0x1p-11f), 0x3c00);      // halfway, to even (down)
  EXPECT_EQ(f16_from_f32(1.0f + 3 * 0x1p-11f), 0x3c02);  // halfway, to even (up)
  EXPECT_EQ(f16_from_f32(65504.0f), 0x7bff);
  EXPECT_EQ(f16_from_f32(65520.0f), 0x7c00);  // rounds past the largest
  EXPECT_EQ(f16_from_f32(0x1p-25f), 0x0000);  // half the smallest: to even
  EXPECT_EQ(f16_from_f32(0x1.8p-25f), 0x0001);
  EXPECT_EQ(f16_from_f32(-0x1p-24f), 0x8001);
}

TEST(HfDtype, Bf16AndF16FilesLoadExactly) {
  for (const std::string dtype : {"BF16", "F16"}) {
    SCOPED_TRACE(dtype);
    TempDir dir;
    const ordered_json cfg = neox_config();
    const std::vector<SafeTensor> ts = random_tensors(neox_shapes(cfg), dtype);
    write_dir(dir / "m", cfg, ts);
    HfModel hf(dir / "m");
    const std::vector<std::vector<float>> p = hf.load_params();
    expect_param(hf.layout(), p, 1, ParamId::fc_w, [&](int64_t r, int64_t k) {
      return value_at(by_name(ts, "gpt_neox.layers.0.mlp.dense_h_to_4h.weight"), r * 16 + k);
    });
    // Every stored value is an fp32 value: converting back gives the stored bits.
    HfExportOptions o;
    o.dtype = dtype == "BF16" ? "bf16" : "f16";
    for (const SafeTensor& t : hf_tensors(hf.layout(), p, o))
      EXPECT_EQ(t.data, by_name(ts, t.name).data) << t.name;
  }
}

// The three architectures' directories for the loops below.
struct Case {
  const char* name;
  ordered_json config;
  Shapes shapes;
};
std::vector<Case> cases() {
  return {{"gpt2", gpt2_config(), gpt2_shapes(gpt2_config())},
          {"llama", llama_config(), llama_shapes(llama_config())},
          {"llama-tied", llama_config(true), llama_shapes(llama_config(true))},
          {"neox", neox_config(), neox_shapes(neox_config())}};
}

TEST(HfImport, ShardedDirectoryLoadsLikeOneFile) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    const std::vector<SafeTensor> ts = random_tensors(c.shapes, "BF16");
    write_dir(dir / "one", c.config, ts);
    write_dir(dir / "three", c.config, ts, 3);
    EXPECT_TRUE(fs::exists(dir / "three/model.safetensors.index.json"));
    EXPECT_EQ(HfModel(dir / "one").load_params(), HfModel(dir / "three").load_params());
  }
}

TEST(HfImport, EveryShardOfEveryLayoutIsItsSliceOfTheWholeModel) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    write_dir(dir / "m", c.config, random_tensors(c.shapes, "F16"), 2);
    const std::unique_ptr<ModelSource> src = ModelSource::open(dir / "m");
    const std::vector<std::vector<float>> whole = src->load_params();
    const ModelLayout layout(src->config());
    for (int shards = 1; shards <= 4; ++shards) {
      for (int64_t align : {int64_t{64}, int64_t{1}, int64_t{7}}) {
        const FlatLayout flat(layout, shards, align);
        for (int u = 0; u < flat.num_units(); ++u) {
          std::vector<float> joined;
          for (int r = 0; r < shards; ++r) {
            const auto part = src->load_param_shard(flat, r);
            joined.insert(joined.end(), part[static_cast<size_t>(u)].begin(),
                          part[static_cast<size_t>(u)].end());
          }
          ASSERT_EQ(static_cast<int64_t>(joined.size()), flat.unit(u).padded);
          std::vector<float> want = whole[static_cast<size_t>(u)];
          want.resize(joined.size(), 0.0f);
          ASSERT_EQ(joined, want) << "unit " << u << " at " << shards << " shards, align " << align;
        }
      }
    }
  }
}

// Import then export with the same dtype gives back every tensor byte for byte, in one file
// or in shards, with an index when sharded.
TEST(HfExport, ImportThenExportIsTheIdentity) {
  for (const Case& c : cases()) {
    for (const std::string dtype : {"f32", "bf16"}) {
      for (int shards : {1, 3}) {
        SCOPED_TRACE(fmt::format("{} {} {} shard(s)", c.name, dtype, shards));
        TempDir dir;
        const std::string st = dtype == "f32" ? "F32" : "BF16";
        ordered_json cfg = c.config;
        const std::vector<SafeTensor> ts = random_tensors(c.shapes, st);
        write_dir(dir / "in", cfg, ts, shards);
        const std::unique_ptr<ModelSource> src = ModelSource::open(dir / "in");
        HfExportOptions o;
        o.dtype = dtype;
        o.tokens = src->tokens();
        o.naming = src->hf_naming();
        // A limit that splits the model into about `shards` files.
        uint64_t total = 0;
        for (const SafeTensor& t : ts) total += t.data.size();
        o.max_shard_bytes = shards == 1 ? total : total / shards + 1;
        const ModelLayout layout(src->config());
        hf_export(dir / "out", layout, src->load_params(), o);
        EXPECT_FALSE(fs::exists(dir / "out.tmp"));

        const std::unique_ptr<ModelSource> back = ModelSource::open(dir / "out");
        EXPECT_NO_THROW(model_check_same(back->config(), "the export", src->config()));
        EXPECT_EQ(back->tokens().bos, src->tokens().bos);
        EXPECT_EQ(back->tokens().eos, src->tokens().eos);
        std::vector<SafeTensor> written;
        if (shards == 1) {
          ASSERT_TRUE(fs::exists(dir / "out/model.safetensors"));
          written = safetensors_read(dir / "out/model.safetensors").tensors;
        } else {
          const auto index =
              nlohmann::json::parse(file_read_all(dir / "out/model.safetensors.index.json"));
          std::set<std::string> files;
          for (const auto& [name, file] : index["weight_map"].items()) files.insert(file);
          EXPECT_GE(files.size(), 2u);
          EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
          for (const std::string& f : files) {
            const SafeTensorsFile sf = safetensors_read(dir / ("out/" + f));
            EXPECT_EQ(sf.metadata.at("format"), "pt");
            for (const SafeTensor& t : sf.tensors) {
              EXPECT_EQ(index["weight_map"][t.name], f) << t.name;
              written.push_back(t);
            }
          }
        }
        ASSERT_EQ(written.size(), ts.size());
        for (const SafeTensor& t : written) {
          const SafeTensor& want = by_name(ts, t.name);
          EXPECT_EQ(t.dtype, want.dtype) << t.name;
          EXPECT_EQ(t.shape, want.shape) << t.name;
          EXPECT_TRUE(t.data == want.data) << t.name << " differs";
        }
      }
    }
  }
}

TEST(HfExport, ConfigReadsBackAsTheSameModel) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny", "pythia-tiny"}) {
    SCOPED_TRACE(preset);
    TempDir dir;
    const ModelConfig c = tandem::preset(preset);
    const ModelLayout layout(c);
    std::vector<std::vector<float>> params;
    for (const UnitLayout& u : layout.units()) {
      params.emplace_back(static_cast<size_t>(u.numel));
      layout.init_slice(u.index, 3, 0, u.numel, params.back().data());
    }
    hf_export(dir / "out", layout, params, {});
    HfModel back(dir / "out");
    ModelConfig a = back.config().model, b = c;
    a.name = b.name = "";
    EXPECT_EQ(a, b) << model_config_to_json(back.config().model).dump();
    EXPECT_EQ(back.load_params(), params);
  }
}

TEST(HfExport, RefusesWhatNoClassExpresses) {
  TempDir dir;
  ModelConfig c = preset("gpt2-tiny");
  c.rotary_pct = 0.5f;
  const ModelLayout layout(c);
  std::vector<std::vector<float>> params;
  for (const UnitLayout& u : layout.units()) params.emplace_back(static_cast<size_t>(u.numel));
  const std::string msg = error_of([&] { hf_export(dir / "out", layout, params, {}); });
  EXPECT_NE(msg.find("GPT2LMHeadModel"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rotary"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir / "out"));
  EXPECT_FALSE(fs::exists(dir / "out.tmp"));

  ModelConfig llama = preset("llama-tiny");
  llama.residual = ResidualKind::parallel;
  EXPECT_NE(error_of([&] { hf_arch_for(llama); }).find("sequential"), std::string::npos);
  // f16 cannot hold 1e5: an error naming the tensor, not an infinity.
  const ModelLayout gl(preset("gpt2-tiny"));
  std::vector<std::vector<float>> big;
  for (const UnitLayout& u : gl.units()) big.emplace_back(static_cast<size_t>(u.numel), 1e5f);
  HfExportOptions o;
  o.dtype = "f16";
  const std::string f16 = error_of([&] { hf_tensors(gl, big, o); });
  EXPECT_NE(f16.find("overflows f16"), std::string::npos) << f16;
  EXPECT_NE(f16.find("transformer.wte.weight"), std::string::npos) << f16;
}

TEST(HfConfig, DropoutIsANoteAndDefaultsApply) {
  TempDir dir;
  ordered_json cfg = gpt2_config();
  cfg["attn_pdrop"] = 0.1;
  cfg["resid_pdrop"] = 0.1;
  cfg.erase("activation_function");
  write_dir(dir / "m", cfg, random_tensors(gpt2_shapes(cfg), "F32"));
  const HfConfig c = hf_config_read(dir / "m");
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_NE(c.notes[0].find("attn_pdrop 0.1"), std::string::npos) << c.notes[0];
  EXPECT_NE(c.notes[0].find("without dropout"), std::string::npos) << c.notes[0];
  EXPECT_EQ(c.model.mlp, MlpKind::gelu_tanh);  // gelu_new, the class default
}

TEST(HfConfig, TransformersFiveSpellings) {
  TempDir dir;
  ordered_json cfg = neox_config();
  cfg.erase("rotary_pct");
  cfg.erase("rotary_emb_base");
  cfg["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", 20000.0}, {"partial_rotary_factor", 0.5}};
  write_dir(dir / "m", cfg, random_tensors(neox_shapes(cfg), "F32"));
  const HfConfig c = hf_config_read(dir / "m");
  EXPECT_EQ(c.model.rope_theta, 20000.0f);
  EXPECT_EQ(c.model.rotary_dim(), 4);

  ordered_json l = llama_config();
  l.erase("rope_theta");
  l["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000.0}};
  write_dir(dir / "l", l, random_tensors(llama_shapes(l), "F32"));
  EXPECT_EQ(hf_config_read(dir / "l").model.rope_theta, 1000.0f);
  // Two spellings that disagree.
  l["rope_theta"] = 2000.0;
  write_dir(dir / "l", l, random_tensors(llama_shapes(l), "F32"));
  EXPECT_NE(error_of([&] { hf_config_read(dir / "l"); }).find("rotary base"), std::string::npos);
}

TEST(HfConfig, GenerationConfigOverridesTokenIds) {
  TempDir dir;
  const ordered_json cfg = llama_config();
  write_dir(dir / "m", cfg, random_tensors(llama_shapes(cfg), "F32"));
  write_text(dir / "m/generation_config.json",
             R"({"bos_token_id": 5, "eos_token_id": 6, "pad_token_id": 7, "temperature": 0.6})");
  const HfConfig c = hf_config_read(dir / "m");
  EXPECT_EQ(c.tokens.bos, 5);
  EXPECT_EQ(c.tokens.eos, std::vector<int64_t>{6});
  EXPECT_EQ(c.tokens.pad, 7);
}

TEST(HfModelSource, ResolvesEveryKindOfModelArgument) {
  TempDir dir;
  const ordered_json cfg = llama_config();
  write_dir(dir / "m", cfg, random_tensors(llama_shapes(cfg), "F32"));
  EXPECT_EQ(model_resolve(dir / "m").n_kv_head, 2);
  EXPECT_EQ(model_resolve("gpt2-tiny").name, "gpt2-tiny");
  fs::create_directories(dir / "empty");
  const std::string msg = error_of([&] { model_resolve(dir / "empty"); });
  EXPECT_NE(msg.find("index.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tandem
