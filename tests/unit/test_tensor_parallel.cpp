// Tensor-parallel ranks on the CPU, all simulated in one process: the cuts of each rank's
// parameters against a construction index by index; `ways` ranks running their block
// halves in lockstep, with their partial buffers summed between the halves as an
// all-reduce would, give the whole model's logits (a full forward pass, and a cached
// prefill followed by decode steps) for GPT-2 (tied head), Llama (grouped-query attention,
// key/value heads split and shared) and GPT-NeoX (parallel residual, partial rotary);
// reading only a rank's pieces from a tandem checkpoint and from Hugging Face directories
// gives the cut of the whole load; refusals name their numbers; the kernel tables' null
// residual; the config's head size and tensor-parallel share.
//
// Tolerances. The ranks and the whole model run the same fp32 kernels; they differ only in
// how each output product's sum is split: a rank sums its K / ways terms, the all-reduce
// then adds `ways` partial sums. Each element of a product of reduction length K (here K <=
// 144: d_model, d_ff or the attention width) changes by at most about K * 2^-24 ~ 1e-5 of
// the sum of its terms' magnitudes, and those changes pass through two blocks and the head.
// Normwise (||a - b|| / ||b||) they average far below that worst case (observed: below
// 6e-7); 1e-5 leaves a margin and is four orders of magnitude below what a missing reduce,
// a residual or bias counted on every rank or a wrong cut gives (the negative control
// below: > 1e-2; those mutations of the code give 0.1 to 1).
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "decode_test_util.h"
#include "device/cpu/kernel_table.h"
#include "device/device.h"
#include "io/model_source.h"
#include "io/shard_checkpoint.h"
#include "model/activations.h"
#include "model/compose.h"
#include "model/config.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "shard/flat.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using Params = std::vector<std::vector<float>>;

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

// The test models: two blocks each, vocabularies that no number of ranks tested divides
// into multiples of 64 (so the last ranks' head rows run past the padded vocabulary), and
// random parameters with biases and norm gains moved off 0 and 1.
ModelConfig gpt2_model() {  // tied head; ways 2, 3, 6
  ModelConfig c = decode_test::tiny("gpt2-tiny", 48, 6, 40);
  c.vocab = 197;
  c.vocab_padded = 200;
  return c;
}
ModelConfig llama_model() {  // 8 query heads, 2 key/value heads; ways 2 (split), 4, 8 (shared)
  ModelConfig c = decode_test::tiny("llama-tiny", 64, 8, 40);
  c.n_kv_head = 2;
  c.vocab = 247;
  c.vocab_padded = 250;
  return c;
}
ModelConfig neox_model() {  // parallel residual, a quarter of each head rotating; ways 2, 3, 4
  ModelConfig c = decode_test::tiny("pythia-tiny", 96, 12, 40);
  c.vocab = 200;
  c.vocab_padded = 200;
  return c;
}

struct Case {
  std::string name;
  ModelConfig config;
  std::vector<int> ways;
};

std::vector<Case> cases() {
  return {{"gpt2", gpt2_model(), {1, 2, 3, 6}},
          {"llama", llama_model(), {1, 2, 4, 8}},
          {"neox", neox_model(), {1, 2, 3, 4}}};
}

// One simulated rank: its model and its parameters, cut from the whole model's.
struct Rank {
  std::unique_ptr<ModelLayout> layout;
  Params params;
  UnitParams ptrs;
};

std::vector<Rank> make_ranks(const ModelLayout& global, const Params& gp, int ways) {
  std::vector<Rank> ranks(static_cast<size_t>(ways));
  for (int r = 0; r < ways; ++r) {
    Rank& rank = ranks[static_cast<size_t>(r)];
    rank.layout = std::make_unique<ModelLayout>(tp_local_config(global.config(), ways, r));
    for (int u = 0; u < global.num_units(); ++u)
      rank.params.push_back(
          tp_cut(gp[static_cast<size_t>(u)], tp_unit_pieces(global, *rank.layout, u)));
    for (const auto& p : rank.params) rank.ptrs.push_back(p.data());
  }
  return ranks;
}

UnitParams ptrs_of(const Params& p) {
  UnitParams out;
  for (const auto& x : p) out.push_back(x.data());
  return out;
}

// The all-reduce: every rank's buffer becomes the fp32 sum of all of them, in rank order.
void all_reduce(const std::vector<Rank>& ranks, const std::vector<Workspace*>& ws, int u,
                BlockPart part) {
  std::vector<TpReduce> bufs;
  for (size_t r = 0; r < ranks.size(); ++r)
    bufs.push_back(tp_reduce_after(*ranks[r].layout, u, part, *ws[r]));
  for (const TpReduce& b : bufs) {
    ASSERT_EQ(b.buf == nullptr, bufs[0].buf == nullptr);
    ASSERT_EQ(b.count, bufs[0].count);
  }
  if (bufs[0].buf == nullptr) return;
  std::vector<float> sum(static_cast<size_t>(bufs[0].count), 0.0f);
  for (const TpReduce& b : bufs)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += static_cast<const float*>(b.buf)[i];
  for (const TpReduce& b : bufs) std::memcpy(b.buf, sum.data(), sum.size() * sizeof(float));
}

// Units [u0, u1) on every rank in lockstep: a block's attention half on all ranks, the
// reduce, its MLP half, the reduce (`reduce` false leaves the reduces out).
void run_ranks(Kernels& k, const std::vector<Rank>& ranks, const std::vector<Workspace*>& ws,
               int u0, int u1, bool reduce = true) {
  for (int u = u0; u < u1; ++u) {
    if (ranks[0].layout->unit(u).kind != UnitKind::block) {
      for (size_t r = 0; r < ranks.size(); ++r)
        unit_forward(k, *ranks[r].layout, u, ranks[r].ptrs, *ws[r]);
      continue;
    }
    for (BlockPart part : {BlockPart::attention, BlockPart::mlp}) {
      for (size_t r = 0; r < ranks.size(); ++r)
        unit_forward_part(k, *ranks[r].layout, u, ranks[r].ptrs, *ws[r], part);
      if (reduce) all_reduce(ranks, ws, u, part);
    }
  }
}

// The ranks' logits [N, head_rows] as the whole model's [N, Vp]; checks that every row a
// rank computes past the padded vocabulary is zero.
std::vector<float> gather_logits(const std::vector<Rank>& ranks, const std::vector<Workspace*>& ws,
                                 int N, int Vp) {
  std::vector<float> out(static_cast<size_t>(N) * static_cast<size_t>(Vp), 0.0f);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const ModelConfig& c = ranks[r].layout->config();
    const int rows = c.head_rows(), begin = c.head_begin();
    const float* l = static_cast<const float*>(ws[r]->logits);
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < rows; ++j) {
        const float v = l[static_cast<size_t>(n) * rows + j];
        if (begin + j < Vp)
          out[static_cast<size_t>(n) * Vp + begin + j] = v;
        else
          EXPECT_EQ(v, 0.0f) << "rank " << r << " row " << n << " id " << begin + j;
      }
  }
  return out;
}

std::vector<float> logits_of(const Workspace& ws, int N, int Vp) {
  const float* l = static_cast<const float*>(ws.logits);
  return std::vector<float>(l, l + static_cast<size_t>(N) * Vp);
}

constexpr double kTol = 1e-5;

// ---------------------------------------------------------------------------------------
// The cuts

// Rank r's parameters of unit u built index by index from what each weight means.
std::vector<float> direct_local(const ModelLayout& global, const ModelLayout& local, int u,
                                const std::vector<float>& g) {
  const ModelConfig& gc = global.config();
  const ModelConfig& lc = local.config();
  const int r = lc.tp.rank, ways = lc.tp.ways;
  const int64_t C = gc.d_model, D = gc.head_dim(), H = gc.n_head, Hkv = gc.n_kv_head;
  const int64_t F = gc.d_ff, A = gc.attn_dim(), Hl = H / ways, Fl = F / ways, Al = A / ways;
  const int64_t Kl = lc.n_kv_head;
  // The global key/value head that local key/value head t stands for: the one its first
  // query head (a global head r Hl + t Hl/Kl) reads.
  auto kv_global = [&](int64_t t) { return (r * Hl + t * (Hl / Kl)) / (H / Hkv); };
  // Global row of local row i of the fused qkv.
  auto qkv_row = [&](int64_t i) {
    if (i < Hl * D) return r * Hl * D + i;
    i -= Hl * D;
    if (i < Kl * D) return H * D + kv_global(i / D) * D + i % D;
    i -= Kl * D;
    return (H + Hkv) * D + kv_global(i / D) * D + i % D;
  };
  const UnitLayout& lu = local.unit(u);
  const UnitLayout& gu = global.unit(u);
  std::vector<float> out(static_cast<size_t>(lu.numel));
  for (const ParamSpec& lp : lu.params) {
    const int64_t go = gu.param(lp.id).offset;
    const int64_t R = lp.shape[0], K = lp.shape.size() > 1 ? lp.shape[1] : 1;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t k = 0; k < K; ++k) {
        float v = 0.0f;
        switch (lp.id) {
          case ParamId::qkv_w:
            v = g[static_cast<size_t>(go + qkv_row(i) * C + k)];
            break;
          case ParamId::qkv_b:
            v = g[static_cast<size_t>(go + qkv_row(i))];
            break;
          case ParamId::proj_w:
            v = g[static_cast<size_t>(go + i * A + r * Al + k)];
            break;
          case ParamId::fc_w:
          case ParamId::fc_b: {
            const int64_t row = i < Fl ? r * Fl + i : F + r * Fl + (i - Fl);  // gate, then up
            v = g[static_cast<size_t>(go + row * K + k)];
            break;
          }
          case ParamId::fc2_w:
            v = g[static_cast<size_t>(go + i * F + r * Fl + k)];
            break;
          case ParamId::proj_b:
          case ParamId::fc2_b:
            v = r == 0 ? g[static_cast<size_t>(go + i)] : 0.0f;
            break;
          case ParamId::head_w: {
            const int64_t row = lc.head_begin() + i;
            v = row < gc.vocab_padded ? g[static_cast<size_t>(go + row * C + k)] : 0.0f;
            break;
          }
          default:
            v = g[static_cast<size_t>(go + i * K + k)];
            break;
        }
        out[static_cast<size_t>(lp.offset + i * K + k)] = v;
      }
  }
  return out;
}

TEST(TpCuts, PiecesEqualTheIndexByIndexConstruction) {
  for (const Case& cs : cases()) {
    const ModelLayout global(cs.config);
    // Distinct values, so that a piece from the wrong place cannot pass.
    Params gp;
    for (const UnitLayout& u : global.units()) {
      std::vector<float> p(static_cast<size_t>(u.numel));
      for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(i + 1) + 0.25f * u.index;
      gp.push_back(std::move(p));
    }
    for (int ways : cs.ways)
      for (int r = 0; r < ways; ++r) {
        const ModelLayout local(tp_local_config(cs.config, ways, r));
        for (int u = 0; u < global.num_units(); ++u) {
          SCOPED_TRACE(cs.name + " ways " + std::to_string(ways) + " rank " + std::to_string(r) +
                       " unit " + global.unit(u).name);
          const std::vector<TpPiece> pieces = tp_unit_pieces(global, local, u);
          EXPECT_EQ(tp_cut(gp[static_cast<size_t>(u)], pieces),
                    direct_local(global, local, u, gp[static_cast<size_t>(u)]));
          // Merged: no two neighbours that one piece could hold.
          for (size_t i = 1; i < pieces.size(); ++i) {
            const TpPiece& a = pieces[i - 1];
            const TpPiece& b = pieces[i];
            EXPECT_FALSE(a.zeros && b.zeros);
            EXPECT_FALSE(!a.zeros && !b.zeros && a.begin + a.count == b.begin);
          }
          if (ways == 1) {
            ASSERT_EQ(pieces.size(), 1u);
            EXPECT_EQ(pieces[0].begin, 0);
            EXPECT_EQ(pieces[0].count, global.unit(u).numel);
          }
        }
      }
  }
}

TEST(TpCuts, RankConfigs) {
  const ModelConfig c = llama_model();
  const ModelConfig l2 = tp_local_config(c, 2, 1), l4 = tp_local_config(c, 4, 3);
  EXPECT_EQ(l2.n_head, 4);
  EXPECT_EQ(l2.n_kv_head, 1);  // 2 key/value heads over 2 ranks
  EXPECT_EQ(l4.n_head, 2);
  EXPECT_EQ(l4.n_kv_head, 1);  // the one its two query heads read
  EXPECT_EQ(l4.d_ff, c.d_ff / 4);
  EXPECT_EQ(l4.head_dim(), c.head_dim());
  EXPECT_EQ(l4.attn_dim(), c.attn_dim() / 4);
  EXPECT_EQ(l4.qkv_dim(), (2 + 2) * c.head_dim());
  EXPECT_EQ(l4.vocab_padded, c.vocab_padded);
  EXPECT_EQ(l4.tp.ways, 4);
  EXPECT_EQ(l4.tp.rank, 3);
  EXPECT_FALSE(l4.tp_lead());
  EXPECT_TRUE(tp_local_config(c, 4, 0).tp_lead());
  EXPECT_EQ(tp_local_config(c, 1, 0), c);
  // Head rows: ceil(250 / 4) = 63, rounded up to 64; rank 3 covers [192, 256).
  EXPECT_EQ(l4.head_rows(), 64);
  EXPECT_EQ(l4.head_begin(), 192);
  EXPECT_EQ(c.head_rows(), 250);
  // GPT-2's 50304 rows: halves of 25152 (a multiple of 64), quarters of 12576 -> 12608.
  ModelConfig g = preset("gpt2-124m");
  EXPECT_EQ(tp_local_config(g, 2, 1).head_rows(), 25152);
  EXPECT_EQ(tp_local_config(g, 4, 1).head_rows(), 12608);
  EXPECT_EQ(tp_local_config(g, 4, 3).head_begin(), 3 * 12608);
  // The activation table and the cache follow the rank's config.
  const auto k = cpu_kernels();
  const ActivationTraits tr = activation_traits(*k, l4, 3, 1, WorkspaceUse::decode, 8);
  for (const TensorSpec& t : activation_table(l4, 3, 1, tr)) {
    if (t.id == ActId::logits) {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{3, 64}));
    }
    if (t.id == ActId::qkv) {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{3, l4.qkv_dim()}));
    }
    if (t.id == ActId::fch) {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{3, 2 * c.d_ff / 4}));
    }
  }
  EXPECT_EQ(KvCache::block_bytes(l4, 2, 8, 4), KvCache::block_bytes(c, 2, 8, 4) / 2);
  EXPECT_EQ(KvCache::block_bytes(l2, 2, 8, 4), KvCache::block_bytes(c, 2, 8, 4) / 2);
}

TEST(TpCuts, RefusalsNameTheNumbers) {
  ModelConfig c = preset("llama2-7b");
  EXPECT_EQ(error_of([&] { tp_check(c, 3); }),
            "tp over 3 ranks needs the query heads (32) divisible by 3");
  c.n_head = 12;
  c.n_kv_head = 6;
  c.d_model = 4 * 12 * 64;
  c.d_ff = 64;
  EXPECT_EQ(error_of([&] { tp_check(c, 4); }),
            "tp over 4 ranks needs the key/value heads (6) divisible by 4 or dividing 4");
  c.n_kv_head = 4;
  c.d_ff = 10;
  EXPECT_EQ(error_of([&] { tp_check(c, 4); }),
            "tp over 4 ranks needs the MLP width d_ff (10) divisible by 4");
  EXPECT_EQ(error_of([&] { tp_check(c, 0); }), "tp over 0 ranks: the rank count must be positive");
  const ModelConfig l = llama_model();
  EXPECT_EQ(error_of([&] { tp_local_config(l, 2, 2); }), "tp rank 2 is outside [0, 2)");
  EXPECT_EQ(error_of([&] { tp_local_config(tp_local_config(l, 2, 1), 2, 0); }),
            "tp_local_config of a config that is already rank 1 of 2");
  // Pieces of a rank of another model.
  const ModelLayout global(l), other(tp_local_config(neox_model(), 2, 0));
  EXPECT_NE(error_of([&] { tp_unit_pieces(global, other, 1); }).find("is not rank 0 of 2"),
            std::string::npos);
  // A sequential block of a rank runs in parts; a rank has no backward.
  const ModelLayout rank(tp_local_config(l, 2, 1));
  const auto k = cpu_kernels();
  auto ws = Workspace::on_host(rank.config(), 1, 2, activation_traits(*k, rank.config(), 1, 2));
  std::vector<float> dummy(1 << 16);
  UnitParams params(static_cast<size_t>(rank.num_units()), dummy.data());
  EXPECT_EQ(error_of([&] { unit_forward(*k, rank, 1, params, *ws); }),
            "block.0 of tensor-parallel rank 1 of 2 runs in two parts, with xmid reduced between "
            "them");
  EXPECT_EQ(error_of([&] { unit_forward_part(*k, rank, 0, params, *ws, BlockPart::attention); }),
            "unit embedding runs whole, not in parts");
  UnitGrads grads(static_cast<size_t>(rank.num_units()), nullptr);
  EXPECT_EQ(error_of([&] { unit_backward(*k, rank, 3, params, grads, *ws, 1.0f); }),
            "the backward of tensor-parallel rank 1 of 2 is not implemented");
}

// ---------------------------------------------------------------------------------------
// The ranks compute the whole model

TEST(TpForward, RanksInLockstepEqualTheWholeModel) {
  const auto k = cpu_kernels();
  for (const Case& cs : cases()) {
    const ModelLayout global(cs.config);
    const Params gp = decode_test::init_params(global, 7);
    const UnitParams gptr = ptrs_of(gp);
    const int B = 2, T = 7, N = B * T, Vp = cs.config.vocab_padded;
    const std::vector<int32_t> tokens = decode_test::prompt_of(N, cs.config.vocab, 3);
    auto full = Workspace::on_host(cs.config, B, T, activation_traits(*k, cs.config, B, T));
    std::copy(tokens.begin(), tokens.end(), full->tokens);
    model_forward(*k, global, gptr, *full);
    const std::vector<float> want = logits_of(*full, N, Vp);
    for (int ways : cs.ways) {
      SCOPED_TRACE(cs.name + " ways " + std::to_string(ways));
      const std::vector<Rank> ranks = make_ranks(global, gp, ways);
      std::vector<std::unique_ptr<Workspace>> own;
      std::vector<Workspace*> ws;
      for (const Rank& r : ranks) {
        const ModelConfig& c = r.layout->config();
        own.push_back(Workspace::on_host(c, B, T, activation_traits(*k, c, B, T)));
        std::copy(tokens.begin(), tokens.end(), own.back()->tokens);
        ws.push_back(own.back().get());
      }
      run_ranks(*k, ranks, ws, 0, global.num_units());
      const double d = decode_test::rel_diff(gather_logits(ranks, ws, N, Vp), want);
      EXPECT_LT(d, kTol);
      if (ways == 1) {
        EXPECT_EQ(d, 0.0);  // one rank is the whole model, bit for bit
      }
      if (ways > 1) {  // the negative control: no reduces
        run_ranks(*k, ranks, ws, 0, global.num_units(), false);
        EXPECT_GT(decode_test::rel_diff(gather_logits(ranks, ws, N, Vp), want), 1e-2);
      }
    }
  }
}

// A cached prefill of B prompts of T tokens, its last rows to the head, then decode steps,
// on the whole model and on the ranks.
struct CachedRun {
  ModelConfig config;
  std::vector<std::vector<float>> kv;  // per block: K then V
  KvCache cache;
  std::unique_ptr<Workspace> prefill, decode;

  CachedRun(Kernels& k, const ModelConfig& c, int B, int T, int P) : config(c) {
    cache.slots = B;
    cache.positions = P;
    const size_t bytes = KvCache::block_bytes(c, B, P, sizeof(float));
    for (int l = 0; l < c.n_layer; ++l) {
      kv.emplace_back(bytes / sizeof(float), 0.0f);
      kv.emplace_back(bytes / sizeof(float), 0.0f);
    }
    for (int l = 0; l < c.n_layer; ++l) {
      cache.k.push_back(kv[static_cast<size_t>(2 * l)].data());
      cache.v.push_back(kv[static_cast<size_t>(2 * l + 1)].data());
    }
    prefill = Workspace::on_host(c, B, T, activation_traits(k, c, B, T, WorkspaceUse::prefill, P));
    decode = Workspace::on_host(c, B, 1, activation_traits(k, c, B, 1, WorkspaceUse::decode, P));
    prefill->cache = &cache;
    decode->cache = &cache;
  }
  void set_prompts(const std::vector<int32_t>& tokens, int B, int T) {
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        prefill->tokens[b * T + t] = tokens[static_cast<size_t>(b * T + t)];
        prefill->positions[b * T + t] = t;
        prefill->slots[b * T + t] = b;
      }
    for (int b = 0; b < B; ++b) {
      decode->positions[b] = T;
      decode->slots[b] = b;
    }
  }
  // Each prompt's last row into the decode workspace, for the head.
  void last_rows(Kernels& k, int B, int T) {
    const size_t C = static_cast<size_t>(config.d_model);
    for (int b = 0; b < B; ++b)
      k.copy_rows(static_cast<float*>(decode->residual.back()) + b * C,
                  static_cast<const float*>(prefill->residual.back()) +
                      (static_cast<size_t>(b) * T + T - 1) * C,
                  1, config.d_model, 0);
  }
  void next(const std::vector<int32_t>& tokens, int B) {
    for (int b = 0; b < B; ++b) {
      decode->tokens[b] = tokens[static_cast<size_t>(b)];
      if (next_called_) ++decode->positions[b];
    }
    next_called_ = true;
  }

 private:
  bool next_called_ = false;
};

TEST(TpForward, CachedPrefillAndDecodeStepsEqualTheWholeModel) {
  const auto k = cpu_kernels();
  for (const Case& cs : cases()) {
    const ModelLayout global(cs.config);
    const Params gp = decode_test::init_params(global, 11);
    const UnitParams gptr = ptrs_of(gp);
    const int B = 3, T = 5, P = 12, Vp = cs.config.vocab_padded, U = global.num_units();
    const std::vector<int32_t> prompts = decode_test::prompt_of(B * T, cs.config.vocab, 5);
    for (int ways : cs.ways) {
      SCOPED_TRACE(cs.name + " ways " + std::to_string(ways));
      CachedRun full(*k, cs.config, B, T, P);
      const std::vector<Rank> ranks = make_ranks(global, gp, ways);
      std::vector<std::unique_ptr<CachedRun>> runs;
      for (const Rank& r : ranks)
        runs.push_back(std::make_unique<CachedRun>(*k, r.layout->config(), B, T, P));
      auto all = [&](auto&& f) {
        f(full);
        for (auto& r : runs) f(*r);
      };
      auto spaces = [&](bool prefill) {
        std::vector<Workspace*> ws;
        for (auto& r : runs) ws.push_back(prefill ? r->prefill.get() : r->decode.get());
        return ws;
      };
      all([&](CachedRun& r) { r.set_prompts(prompts, B, T); });
      // Prefill: embedding and blocks on the prompts, the last rows, the head.
      for (int u = 0; u < U - 1; ++u) unit_forward(*k, global, u, gptr, *full.prefill);
      run_ranks(*k, ranks, spaces(true), 0, U - 1);
      all([&](CachedRun& r) { r.last_rows(*k, B, T); });
      unit_forward(*k, global, U - 1, gptr, *full.decode);
      run_ranks(*k, ranks, spaces(false), U - 1, U);
      EXPECT_LT(decode_test::rel_diff(gather_logits(ranks, spaces(false), B, Vp),
                                      logits_of(*full.decode, B, Vp)),
                kTol);
      // Decode steps, each token the whole model's greedy choice.
      for (int step = 0; step < 4; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        std::vector<int32_t> next(static_cast<size_t>(B));
        const std::vector<float> l = logits_of(*full.decode, B, Vp);
        for (int b = 0; b < B; ++b)
          next[static_cast<size_t>(b)] = static_cast<int32_t>(
              std::max_element(l.begin() + b * Vp, l.begin() + b * Vp + cs.config.vocab) -
              (l.begin() + b * Vp));
        all([&](CachedRun& r) { r.next(next, B); });
        model_forward(*k, global, gptr, *full.decode);
        run_ranks(*k, ranks, spaces(false), 0, U);
        const double d = decode_test::rel_diff(gather_logits(ranks, spaces(false), B, Vp),
                                               logits_of(*full.decode, B, Vp));
        EXPECT_LT(d, kTol);
        if (ways == 1) {
          EXPECT_EQ(d, 0.0);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Reading only the pieces

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            fmt::format("tandem_{}_{}_{}", info->test_suite_name(), info->name(), ::getpid());
    fs::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

// Every rank's tp_load_params from `source` equals the cut of the whole load.
void expect_pieces_load(const ModelSource& source, const std::vector<int>& ways_list) {
  const ModelLayout global(source.config());
  const Params whole = source.load_params();
  for (int ways : ways_list)
    for (int r = 0; r < ways; ++r) {
      SCOPED_TRACE(source.dir() + " ways " + std::to_string(ways) + " rank " + std::to_string(r));
      const ModelLayout local(tp_local_config(source.config(), ways, r));
      const Params got = tp_load_params(source, global, local);
      ASSERT_EQ(got.size(), whole.size());
      for (int u = 0; u < global.num_units(); ++u)
        EXPECT_EQ(got[static_cast<size_t>(u)],
                  tp_cut(whole[static_cast<size_t>(u)], tp_unit_pieces(global, local, u)))
            << global.unit(u).name;
    }
}

TEST(TpLoad, CheckpointPiecesEqualTheCutOfTheWholeLoad) {
  for (const Case& cs : cases()) {
    TempDir dir;
    const ModelLayout layout(cs.config);
    const FlatLayout flat(layout, 1, 64);
    const Params p = decode_test::init_params(layout, 3);
    ShardState state;
    for (int u = 0; u < layout.num_units(); ++u) {
      std::vector<float> s(static_cast<size_t>(flat.unit(u).shard), 0.0f);
      std::copy(p[static_cast<size_t>(u)].begin(), p[static_cast<size_t>(u)].end(), s.begin());
      state.params.push_back(s);
      state.m.emplace_back(s.size(), 0.0f);
      state.v.emplace_back(s.size(), 0.0f);
    }
    CheckpointMeta meta;
    meta.model = cs.config;
    meta.step = 5;
    meta.seed = 1;
    const std::unique_ptr<Device> device = device_create_cpu();
    const std::unique_ptr<Communicator> world = comm_world(*device, CommOptions{});
    const std::unique_ptr<Stream> stream = device->stream_create("checkpoint");
    checkpoint_save(dir.path(), meta, flat, 0, state, *world, *device, *stream);
    const std::unique_ptr<ModelSource> source = ModelSource::open(dir.path());
    ASSERT_EQ(source->load_params(), p);
    expect_pieces_load(*source, cs.ways);
    // Out of range pieces are refused, naming the unit.
    EXPECT_NE(error_of([&] {
                source->load_unit_pieces(1, {{0, layout.unit(1).numel + 1}});
              }).find("outside its"),
              std::string::npos);
  }
}

TEST(TpLoad, HuggingFacePiecesEqualTheCutOfTheWholeLoad) {
  // GPT-2 (tied, Conv1D transposed), Llama (grouped-query, untied; tied in bf16 shards),
  // GPT-NeoX (per-head fused qkv) in fp16. Vocabulary 300 -> 320 rows.
  const std::string root = std::string(TANDEM_TEST_DATA_DIR) + "/fixtures/hf/";
  for (const char* name : {"gpt2", "llama", "llama-tied-bf16-sharded", "neox-fp16"}) {
    const std::unique_ptr<ModelSource> source = ModelSource::open(root + name);
    expect_pieces_load(*source, {1, 2, 4});
  }
}

// ---------------------------------------------------------------------------------------
// The kernel tables' null residual and the config

TEST(TpKernels, NullResidualIsTheProductAlone) {
  const auto k = cpu_kernels();
  const int N = 3, IC = 10, OC = 7, F = IC;
  std::vector<float> x(N * IC), w(OC * IC), bias(OC), h(N * 2 * F), res(N * OC);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * i);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.3f * i);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.5f - 0.1f * i;
  for (size_t i = 0; i < h.size(); ++i) h[i] = std::sin(1.3f * i + 0.2f);
  for (size_t i = 0; i < res.size(); ++i) res[i] = 2.0f + i;
  // References in double: the product, and SwiGLU then the product.
  auto product = [&](const std::vector<float>& in, const float* b) {
    std::vector<float> y(N * OC);
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < OC; ++o) {
        double s = b != nullptr ? b[o] : 0.0;
        for (int i = 0; i < IC; ++i) s += static_cast<double>(in[n * IC + i]) * w[o * IC + i];
        y[n * OC + o] = static_cast<float>(s);
      }
    return y;
  };
  std::vector<float> a(N * F);
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < F; ++j) {
      const double g = h[n * 2 * F + j], u = h[n * 2 * F + F + j];
      a[n * F + j] = static_cast<float>(g / (1.0 + std::exp(-g)) * u);
    }
  // Sums of 10 products of magnitude <= 1: a few fp32 roundings of 10 terms.
  auto expect_near = [](const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  };
  for (const float* b :
       {static_cast<const float*>(bias.data()), static_cast<const float*>(nullptr)}) {
    std::vector<float> out(N * OC, 99.0f);
    k->linear_residual_forward(out.data(), x.data(), w.data(), b, nullptr, N, IC, OC);
    expect_near(out, product(x, b));
    std::vector<float> with(N * OC);
    k->linear_residual_forward(with.data(), x.data(), w.data(), b, res.data(), N, IC, OC);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(with[i], out[i] + res[i]);
    std::vector<float> sw(N * OC, 99.0f);
    k->swiglu_linear_residual_forward(sw.data(), h.data(), w.data(), b, nullptr, N, F, OC);
    expect_near(sw, product(a, b));
  }
}

TEST(TpConfig, HeadSizeAndTheShareInJson) {
  ModelConfig c = llama_model();
  nlohmann::json j = model_config_to_json(c);
  EXPECT_FALSE(j.contains("head_size"));  // configs without it are written as before
  EXPECT_EQ(model_config_from_json(j), c);
  // A head size that is not d_model / n_head: written, read back, validated.
  c.head_size = 12;
  j = model_config_to_json(c);
  EXPECT_EQ(j.at("head_size"), 12);
  const ModelConfig back = model_config_from_json(j);
  EXPECT_EQ(back.head_dim(), 12);
  EXPECT_EQ(back.attn_dim(), 8 * 12);
  EXPECT_EQ(back.qkv_dim(), (8 + 2 * 2) * 12);
  EXPECT_EQ(back, c);
  j["n_head"] = 5;  // 64 is no multiple of 5: fine with a head size
  j["n_kv_head"] = 5;
  EXPECT_EQ(model_config_from_json(j).head_dim(), 12);
  j["head_size"] = -1;
  EXPECT_NE(error_of([&] { model_config_from_json(j); }).find("head_size must be positive"),
            std::string::npos);
  // The share is not JSON, but it tells configs apart.
  const ModelConfig l = tp_local_config(llama_model(), 2, 1);
  EXPECT_FALSE(model_config_to_json(l).contains("tp"));
  ModelConfig l0 = l;
  l0.tp.rank = 0;
  EXPECT_FALSE(l0 == l);
  EXPECT_EQ(model_config_to_json(l0), model_config_to_json(l));
}

}  // namespace
}  // namespace tandem
