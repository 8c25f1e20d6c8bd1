// Tests of deterministic sequence sampling: windows, the specified shuffle (check values),
// one visit per window per epoch, and identical sequences for any split of a global batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <thread>
#include <vector>

#include "core/error.h"
#include "io/dataset.h"

namespace tandem {
namespace {

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

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

// tokens[i] = i, so every token names its own position.
std::vector<uint32_t> iota_tokens(size_t n) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), 0u);
  return t;
}

TEST(Dataset, WindowCount) {
  EXPECT_EQ(Dataset(iota_tokens(101), 10, 1).windows(), 10);
  EXPECT_EQ(Dataset(iota_tokens(100), 10, 1).windows(), 9);
  EXPECT_EQ(Dataset(iota_tokens(11), 10, 1).windows(), 1);
  EXPECT_EQ(Dataset(iota_tokens(2), 1, 1).windows(), 1);
}

TEST(Dataset, TooFewTokens) {
  std::string msg = error_of([] { Dataset(iota_tokens(10), 10, 1, "tiny.tok"); });
  EXPECT_CONTAINS(msg, "data file 'tiny.tok' has 10 tokens: too few for one sequence of T+1 = 11");
  EXPECT_CONTAINS(error_of([] { Dataset({}, 4, 1); }), "data has 0 tokens");
  EXPECT_CONTAINS(error_of([] { Dataset(iota_tokens(10), 0, 1); }), "sequence length 0");
}

TEST(Dataset, SequenceIsShiftedWindow) {
  const int T = 8;
  const Dataset data(iota_tokens(100), T, 3);
  ASSERT_EQ(data.windows(), 12);
  std::vector<int32_t> in(T), tg(T);
  for (int64_t k = 0; k < 30; ++k) {
    data.sequence(k, in.data(), tg.data());
    const int64_t w = data.window(k);
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(in[t], w * T + t);
      EXPECT_EQ(tg[t], w * T + t + 1);
    }
  }
}

TEST(Dataset, CheckValues) {
  // The values documented in dataset.h and docs/formats.md, computed independently.
  const Dataset data(iota_tokens(10 * 4 + 1), 4, 42);
  ASSERT_EQ(data.windows(), 10);
  EXPECT_EQ(data.permutation(0), (std::vector<int64_t>{2, 8, 9, 7, 1, 4, 6, 0, 5, 3}));
  EXPECT_EQ(data.permutation(1), (std::vector<int64_t>{3, 1, 6, 8, 4, 5, 9, 7, 2, 0}));
  const Dataset other(iota_tokens(10 * 4 + 1), 4, 7);
  EXPECT_EQ(other.permutation(0), (std::vector<int64_t>{0, 9, 5, 2, 7, 4, 8, 6, 1, 3}));
  for (int64_t k = 0; k < 20; ++k) EXPECT_EQ(data.window(k), data.permutation(k / 10)[k % 10]);
}

TEST(Dataset, Deterministic) {
  const Dataset a(iota_tokens(500), 7, 1234), b(iota_tokens(500), 7, 1234);
  std::vector<int32_t> ia(7), ta(7), ib(7), tb(7);
  // Out of order and across epochs: the answer depends on k only.
  for (int64_t k : {300, 5, 71, 0, 71, 1000, 70, 71}) {
    a.sequence(k, ia.data(), ta.data());
    b.sequence(k, ib.data(), tb.data());
    EXPECT_EQ(ia, ib);
    EXPECT_EQ(ta, tb);
  }
}

TEST(Dataset, EveryWindowOncePerEpoch) {
  const Dataset data(iota_tokens(37 * 5 + 3), 5, 99);
  const int64_t W = data.windows();
  ASSERT_EQ(W, 37);
  std::vector<std::vector<int64_t>> orders;
  for (int64_t e = 0; e < 4; ++e) {
    std::vector<int64_t> seen;
    for (int64_t k = e * W; k < (e + 1) * W; ++k) seen.push_back(data.window(k));
    orders.push_back(seen);
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(W);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all) << "epoch " << e;
  }
  for (size_t i = 0; i < orders.size(); ++i)
    for (size_t j = i + 1; j < orders.size(); ++j)
      EXPECT_NE(orders[i], orders[j]) << "epochs " << i << " and " << j;
}

TEST(Dataset, SeedsDiffer) {
  const Dataset a(iota_tokens(1001), 10, 1), b(iota_tokens(1001), 10, 2);
  EXPECT_NE(a.permutation(0), b.permutation(0));
  EXPECT_NE(a.permutation(3), b.permutation(3));
}

TEST(Dataset, AnySplitReadsTheSameBatch) {
  const int T = 6, G = 12;
  const Dataset data(iota_tokens(23 * T + 1), T, 2024);  // 23 windows: steps cross epochs
  for (int64_t step = 0; step < 6; ++step) {
    std::vector<int32_t> ref_in(G * T), ref_tg(G * T);
    data.batch(step, G, 0, G, ref_in.data(), ref_tg.data());
    // The whole batch is sequences step*G .. step*G + G - 1.
    std::vector<int32_t> in(T), tg(T);
    for (int g = 0; g < G; ++g) {
      data.sequence(step * G + g, in.data(), tg.data());
      EXPECT_TRUE(std::equal(in.begin(), in.end(), ref_in.begin() + g * T));
      EXPECT_TRUE(std::equal(tg.begin(), tg.end(), ref_tg.begin() + g * T));
    }
    // Ranks × per-rank micro-batches: 1×12, 2×6, 3×4, 4×3, 6×2, 12×1, each rank's share
    // further cut into micro-batches of every size dividing it.
    for (int ranks : {1, 2, 3, 4, 6, 12}) {
      const int per_rank = G / ranks;
      for (int micro = 1; micro <= per_rank; ++micro) {
        if (per_rank % micro != 0) continue;
        std::vector<int32_t> cat_in, cat_tg;
        for (int r = 0; r < ranks; ++r) {
          for (int m = 0; m < per_rank; m += micro) {
            std::vector<int32_t> bi(micro * T), bt(micro * T);
            data.batch(step, G, r * per_rank + m, micro, bi.data(), bt.data());
            cat_in.insert(cat_in.end(), bi.begin(), bi.end());
            cat_tg.insert(cat_tg.end(), bt.begin(), bt.end());
          }
        }
        EXPECT_EQ(cat_in, ref_in) << "step " << step << " ranks " << ranks << " micro " << micro;
        EXPECT_EQ(cat_tg, ref_tg) << "step " << step << " ranks " << ranks << " micro " << micro;
      }
    }
  }
}

TEST(Dataset, BatchArgumentErrors) {
  const Dataset data(iota_tokens(100), 4, 1);
  std::vector<int32_t> in(64), tg(64);
  EXPECT_CONTAINS(error_of([&] { data.batch(0, 8, 6, 4, in.data(), tg.data()); }),
                  "sequences [6, 10) are not within the global batch of 8");
  EXPECT_CONTAINS(error_of([&] { data.batch(0, 0, 0, 0, in.data(), tg.data()); }),
                  "global batch 0");
  EXPECT_CONTAINS(error_of([&] { data.batch(-1, 8, 0, 1, in.data(), tg.data()); }), "step -1");
  EXPECT_CONTAINS(error_of([&] { data.sequence(-3, in.data(), tg.data()); }), "sequence number -3");
  data.batch(0, 8, 8, 0, in.data(), tg.data());  // an empty slice is fine
}

TEST(Dataset, CheckVocab) {
  std::vector<uint32_t> tokens = iota_tokens(20);
  for (auto& t : tokens) t %= 7;
  tokens[5] = 300;
  tokens[9] = 301;
  const Dataset data(tokens, 4, 1, "train.tok");
  data.check_vocab(302);
  const std::string msg = error_of([&] { data.check_vocab(256); });
  EXPECT_CONTAINS(msg, "data file 'train.tok' has token 300 at position 5");
  EXPECT_CONTAINS(msg, "vocabulary of 256");
  EXPECT_CONTAINS(error_of([&] { data.check_vocab(301); }), "token 301 at position 9");
  EXPECT_CONTAINS(error_of([] {
                    Dataset({1, 2, 0x80000000u, 3}, 2, 1);
                  }),
                  "token 2147483648 at position 2, which does not fit int32");
}

TEST(Dataset, ConcurrentReadersAgree) {
  const int T = 16;
  const Dataset data(iota_tokens(50 * T + 1), T, 5);
  const int64_t n = 400;  // 8 epochs, so threads keep replacing the cached permutation
  std::vector<int64_t> expect(n);
  for (int64_t k = 0; k < n; ++k) expect[k] = data.window(k);
  std::vector<std::vector<int64_t>> got(4, std::vector<int64_t>(n));
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      std::vector<int32_t> in(T), tg(T);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t k = (i % 2 == 0) ? j : n - 1 - j;
        data.sequence(k, in.data(), tg.data());
        got[i][k] = in[0] / T;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], expect) << "thread " << i;
}

TEST(Dataset, Movable) {
  Dataset a(iota_tokens(41), 4, 42);
  const std::vector<int64_t> perm = a.permutation(0);
  Dataset b = std::move(a);
  EXPECT_EQ(b.permutation(0), perm);
  EXPECT_EQ(b.seq_len(), 4);
  EXPECT_EQ(b.seed(), 42u);
  EXPECT_EQ(b.tokens().size(), 41u);
}

}  // namespace
}  // namespace tandem
