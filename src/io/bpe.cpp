// The BPE merge loop: the word's characters become a linked list of symbols, candidate
// merges of neighbours wait in a priority queue ordered by (rank, position), and a popped
// merge that no longer applies (a neighbour merged first) is skipped. Each merge costs
// O(log n), so a long word is O(n log n), never a rescan per merge.
#include "io/bpe.h"

#include <algorithm>

#include "core/error.h"
#include "io/utf8.h"

namespace tandem {

namespace {

uint64_t pair_key(uint32_t a, uint32_t b) {
  return static_cast<uint64_t>(a) << 32 | b;
}

constexpr uint64_t kEmpty = ~uint64_t{0};

size_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return static_cast<size_t>(k);
}

}  // namespace

void BpeModel::PairMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  keys_.assign(cap, kEmpty);
  values_.assign(cap, Merge{0, 0});
  mask_ = cap - 1;
}

void BpeModel::PairMap::insert(uint64_t key, Merge m) {
  for (size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    if (keys_[i] == key) return;  // a repeated merge keeps its first (best) rank
    if (keys_[i] == kEmpty) {
      keys_[i] = key;
      values_[i] = m;
      return;
    }
  }
}

const BpeModel::Merge* BpeModel::PairMap::find(uint64_t key) const {
  if (keys_.empty()) return nullptr;
  for (size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    if (keys_[i] == key) return &values_[i];
    if (keys_[i] == kEmpty) return nullptr;
  }
}

BpeModel::BpeModel(StringIdMap vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options, const std::string& where)
    : vocab_(std::move(vocab)), options_(options), cache_(new CacheShard[kCacheShards]) {
  uint32_t top = 0;
  for (const auto& [token, id] : vocab_) top = std::max(top, id);
  // Tokens are indexed by id, so ids far beyond the count would cost memory for nothing
  // (one stray id of 10^8 is gigabytes); tokenizers number their tokens 0..N-1.
  TD_CHECK(vocab_.empty() || size_t{top} < kMaxIdSpread * vocab_.size() + kIdSlack,
           "{}: the vocabulary's ids are sparse: the largest is {} for {} tokens (ids are "
           "expected to run 0..N-1)",
           where, top, vocab_.size());
  id_to_token_.resize(vocab_.empty() ? 0 : size_t{top} + 1);
  has_id_.assign(id_to_token_.size(), false);
  for (const auto& [token, id] : vocab_) {
    TD_CHECK(!has_id_[id], "{}: id {} is given to both '{}' and '{}'", where, id, id_to_token_[id],
             token);
    id_to_token_[id] = token;
    has_id_[id] = true;
  }
  merges_.reserve(merges.size());
  std::string joined;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    const auto ia = vocab_.find(a), ib = vocab_.find(b);
    TD_CHECK(ia != vocab_.end(),
             "{}: merge {} ('{} {}') names '{}', which is not in the "
             "vocabulary",
             where, r, a, b, a);
    TD_CHECK(ib != vocab_.end(),
             "{}: merge {} ('{} {}') names '{}', which is not in the "
             "vocabulary",
             where, r, a, b, b);
    joined = a + b;
    const auto ij = vocab_.find(joined);
    TD_CHECK(ij != vocab_.end(),
             "{}: merge {} ('{} {}') makes '{}', which is not in the "
             "vocabulary",
             where, r, a, b, joined);
    merges_.insert(pair_key(ia->second, ib->second), Merge{static_cast<uint32_t>(r), ij->second});
  }
  bmp_ids_.assign(0x10000, -1);
  for (const auto& [token, id] : vocab_) {
    if (token.empty()) continue;
    const Utf8Char c = utf8_next(token, 0);
    if (c.cp >= 0 && c.cp < 0x10000 && c.len == token.size())
      bmp_ids_[c.cp] = static_cast<int32_t>(id);
  }
  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    if (it != vocab_.end()) byte_ids_[b] = static_cast<int32_t>(it->second);
  }
}

BpeModel::~BpeModel() = default;

std::optional<uint32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(uint32_t id) const {
  return id < id_to_token_.size() && has_id_[id] ? &id_to_token_[id] : nullptr;
}

// The word's characters as ids: a character missing from the vocabulary becomes its byte
// tokens (byte_fallback) or the unk token (fused with unknown neighbours under fuse_unk).
void BpeModel::symbolize(std::string_view word, std::vector<uint32_t>& ids) const {
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    const Utf8Char c = utf8_next(word, i);
    const std::string_view s = word.substr(i, c.len);
    i += c.len;
    int64_t id = -1;
    if (c.cp >= 0 && c.cp < 0x10000) {
      id = bmp_ids_[static_cast<size_t>(c.cp)];
    } else if (const auto it = vocab_.find(s); it != vocab_.end()) {
      id = it->second;
    }
    if (id >= 0) {
      ids.push_back(static_cast<uint32_t>(id));
      last_unk = false;
      continue;
    }
    if (options_.byte_fallback && std::all_of(s.begin(), s.end(), [&](char b) {
          return byte_ids_[static_cast<uint8_t>(b)] >= 0;
        })) {
      for (char b : s) ids.push_back(static_cast<uint32_t>(byte_ids_[static_cast<uint8_t>(b)]));
      last_unk = false;
      continue;
    }
    TD_CHECK(options_.unk.has_value(),
             "cannot encode the character '{}': it is not in the tokenizer's vocabulary, which "
             "has no unk token",
             s);
    if (!(options_.fuse_unk && last_unk)) ids.push_back(*options_.unk);
    last_unk = true;
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<uint32_t>& out) const {
  struct Symbol {
    uint32_t id;
    int32_t prev, next;  // -1 at the ends
    bool alive;
  };
  struct Candidate {
    uint32_t rank, pos, id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<uint32_t> ids;
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Candidate> queue;  // a min-heap
  ids.clear();
  symbolize(word, ids);
  const size_t n = ids.size();
  if (n <= 1) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  sym.resize(n);
  for (size_t i = 0; i < n; ++i)
    sym[i] = Symbol{ids[i], static_cast<int32_t>(i) - 1,
                    i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true};
  queue.clear();
  const auto offer = [&](int32_t left) {
    if (left < 0 || sym[left].next < 0) return;
    if (const Merge* m = merges_.find(pair_key(sym[left].id, sym[sym[left].next].id))) {
      queue.push_back(Candidate{m->rank, static_cast<uint32_t>(left), m->id});
      std::push_heap(queue.begin(), queue.end(), std::greater<>{});
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) offer(static_cast<int32_t>(i));
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), std::greater<>{});
    const Candidate c = queue.back();
    queue.pop_back();
    Symbol& left = sym[c.pos];
    if (!left.alive || left.next < 0) continue;
    // Still the same pair? A neighbour may have merged since this candidate was offered.
    const Merge* m = merges_.find(pair_key(left.id, sym[left.next].id));
    if (m == nullptr || m->id != c.id) continue;
    Symbol& right = sym[left.next];
    left.id = c.id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = static_cast<int32_t>(c.pos);
    offer(left.prev);
    offer(static_cast<int32_t>(c.pos));
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

void BpeModel::encode_word(std::string_view word, std::vector<uint32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() > kCacheMaxWord) {
    merge_word(word, out);
    return;
  }
  CacheShard& shard = cache_[std::hash<std::string_view>{}(word) % kCacheShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    if (const auto it = shard.map.find(word); it != shard.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() < kCacheEntriesPerShard)
    shard.map.emplace(std::string(word), std::vector<uint32_t>(out.begin() + first, out.end()));
}

}  // namespace tandem
