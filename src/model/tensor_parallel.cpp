// A tensor-parallel rank's config and the cuts of its parameters from the whole model's.
#include "model/tensor_parallel.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

void tp_check(const ModelConfig& c, int ways) {
  TD_CHECK(ways >= 1, "tp over {} ranks: the rank count must be positive", ways);
  TD_CHECK(c.n_head % ways == 0, "tp over {} ranks needs the query heads ({}) divisible by {}",
           ways, c.n_head, ways);
  TD_CHECK(c.n_kv_head % ways == 0 || ways % c.n_kv_head == 0,
           "tp over {} ranks needs the key/value heads ({}) divisible by {} or dividing {}", ways,
           c.n_kv_head, ways, ways);
  TD_CHECK(c.d_ff % ways == 0, "tp over {} ranks needs the MLP width d_ff ({}) divisible by {}",
           ways, c.d_ff, ways);
}

ModelConfig tp_local_config(const ModelConfig& c, int ways, int rank) {
  TD_CHECK(c.tp.ways == 1, "tp_local_config of a config that is already rank {} of {}", c.tp.rank,
           c.tp.ways);
  tp_check(c, ways);
  TD_CHECK(rank >= 0 && rank < ways, "tp rank {} is outside [0, {})", rank, ways);
  if (ways == 1) return c;  // the one rank is the model
  ModelConfig l = c;
  l.head_size = c.head_dim();
  l.n_head = c.n_head / ways;
  l.n_kv_head = c.n_kv_head % ways == 0 ? c.n_kv_head / ways : 1;
  l.d_ff = c.d_ff / ways;
  l.tp = {ways, rank};
  return l;
}

namespace {

// Appends pieces, merging a piece into the previous one where they are contiguous.
class Pieces {
 public:
  void add(int64_t begin, int64_t count) {
    if (count == 0) return;
    if (!out_.empty() && !out_.back().zeros && out_.back().begin + out_.back().count == begin) {
      out_.back().count += count;
      return;
    }
    out_.push_back({begin, count, false});
  }
  void zeros(int64_t count) {
    if (count == 0) return;
    if (!out_.empty() && out_.back().zeros) {
      out_.back().count += count;
      return;
    }
    out_.push_back({0, count, true});
  }
  std::vector<TpPiece>& get() { return out_; }

 private:
  std::vector<TpPiece> out_;
};

}  // namespace

std::vector<TpPiece> tp_unit_pieces(const ModelLayout& global, const ModelLayout& local, int unit) {
  const ModelConfig& gc = global.config();
  const ModelConfig& lc = local.config();
  const int ways = lc.tp.ways, r = lc.tp.rank;
  TD_CHECK(gc.tp.ways == 1, "tp pieces cut from rank {} of {}, not from the whole model",
           gc.tp.rank, gc.tp.ways);
  TD_CHECK(lc == tp_local_config(gc, ways, r),
           "tp pieces: the rank's model is not rank {} of {} of the whole model '{}'", r, ways,
           gc.name);
  const UnitLayout& gu = global.unit(unit);
  const UnitLayout& lu = local.unit(unit);
  const int64_t D = gc.head_dim(), H = gc.n_head, Hkv = gc.n_kv_head, F = gc.d_ff;
  const int64_t Hl = lc.n_head, Kl = lc.n_kv_head, Fl = lc.d_ff, Al = lc.attn_dim();
  // The rank's first key/value head: its own share, or the one its query heads read.
  const int64_t kv0 = Hkv % ways == 0 ? r * Kl : r / (ways / Hkv);

  Pieces out;
  int64_t done = 0;
  for (const ParamSpec& lp : lu.params) {
    const ParamSpec& g = gu.param(lp.id);
    const int64_t go = g.offset, R = g.shape[0], K = g.shape.size() > 1 ? g.shape[1] : 1;
    auto whole = [&] { out.add(go, g.numel); };
    auto rows = [&](int64_t r0, int64_t n) { out.add(go + r0 * K, n * K); };
    auto cols = [&](int64_t c0, int64_t n) {
      for (int64_t i = 0; i < R; ++i) out.add(go + i * K + c0, n);
    };
    switch (lp.id) {
      case ParamId::qkv_w:
      case ParamId::qkv_b:
        rows(r * Hl * D, Hl * D);
        rows((H + kv0) * D, Kl * D);
        rows((H + Hkv + kv0) * D, Kl * D);
        break;
      case ParamId::proj_w:
        cols(r * Al, Al);
        break;
      case ParamId::fc_w:
      case ParamId::fc_b:
        rows(r * Fl, Fl);
        if (gc.mlp == MlpKind::swiglu) rows(F + r * Fl, Fl);  // [gate; up]
        break;
      case ParamId::fc2_w:
        cols(r * Fl, Fl);
        break;
      case ParamId::proj_b:
      case ParamId::fc2_b:
        if (lc.tp_lead())
          whole();
        else
          out.zeros(g.numel);
        break;
      case ParamId::head_w: {
        const int64_t begin = lc.head_begin(), n = lc.head_rows();
        const int64_t real = std::clamp<int64_t>(gc.vocab_padded - begin, 0, n);
        if (real > 0) rows(begin, real);
        out.zeros((n - real) * K);
        break;
      }
      default:  // norms and the embedding: whole on every rank
        whole();
        break;
    }
    const int64_t total = tp_pieces_numel(out.get());
    TD_CHECK(total - done == lp.numel, "internal: tp pieces of {} '{}' hold {} elements, not {}",
             lu.name, lp.name, total - done, lp.numel);
    done = total;
  }
  TD_CHECK(done == lu.numel, "internal: tp pieces of {} hold {} elements, not {}", lu.name, done,
           lu.numel);
  return std::move(out.get());
}

std::vector<float> tp_cut(const std::vector<float>& global_unit,
                          const std::vector<TpPiece>& pieces) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(tp_pieces_numel(pieces)));
  for (const TpPiece& p : pieces) {
    if (p.zeros) {
      out.insert(out.end(), static_cast<size_t>(p.count), 0.0f);
      continue;
    }
    TD_CHECK(p.begin >= 0 && p.count >= 0 &&
                 p.begin + p.count <= static_cast<int64_t>(global_unit.size()),
             "tp piece [{}, {}) outside a unit buffer of {} elements", p.begin, p.begin + p.count,
             global_unit.size());
    out.insert(out.end(), global_unit.begin() + p.begin, global_unit.begin() + p.begin + p.count);
  }
  return out;
}

int64_t tp_pieces_numel(const std::vector<TpPiece>& pieces) {
  int64_t n = 0;
  for (const TpPiece& p : pieces) n += p.count;
  return n;
}

}  // namespace tandem
