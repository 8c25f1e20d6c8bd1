// The arena planner, its verifier and the arena allocation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/error.h"
#include "device/arena.h"
#include "device/device.h"

namespace tandem {
namespace {

template <typename Fn>
void expect_error_containing(Fn&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected a tandem::Error";
  } catch (const Error& e) {
    for (const std::string& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message: " << e.what() << "\nexpected to contain: " << needle;
    }
  }
}

size_t round_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

TEST(Arena, AddValidatesAndReturnsIds) {
  ArenaPlanner planner;
  EXPECT_EQ(planner.add("a", 10, 0, 0), 0);
  EXPECT_EQ(planner.add("b", 10, 0, 5), 1);
  EXPECT_EQ(planner.add("c", 1, 3, 3), 2);
  expect_error_containing([&] { planner.add("zero", 0, 0, 1); }, {"zero", "size"});
  expect_error_containing([&] { planner.add("neg", 8, -1, 1); }, {"neg", "[-1, 1]"});
  expect_error_containing([&] { planner.add("rev", 8, 4, 3); }, {"rev", "[4, 3]"});
  EXPECT_EQ(planner.add("d", 1, 0, 0), 3);  // failed adds took no id
}

TEST(Arena, EmptyPlan) {
  ArenaPlan plan = ArenaPlanner().solve();
  EXPECT_EQ(plan.total_bytes, 0u);
  EXPECT_TRUE(plan.offsets.empty());
  arena_plan_verify(plan);
}

TEST(Arena, DisjointLifetimesShareOffsetZero) {
  ArenaPlanner planner;
  planner.add("a", 100, 0, 0);
  planner.add("b", 300, 1, 1);
  planner.add("c", 200, 2, 3);
  ArenaPlan plan = planner.solve();
  EXPECT_EQ(plan.offsets, (std::vector<size_t>{0, 0, 0}));
  EXPECT_EQ(plan.total_bytes, 512u);  // 300 aligned to 256
  EXPECT_EQ(plan.alignment, 256u);
  arena_plan_verify(plan);
}

TEST(Arena, OverlappingLifetimesDoNotShare) {
  ArenaPlanner planner;
  planner.add("a", 1000, 0, 2);
  planner.add("b", 500, 1, 3);
  planner.add("c", 300, 2, 2);  // live with both
  ArenaPlan plan = planner.solve();
  // a at 0; b past a (1000 -> 1024); c past b (1524 -> 1536).
  EXPECT_EQ(plan.offsets, (std::vector<size_t>{0, 1024, 1536}));
  EXPECT_EQ(plan.total_bytes, 2048u);  // 1836 aligned
  arena_plan_verify(plan);
}

TEST(Arena, SmallBufferFillsAGapBelow) {
  ArenaPlanner planner;
  planner.add("x", 1000, 0, 0);
  planner.add("y", 600, 0, 1);  // live with x: placed at 1024
  planner.add("z", 400, 1, 1);  // live with y only: fits below it, at 0
  ArenaPlan plan = planner.solve();
  EXPECT_EQ(plan.offsets, (std::vector<size_t>{0, 1024, 0}));
  EXPECT_EQ(plan.total_bytes, 1792u);  // 1624 aligned
  arena_plan_verify(plan);
}

TEST(Arena, GapBetweenTwoBuffers) {
  ArenaPlanner planner(64);
  planner.add("a", 1000, 0, 3);  // [0, 1000)
  planner.add("b", 1000, 0, 0);  // [1024, 2024): live with a
  planner.add("c", 1000, 0, 3);  // [2048, 3048): live with a and b
  planner.add("d", 500, 2, 3);   // b is dead by 2: the gap [1000, 2048) between a and c fits
  ArenaPlan plan = planner.solve();
  EXPECT_EQ(plan.offsets, (std::vector<size_t>{0, 1024, 2048, 1024}));
  EXPECT_EQ(plan.total_bytes, 3072u);  // 3048 aligned to 64
  arena_plan_verify(plan);
}

TEST(Arena, TiesBrokenByIndex) {
  ArenaPlanner planner;
  planner.add("first", 256, 0, 1);
  planner.add("second", 256, 0, 1);
  planner.add("third", 256, 1, 1);
  ArenaPlan plan = planner.solve();
  EXPECT_EQ(plan.offsets, (std::vector<size_t>{0, 256, 512}));
  EXPECT_EQ(plan.total_bytes, 768u);
}

TEST(Arena, AlignmentRespected) {
  for (size_t alignment : {1, 8, 64, 100, 256, 4096}) {
    ArenaPlanner planner(alignment);
    for (int i = 0; i < 20; ++i) planner.add("b" + std::to_string(i), 13 * i + 7, i / 3, i / 3 + 2);
    ArenaPlan plan = planner.solve();
    EXPECT_EQ(plan.alignment, alignment);
    for (size_t off : plan.offsets) EXPECT_EQ(off % alignment, 0u) << alignment;
    EXPECT_EQ(plan.total_bytes % alignment, 0u);
    arena_plan_verify(plan);
  }
}

TEST(Arena, VerifyCatchesBrokenPlans) {
  ArenaPlanner planner;
  planner.add("weights", 1000, 0, 4);
  planner.add("grads", 500, 2, 6);
  planner.add("scratch", 100, 5, 5);
  const ArenaPlan good = planner.solve();
  arena_plan_verify(good);

  ArenaPlan overlap = good;
  overlap.offsets[1] = overlap.offsets[0];  // grads onto weights: both live at 2..4
  expect_error_containing([&] { arena_plan_verify(overlap); }, {"'weights'", "'grads'"});

  ArenaPlan partial = good;
  partial.offsets[1] = 768;  // [768, 1268) still touches weights [0, 1000)
  expect_error_containing([&] { arena_plan_verify(partial); }, {"'weights'", "'grads'"});

  ArenaPlan misaligned = good;
  misaligned.offsets[2] += 8;
  expect_error_containing([&] { arena_plan_verify(misaligned); }, {"'scratch'", "aligned"});

  ArenaPlan too_small = good;
  too_small.total_bytes = 1024;  // grads ends at 1524
  expect_error_containing([&] { arena_plan_verify(too_small); }, {"'grads'", "past"});

  ArenaPlan short_offsets = good;
  short_offsets.offsets.pop_back();
  expect_error_containing([&] { arena_plan_verify(short_offsets); }, {"2 offsets for 3"});

  // Sharing bytes is fine when the lifetimes are disjoint.
  ArenaPlan shared = good;
  shared.offsets[2] = 256;  // scratch (5..5) inside weights (0..4)
  arena_plan_verify(shared);
}

TEST(Arena, RandomPlansVerify) {
  std::mt19937_64 rng(12345);
  const size_t alignments[] = {1, 16, 64, 100, 256};
  for (int trial = 0; trial < 300; ++trial) {
    const size_t alignment = alignments[rng() % 5];
    const int n = static_cast<int>(rng() % 80);
    const int horizon = 1 + static_cast<int>(rng() % 40);
    ArenaPlanner planner(alignment);
    std::vector<ArenaRequest> reqs;
    for (int i = 0; i < n; ++i) {
      const size_t bytes = 1 + rng() % (rng() % 4 == 0 ? 100000 : 3000);
      const int first = static_cast<int>(rng() % horizon);
      const int last = first + static_cast<int>(rng() % (horizon - first));
      planner.add("r" + std::to_string(i), bytes, first, last);
      reqs.push_back({"r" + std::to_string(i), bytes, first, last});
    }
    const ArenaPlan plan = planner.solve();
    ASSERT_NO_THROW(arena_plan_verify(plan)) << "trial " << trial;
    ASSERT_EQ(plan.offsets.size(), static_cast<size_t>(n));

    // Bounds: at least the peak live bytes, at most every buffer side by side.
    size_t peak = 0, side_by_side = 0;
    for (int t = 0; t < horizon; ++t) {
      size_t live = 0;
      for (const auto& r : reqs) {
        if (r.first <= t && t <= r.last) live += r.bytes;
      }
      peak = std::max(peak, live);
    }
    for (const auto& r : reqs) side_by_side += round_up(r.bytes, alignment);
    EXPECT_GE(plan.total_bytes, peak);
    EXPECT_LE(plan.total_bytes, side_by_side);

    // Deterministic.
    EXPECT_EQ(planner.solve().offsets, plan.offsets);
  }
}

TEST(Arena, AllocatesThePlanAndChecksBounds) {
  auto dev = device_create_cpu();
  ArenaPlanner planner;
  planner.add("a", 1000, 0, 1);
  planner.add("b", 3000, 1, 2);
  const ArenaPlan plan = planner.solve();
  Arena arena(*dev, plan.total_bytes);
  ASSERT_NE(arena.base(), nullptr);
  EXPECT_EQ(arena.bytes(), plan.total_bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(arena.base()) % plan.alignment, 0u);
  EXPECT_EQ(arena.at(0), arena.base());
  std::memset(arena.base(), 0xab, arena.bytes());  // the whole arena is writable
  for (size_t i = 0; i < plan.offsets.size(); ++i) {
    auto* p = static_cast<unsigned char*>(arena.at(plan.offsets[i]));
    EXPECT_EQ(p, static_cast<unsigned char*>(arena.base()) + plan.offsets[i]);
    std::memset(p, static_cast<int>(i), plan.requests[i].bytes);
  }
  EXPECT_NE(arena.at(arena.bytes() - 1), nullptr);
  expect_error_containing([&] { arena.at(arena.bytes()); },
                          {std::to_string(arena.bytes()), "out of range"});
  expect_error_containing([&] { arena.at(SIZE_MAX); }, {"out of range"});
}

TEST(Arena, EmptyArena) {
  auto dev = device_create_cpu();
  Arena arena(*dev, 0);
  EXPECT_EQ(arena.bytes(), 0u);
  expect_error_containing([&] { arena.at(0); }, {"out of range"});
}

}  // namespace
}  // namespace tandem
