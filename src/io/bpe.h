// The byte-pair-encoding model shared by every BPE tokenizer: a vocabulary, ranked merges,
// and the merge loop that turns one pre-token ("word") into ids.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tandem {

// Hashing for maps keyed by std::string that are searched with std::string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  bool byte_fallback = false;   // unknown characters become their <0xNN> byte tokens
  bool fuse_unk = false;        // consecutive unknown characters become one unk token
  bool ignore_merges = false;   // a word that is itself in the vocabulary is one token
  std::optional<uint32_t> unk;  // the unk token, if any
};

// How far a vocabulary's ids may spread beyond their count: the largest id must be below
// kMaxIdSpread x the token count + kIdSlack (a few MB of slots at most for small vocabularies,
// which hand-made ones number loosely).
constexpr size_t kMaxIdSpread = 2;
constexpr size_t kIdSlack = 65536;

class BpeModel {
 public:
  // vocab: token -> id; merges: pairs of tokens in priority order (rank = index). `where`
  // names the source for messages. Throws tandem::Error when a merge names a token missing
  // from the vocabulary, or its result is missing.
  BpeModel(StringIdMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           BpeOptions options, const std::string& where);
  ~BpeModel();

  // Appends the ids of one pre-token (already in the vocabulary's alphabet: byte-level
  // characters, or "▁"-marked text). Thread-safe.
  void encode_word(std::string_view word, std::vector<uint32_t>& out) const;

  std::optional<uint32_t> token_to_id(std::string_view token) const;
  // The token of id, or nullptr when id is not in the vocabulary.
  const std::string* id_to_token(uint32_t id) const;
  // One past the largest id of the vocabulary.
  size_t size() const { return id_to_token_.size(); }

 private:
  struct Merge {
    uint32_t rank, id;
  };
  // Open addressing over (left id, right id) pairs: the merge loop's one hot lookup.
  class PairMap {
   public:
    void reserve(size_t n);
    void insert(uint64_t key, Merge m);
    const Merge* find(uint64_t key) const;

   private:
    std::vector<uint64_t> keys_;
    std::vector<Merge> values_;
    size_t mask_ = 0;
  };
  // Words already encoded, in shards with a lock each so that threads rarely meet.
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>> map;
  };
  static constexpr size_t kCacheShards = 64;
  static constexpr size_t kCacheEntriesPerShard = 4096;
  static constexpr size_t kCacheMaxWord = 64;

  void merge_word(std::string_view word, std::vector<uint32_t>& out) const;
  void symbolize(std::string_view word, std::vector<uint32_t>& ids) const;

  StringIdMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  PairMap merges_;
  BpeOptions options_;
  std::vector<int32_t> bmp_ids_;       // code point < 0x10000 -> id of that one character, or -1
  std::array<int32_t, 256> byte_ids_;  // byte -> id of <0xNN>, or -1
  std::unique_ptr<CacheShard[]> cache_;
};

}  // namespace tandem
