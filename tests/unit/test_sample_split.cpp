// Sampling over a vocabulary split across ranks ([Split sampling] in device/kernels.h) on the
// CPU table: each slice's candidates, gathered in rank order, draw exactly the token that
// sample_tokens draws from the whole row, for every kind of rule, ranks 1 to 4, uneven and
// empty slices, ties and negative logits; the one documented exception (a slice holding more
// than k tokens tied at the k-th value) is recognised and left out. The row offset of a batch
// split over ranks keys the noise so that the parts draw what the whole batch draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "core/error.h"
#include "device/cpu/kernel_table.h"
#include "device/kernels.h"

namespace tandem {
namespace {

struct Lcg {
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
};

// N rows of V logits, row stride Vp (padding columns hold a large value that must never be
// drawn). With `ties`, V / 2 levels (about two tokens a value); else spread values.
std::vector<float> make_logits(Lcg& g, int N, int V, int Vp, bool ties) {
  std::vector<float> x(static_cast<size_t>(N) * static_cast<size_t>(Vp), 1e6f);
  const int levels = std::max(3, V / 2);
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < V; ++i) {
      const int u = static_cast<int>(g.next() % (ties ? levels : 200000));
      x[static_cast<size_t>(n) * Vp + i] =
          ties ? static_cast<float>(u - levels / 2) * 16.0f / static_cast<float>(levels)
               : static_cast<float>(u - 120000) / 9973.0f;
    }
  return x;
}

// Slice bounds [0 = b_0 <= b_1 <= ... <= b_ranks = V]: even (ceil) slices, or random cuts
// (empty slices included).
std::vector<int> slice_bounds(Lcg& g, int V, int ranks, bool even) {
  std::vector<int> b(static_cast<size_t>(ranks) + 1, 0);
  if (even) {
    const int per = (V + ranks - 1) / ranks;
    for (int r = 1; r <= ranks; ++r) b[static_cast<size_t>(r)] = std::min(V, r * per);
  } else {
    for (int r = 1; r < ranks; ++r)
      b[static_cast<size_t>(r)] = static_cast<int>(g.next() % (V + 1));
    b[static_cast<size_t>(ranks)] = V;
    std::sort(b.begin(), b.end());
  }
  return b;
}

// The documented exception: with top_k, a slice holding more than K tokens at or above the
// k-th largest z of the whole row hands over only K of them.
bool slice_cuts_a_tie(const float* row, int V, const std::vector<int>& b, const SamplingParams& p) {
  if (p.temperature == 0.0f || p.top_k == 0 || p.top_k >= V) return false;
  std::vector<float> z(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) z[static_cast<size_t>(i)] = row[i] / p.temperature;
  std::vector<float> sorted = z;
  std::nth_element(sorted.begin(), sorted.begin() + (p.top_k - 1), sorted.end(),
                   std::greater<float>());
  const float kth = sorted[static_cast<size_t>(p.top_k - 1)];
  for (size_t r = 0; r + 1 < b.size(); ++r) {
    int at_or_above = 0;
    for (int i = b[r]; i < b[r + 1]; ++i) at_or_above += z[static_cast<size_t>(i)] >= kth;
    if (at_or_above > p.top_k) return true;
  }
  return false;
}

std::vector<SamplingParams> rules() {
  std::vector<SamplingParams> r;
  for (const int row_offset : {0, 9}) {
    const std::vector<SamplingParams> base = {
        {0.0f, 0, 1.0f, 1},    {0.0f, 4, 0.5f, 2},    // greedy (top_k and top_p ignored)
        {1.0f, 0, 1.0f, 3},    {0.6f, 0, 1.0f, 4},    // temperature alone
        {1.7f, 0, 1.0f, 5},    {0.8f, 1, 1.0f, 6},    // top_k
        {1.0f, 5, 1.0f, 7},    {0.7f, 40, 1.0f, 8},   //
        {1.0f, 5000, 1.0f, 9}, {0.9f, 12, 0.9f, 10},  // top_k >= V; top_k + top_p
        {1.3f, 3, 0.5f, 11},   {1.0f, 64, 0.3f, 12},  //
        {0.5f, 8, 0.99f, 13},  {2.0f, 100, 0.75f, 14}};
    for (SamplingParams p : base) {
      p.row_offset = row_offset;
      r.push_back(p);
    }
  }
  return r;
}

TEST(SampleSplit, CandidatesPerRow) {
  EXPECT_EQ(sample_candidates_per_row(SamplingParams{0.0f, 0, 1.0f, 1}), 1);
  EXPECT_EQ(sample_candidates_per_row(SamplingParams{0.0f, 50, 0.5f, 1}), 1);
  EXPECT_EQ(sample_candidates_per_row(SamplingParams{0.8f, 0, 1.0f, 1}), 1);
  EXPECT_EQ(sample_candidates_per_row(SamplingParams{0.8f, 50, 1.0f, 1}), 50);
  EXPECT_EQ(sample_candidates_per_row(SamplingParams{0.8f, 50, 0.9f, 1}), 50);
  EXPECT_TRUE(sample_split_supported(SamplingParams{0.8f, 50, 0.9f, 1}));
  // top_p without top_k needs every token of a slice: refused, saying what to do.
  EXPECT_FALSE(sample_split_supported(SamplingParams{0.8f, 0, 0.9f, 1}));
  try {
    sample_candidates_per_row(SamplingParams{0.8f, 0, 0.9f, 1});
    FAIL() << "top_p without top_k was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_k"), std::string::npos) << e.what();
  }
}

// The candidates of one slice: the k largest z in id order (ties to the lower id), global ids,
// padding where the slice is short; K = 1: the best logit, or the best z + noise.
TEST(SampleSplit, CandidatesOfASlice) {
  const auto k = cpu_kernels();
  const std::vector<float> x = {1, 3, 3, 2, 3, -7};
  const int32_t pos = 4;
  const float inf = std::numeric_limits<float>::infinity();
  {
    std::vector<float> v(2);
    std::vector<int32_t> id(2);
    k->sample_candidates(v.data(), id.data(), x.data(), &pos, 1, 6, 6, 100,
                         SamplingParams{1.0f, 2, 1.0f, 1});
    EXPECT_EQ(v, (std::vector<float>{3, 3}));
    EXPECT_EQ(id, (std::vector<int32_t>{101, 102}));
    k->sample_candidates(v.data(), id.data(), x.data(), &pos, 1, 6, 6, 100,
                         SamplingParams{0.5f, 2, 1.0f, 1});
    EXPECT_EQ(v, (std::vector<float>{6, 6}));
  }
  {
    std::vector<float> v(4);
    std::vector<int32_t> id(4);
    k->sample_candidates(v.data(), id.data(), x.data() + 3, &pos, 1, 3, 3, 7,
                         SamplingParams{1.0f, 4, 1.0f, 1});
    EXPECT_EQ(v, (std::vector<float>{2, 3, -7, -inf}));
    EXPECT_EQ(id, (std::vector<int32_t>{7, 8, 9, -1}));
    k->sample_candidates(v.data(), id.data(), nullptr, &pos, 1, 0, 0, 7,
                         SamplingParams{1.0f, 4, 1.0f, 1});
    EXPECT_EQ(v, (std::vector<float>(4, -inf)));
    EXPECT_EQ(id, (std::vector<int32_t>(4, -1)));
  }
  float v = 0;
  int32_t id = 0;
  k->sample_candidates(&v, &id, x.data(), &pos, 1, 6, 6, 10, SamplingParams{0.0f, 0, 1.0f, 1});
  EXPECT_EQ(v, 3.0f);
  EXPECT_EQ(id, 11);
  k->sample_candidates(&v, &id, x.data(), &pos, 1, 0, 0, 10, SamplingParams{0.0f, 0, 1.0f, 1});
  EXPECT_EQ(id, -1);
  // A K that is not the rule's is refused.
  std::vector<int32_t> tok(1);
  EXPECT_THROW(k->sample_pick(tok.data(), &v, &id, &pos, 1, 1, 1, SamplingParams{1.0f, 2, 1.0f, 1}),
               Error);
}

TEST(SampleSplit, GatheredCandidatesDrawWhatTheWholeRowDraws) {
  const auto k = cpu_kernels();
  Lcg g{2024};
  int compared = 0, excepted = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int V = std::vector<int>{1, 2, 3, 7, 50, 203, 1000, 4099}[static_cast<size_t>(trial % 8)];
    const int N = 3, Vp = V + trial % 3;
    const bool ties = trial % 2 == 1;
    const std::vector<float> logits = make_logits(g, N, V, Vp, ties);
    std::vector<int32_t> pos(N);
    for (int32_t& q : pos) q = static_cast<int32_t>(g.next() % 5000);
    for (const SamplingParams& p : rules()) {
      std::vector<int32_t> whole(N);
      k->sample_tokens(whole.data(), logits.data(), pos.data(), N, V, Vp, p);
      const int K = sample_candidates_per_row(p);
      for (int ranks = 1; ranks <= 4; ++ranks)
        for (const bool even : {true, false}) {
          SCOPED_TRACE(::testing::Message()
                       << "trial " << trial << " V=" << V << " ranks=" << ranks << " even=" << even
                       << " T=" << p.temperature << " top_k=" << p.top_k << " top_p=" << p.top_p
                       << " seed=" << p.seed << " row_offset=" << p.row_offset);
          const std::vector<int> b = slice_bounds(g, V, ranks, even);
          // Each rank's candidates, gathered [ranks][N][K].
          std::vector<float> vals(static_cast<size_t>(ranks) * N * K);
          std::vector<int32_t> ids(vals.size());
          for (int r = 0; r < ranks; ++r) {
            const int lo = b[static_cast<size_t>(r)], Vr = b[static_cast<size_t>(r) + 1] - lo;
            const int Vpr = Vr + 2;  // the slice's own padded stride
            std::vector<float> slice(static_cast<size_t>(N) * Vpr, 1e6f);
            for (int n = 0; n < N; ++n)
              std::copy_n(logits.begin() + static_cast<ptrdiff_t>(n) * Vp + lo, Vr,
                          slice.begin() + static_cast<ptrdiff_t>(n) * Vpr);
            const size_t at = static_cast<size_t>(r) * N * K;
            k->sample_candidates(vals.data() + at, ids.data() + at, slice.data(), pos.data(), N, Vr,
                                 Vpr, lo, p);
          }
          std::vector<int32_t> split(N, -2);
          k->sample_pick(split.data(), vals.data(), ids.data(), pos.data(), N, ranks, K, p);
          for (int n = 0; n < N; ++n) {
            if (slice_cuts_a_tie(logits.data() + static_cast<size_t>(n) * Vp, V, b, p)) {
              ++excepted;
              continue;
            }
            ++compared;
            EXPECT_EQ(split[static_cast<size_t>(n)], whole[static_cast<size_t>(n)]) << "row " << n;
          }
        }
    }
  }
  // The exception is rare: most cases were compared.
  EXPECT_GT(compared, 8 * excepted) << compared << " compared, " << excepted << " excepted";
  std::printf("%d rows compared, %d left out (a slice cut a tie at the k-th value)\n", compared,
              excepted);
}

// A batch split over ranks: rows [a, b) drawn with row_offset a (plus the batch's own offset)
// are rows [a, b) of the whole batch's draw; without the offset they are other draws.
TEST(SampleSplit, RowOffsetDrawsThePartOfTheWholeBatch) {
  const auto k = cpu_kernels();
  Lcg g{77};
  const int N = 24, V = 300, Vp = 304;
  const std::vector<float> logits = make_logits(g, N, V, Vp, false);
  std::vector<int32_t> pos(N);
  for (int32_t& q : pos) q = static_cast<int32_t>(g.next() % 100);
  for (const SamplingParams base :
       {SamplingParams{1.0f, 0, 1.0f, 3}, SamplingParams{2.0f, 0, 0.9f, 4},
        SamplingParams{1.5f, 20, 0.8f, 5}}) {
    for (const int batch_offset : {0, 100}) {
      SamplingParams p = base;
      p.row_offset = batch_offset;
      std::vector<int32_t> whole(N);
      k->sample_tokens(whole.data(), logits.data(), pos.data(), N, V, Vp, p);
      for (const auto& [a, b] : {std::pair{0, 5}, std::pair{5, 13}, std::pair{13, 24}}) {
        SCOPED_TRACE(::testing::Message() << "rows [" << a << ", " << b << ") seed " << p.seed
                                          << " batch offset " << batch_offset);
        SamplingParams part = p;
        part.row_offset = batch_offset + a;
        std::vector<int32_t> got(static_cast<size_t>(b - a));
        k->sample_tokens(got.data(), logits.data() + static_cast<size_t>(a) * Vp, pos.data() + a,
                         b - a, V, Vp, part);
        for (int n = a; n < b; ++n)
          EXPECT_EQ(got[static_cast<size_t>(n - a)], whole[static_cast<size_t>(n)]) << "row " << n;
      }
      // The offset is in the key: the last 11 rows drawn as rows 0..10 differ somewhere.
      SamplingParams wrong = p;
      wrong.row_offset = batch_offset;
      std::vector<int32_t> got(11);
      k->sample_tokens(got.data(), logits.data() + static_cast<size_t>(13) * Vp, pos.data() + 13,
                       11, V, Vp, wrong);
      EXPECT_FALSE(std::equal(got.begin(), got.end(), whole.begin() + 13));
    }
  }
}

}  // namespace
}  // namespace tandem
