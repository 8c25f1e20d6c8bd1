// Half-open time spans [a, b) and the three operations the timing code needs on sets of
// them: their union (sorted and disjoint), its length, and the intersection of two unions.
// Used by the engine's exposed communication and by the trace analysis.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace tandem {

struct Interval {
  double a = 0, b = 0;
};
using Intervals = std::vector<Interval>;

// The union of v as disjoint spans in order; empty spans (b <= a) are dropped.
inline Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end(), [](const Interval& x, const Interval& y) { return x.a < y.a; });
  Intervals out;
  for (const Interval& i : v) {
    if (i.b <= i.a) continue;
    if (!out.empty() && i.a <= out.back().b)
      out.back().b = std::max(out.back().b, i.b);
    else
      out.push_back(i);
  }
  return out;
}

// The total length of disjoint spans.
inline double length(const Intervals& v) {
  double t = 0;
  for (const Interval& i : v) t += i.b - i.a;
  return t;
}

// The intersection of two unions (both as merged returns them).
inline Intervals intersect(const Intervals& x, const Intervals& y) {
  Intervals out;
  size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    const double a = std::max(x[i].a, y[j].a), b = std::min(x[i].b, y[j].b);
    if (a < b) out.push_back({a, b});
    (x[i].b < y[j].b ? i : j)++;
  }
  return out;
}

}  // namespace tandem
