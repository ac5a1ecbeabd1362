// GPT-2 byte-level BPE (see bpe_tokenizer.h). Behaviour follows tiktoken's gpt2 encoding; no code
// from it or from other tokenizers is used.
#include "data/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "data/unicode_tables.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/json.h"

namespace gpt2::data {
namespace {

using unicode::CpClass;

constexpr char kEndOfText[] = "<|endoftext|>";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw UserError("cannot open " + path + ": " + std::strerror(errno) +
                    " (is the tokenizer directory right? it needs encoder.json and vocab.bpe)");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw UserError("cannot read " + path + ": " + std::strerror(errno));
  return ss.str();
}

// GPT-2's byte <-> "printable unicode" map: bytes that are printable Latin-1 stand for themselves,
// the other 68 bytes are shifted to U+0100.. in byte order, so every token is a printable string in
// encoder.json and vocab.bpe. Returns, for each code point below 0x144, its byte or -1.
std::array<int, 0x144> unicode_to_byte() {
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  std::array<int, 0x144> map;
  map.fill(-1);
  int shifted = 0;
  for (int b = 0; b < 256; ++b) {
    if (printable(b)) {
      map[static_cast<size_t>(b)] = b;
    } else {
      map[static_cast<size_t>(256 + shifted++)] = b;
    }
  }
  return map;
}

// Raw bytes of a token written in GPT-2's byte alphabet; an empty optional-like flag on failure.
bool alphabet_to_bytes(std::string_view text, const std::array<int, 0x144>& u2b, std::string* out, uint32_t* bad_cp) {
  out->clear();
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    uint32_t len = 1;
    const uint32_t cp = unicode::decode_utf8(s, text.size(), i, &len);
    if (cp == unicode::kInvalidCodePoint || cp >= u2b.size() || u2b[cp] < 0) {
      *bad_cp = cp;
      return false;
    }
    out->push_back(static_cast<char>(u2b[cp]));
    i += len;
  }
  return true;
}

std::string hex_cp(uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", cp);
  return buf;
}

// A fast 64-bit hash for short byte strings (tokens and pre-tokenized words).
inline uint64_t hash_bytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  h = (h ^ w) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h;
}

inline uint64_t hash_pair(uint64_t key) {
  key *= 0x9E3779B97F4A7C15ull;
  key ^= key >> 29;
  key *= 0xBF58476D1CE4E5B9ull;
  return key ^ (key >> 32);
}

size_t table_size_for(size_t n) {
  size_t size = 16;
  while (size < 2 * n) size *= 2;  // load factor <= 0.5 keeps probe chains short
  return size;
}

// See Gpt2Tokenizer::TokenSlot.
constexpr size_t kSlotInlineBytes = 11;
inline void slot_key(std::string_view bytes, uint64_t* lo, uint32_t* hi) {
  unsigned char buf[12] = {};
  std::memcpy(buf, bytes.data(), std::min(bytes.size(), kSlotInlineBytes));
  buf[11] = bytes.size() <= kSlotInlineBytes ? static_cast<unsigned char>(bytes.size()) : 0xFF;
  std::memcpy(lo, buf, 8);
  std::memcpy(hi, buf + 8, 4);
}

// Class of each ASCII code point, so the common case skips the two-stage Unicode table.
constexpr std::array<CpClass, 128> kAsciiClass = [] {
  std::array<CpClass, 128> a{};
  for (uint32_t c = 0; c < 128; ++c) a[c] = unicode::classify(c);
  return a;
}();

inline CpClass class_of(uint32_t cp) { return cp < 128 ? kAsciiClass[cp] : unicode::classify(cp); }

// Per-thread cache of words that needed merging. Direct-mapped and fixed-size: a miss costs one
// compare, an insert overwrites, and no lock is needed because each thread has its own.
constexpr size_t kCacheKeyMax = 24;
constexpr size_t kCacheIdsMax = 8;
constexpr size_t kCacheSlots = 1 << 14;
struct CacheEntry {
  uint64_t hash = 0;
  uint8_t key_len = 0;  // 0: empty (empty pieces never reach the cache)
  uint8_t num_ids = 0;
  char key[kCacheKeyMax];
  int32_t ids[kCacheIdsMax];
};
struct WordCache {
  uint64_t owner = 0;  // instance_id_ of the tokenizer the entries belong to
  std::vector<CacheEntry> entries;
};
thread_local WordCache t_cache;

std::atomic<uint64_t> g_next_instance_id{1};

// Pieces up to this many bytes merge with flat arrays in O(n^2); longer ones (long runs of
// spaces, symbols or letters without a break) use a heap so they stay O(n log n).
constexpr size_t kSmallPiece = 128;

}  // namespace

// ------------------------------------------------------------------------------------ loading

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& dir) {
  Gpt2Tokenizer tok;
  tok.instance_id_ = g_next_instance_id.fetch_add(1);
  const std::string enc_path = dir + "/encoder.json";
  const std::string bpe_path = dir + "/vocab.bpe";
  const auto u2b = unicode_to_byte();

  // encoder.json: {"token in byte alphabet": id, ...}, ids dense from 0.
  const std::string enc_text = read_file(enc_path);
  const json::Value enc = json::parse(enc_text, enc_path);
  const auto& members = json::as_object(enc, enc_path);
  if (members.empty()) throw UserError(enc_path + ": no tokens");
  const size_t vocab = members.size();
  tok.id_to_bytes_.assign(vocab, std::string());
  std::vector<bool> seen(vocab, false);
  std::unordered_map<std::string, int32_t> all_tokens;  // every entry, specials included
  all_tokens.reserve(vocab * 2);
  std::string bytes;
  for (const auto& [key, value] : members) {
    const int64_t id = json::as_int(value, enc_path + ": id of token '" + key + "'");
    if (id < 0 || static_cast<size_t>(id) >= vocab) {
      throw UserError(enc_path + ": id " + std::to_string(id) + " of token '" + key + "' is outside [0, " +
                      std::to_string(vocab) + ") (ids must be dense)");
    }
    if (seen[static_cast<size_t>(id)]) {
      throw UserError(enc_path + ": id " + std::to_string(id) + " is used twice (again by '" + key + "')");
    }
    seen[static_cast<size_t>(id)] = true;
    uint32_t bad_cp = 0;
    if (!alphabet_to_bytes(key, u2b, &bytes, &bad_cp)) {
      throw UserError(enc_path + ": token '" + key + "' has " + hex_cp(bad_cp) +
                      ", which is not in GPT-2's byte alphabet");
    }
    if (!all_tokens.emplace(bytes, static_cast<int32_t>(id)).second) {
      throw UserError(enc_path + ": token '" + key + "' is listed twice");
    }
    tok.id_to_bytes_[static_cast<size_t>(id)] = bytes;
  }

  // Mergeable tokens: the 256 single bytes, then one per line of vocab.bpe in rank order.
  // Everything else in encoder.json is a special token (only "<|endoftext|>" for GPT-2), which
  // encode never produces from text.
  tok.rank_.assign(vocab, INT32_MAX);
  tok.token_table_.assign(table_size_for(vocab), TokenSlot{});
  auto insert_token = [&tok](int32_t id) {
    const std::string& b = tok.id_to_bytes_[static_cast<size_t>(id)];
    const uint64_t h = hash_bytes(b.data(), b.size());
    const size_t mask = tok.token_table_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      if (tok.token_table_[i].id < 0) {
        TokenSlot& slot = tok.token_table_[i];
        slot_key(b, &slot.key_lo, &slot.key_hi);
        slot.id = id;
        return;
      }
    }
  };
  for (int b = 0; b < 256; ++b) {
    auto it = all_tokens.find(std::string(1, static_cast<char>(b)));
    if (it == all_tokens.end()) {
      char buf[64];
      std::snprintf(buf, sizeof buf, ": no token for byte 0x%02X", b);
      throw UserError(enc_path + buf);
    }
    tok.byte_token_[b] = it->second;
    tok.rank_[static_cast<size_t>(it->second)] = b;
    insert_token(it->second);
  }

  const std::string bpe_text = read_file(bpe_path);
  std::vector<int32_t> merged_ids;
  merged_ids.reserve(vocab);
  size_t line_no = 0;
  size_t pos = 0;
  std::string left;
  std::string right;
  while (pos < bpe_text.size()) {
    size_t eol = bpe_text.find('\n', pos);
    if (eol == std::string::npos) eol = bpe_text.size();
    std::string_view line(bpe_text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // tolerate CRLF files
    if (line.empty()) continue;
    if (line_no == 1 && line[0] == '#') continue;  // "#version: 0.2"
    auto where = [&] { return bpe_path + ": line " + std::to_string(line_no) + ": "; };
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      throw UserError(where() + "expected two tokens separated by one space, got '" + std::string(line) + "'");
    }
    uint32_t bad_cp = 0;
    if (!alphabet_to_bytes(line.substr(0, space), u2b, &left, &bad_cp) ||
        !alphabet_to_bytes(line.substr(space + 1), u2b, &right, &bad_cp)) {
      throw UserError(where() + hex_cp(bad_cp) + " is not in GPT-2's byte alphabet");
    }
    for (const std::string* part : {&left, &right}) {
      if (tok.find_token(*part) < 0) {
        throw UserError(where() + "'" + std::string(line) + "' uses a token no earlier merge made");
      }
    }
    const std::string joined = left + right;
    if (tok.find_token(joined) >= 0) {
      throw UserError(where() + "'" + std::string(line) + "' repeats an earlier merge");
    }
    auto it = all_tokens.find(joined);
    if (it == all_tokens.end()) {
      throw UserError(where() + "the result of '" + std::string(line) + "' is missing from " + enc_path);
    }
    tok.rank_[static_cast<size_t>(it->second)] = static_cast<int32_t>(256 + merged_ids.size());
    insert_token(it->second);
    merged_ids.push_back(it->second);
  }

  auto eot = all_tokens.find(kEndOfText);
  if (eot == all_tokens.end()) throw UserError(enc_path + ": no \"<|endoftext|>\" token");
  if (tok.find_token(kEndOfText) >= 0) {
    throw UserError(bpe_path + ": merges produce \"<|endoftext|>\", which must be a special token");
  }
  tok.eot_token_ = eot->second;

  // Pair table. tiktoken merges two adjacent parts whenever their concatenation is a mergeable
  // token, ranked by that token, whichever merge line created it. So every split of a merged
  // token into two mergeable tokens is a pair, not only the split its vocab.bpe line names.
  std::vector<std::pair<uint64_t, int32_t>> pairs;
  pairs.reserve(merged_ids.size() * 4);
  for (int32_t id : merged_ids) {
    const std::string& t = tok.id_to_bytes_[static_cast<size_t>(id)];
    for (size_t k = 1; k < t.size(); ++k) {
      const int32_t a = tok.find_token(std::string_view(t).substr(0, k));
      const int32_t b = a < 0 ? -1 : tok.find_token(std::string_view(t).substr(k));
      if (b >= 0) pairs.emplace_back((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b), id);
    }
  }
  tok.pair_table_.assign(table_size_for(pairs.size()), PairSlot{});
  const size_t mask = tok.pair_table_.size() - 1;
  for (const auto& [key, id] : pairs) {
    for (size_t i = hash_pair(key) & mask;; i = (i + 1) & mask) {
      PairSlot& slot = tok.pair_table_[i];
      if (slot.key == key) break;  // a split is unique to its token, so never a conflict
      if (slot.merged < 0) {
        slot = PairSlot{key, id};
        break;
      }
    }
  }
  return tok;
}

int32_t Gpt2Tokenizer::lookup_token(std::string_view bytes, uint64_t hash) const {
  uint64_t lo;
  uint32_t hi;
  slot_key(bytes, &lo, &hi);
  const size_t mask = token_table_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const TokenSlot& slot = token_table_[i];
    if (slot.id < 0) return -1;
    if (slot.key_lo == lo && slot.key_hi == hi &&
        (bytes.size() <= kSlotInlineBytes || id_to_bytes_[static_cast<size_t>(slot.id)] == bytes)) {
      return slot.id;
    }
  }
}

int32_t Gpt2Tokenizer::find_token(std::string_view bytes) const {
  return lookup_token(bytes, hash_bytes(bytes.data(), bytes.size()));
}

int32_t Gpt2Tokenizer::find_pair(int32_t a, int32_t b) const {
  const uint64_t key = (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
  const size_t mask = pair_table_.size() - 1;
  for (size_t i = hash_pair(key) & mask;; i = (i + 1) & mask) {
    const PairSlot& slot = pair_table_[i];
    if (slot.key == key) return slot.merged;
    if (slot.merged < 0) return -1;
  }
}

// ------------------------------------------------------------------------------------ encoding

// Note [Pre-tokenizer]
// tiktoken's gpt2 pattern, tried left to right at each position (leftmost-first alternation):
//   '(?:[sdmt]|ll|ve|re) | ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+ | \s+(?!\S) | \s+
// Every code point is a letter, number, whitespace or "other", so at position i:
//  1. an apostrophe followed by s, d, m, t, ll, ve or re (lower case only) is a piece;
//  2. a U+0020 space followed by a non-space code point of class C takes the space plus the
//     maximal run of class C (C = letter, number or other; the apostrophe is "other");
//  3. a non-space code point of class C takes its maximal run of class C;
//  4. a run of whitespace: all of it when it ends the text; when a non-space follows, all but its
//     last code point (\s+(?!\S) backs off one so that space can prefix the next word), and when
//     the run is one code point, that code point alone (\s+).
void Gpt2Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out, std::string_view source) const {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  auto decode_at = [&](size_t at, uint32_t* len) -> uint32_t {
    if (s[at] < 0x80) {
      *len = 1;
      return s[at];
    }
    const uint32_t cp = unicode::decode_utf8(s, n, at, len);
    if (cp == unicode::kInvalidCodePoint) {
      throw UserError(std::string(source) + ": invalid UTF-8 at byte offset " + std::to_string(at));
    }
    return cp;
  };
  // End of the maximal run of class `cls` starting at `at`.
  auto run_end = [&](size_t at, CpClass cls) {
    uint32_t len = 0;
    while (at < n) {
      const uint32_t cp = decode_at(at, &len);
      if (class_of(cp) != cls) break;
      at += len;
    }
    return at;
  };

  size_t i = 0;
  while (i < n) {
    uint32_t len = 0;
    const uint32_t cp = decode_at(i, &len);
    size_t end;
    if (cp == '\'' && i + 1 < n) {
      const char c1 = text[i + 1];
      const char c2 = i + 2 < n ? text[i + 2] : '\0';
      size_t m = 0;
      if (c1 == 's' || c1 == 'd' || c1 == 'm' || c1 == 't') {
        m = 2;
      } else if ((c1 == 'l' && c2 == 'l') || (c1 == 'v' && c2 == 'e') || (c1 == 'r' && c2 == 'e')) {
        m = 3;
      }
      if (m != 0) {
        encode_piece(text.substr(i, m), out);
        i += m;
        continue;
      }
    }
    const CpClass cls = class_of(cp);
    if (cls != CpClass::kSpace) {
      end = run_end(i + len, cls);
    } else {
      uint32_t len2 = 0;
      const size_t after = i + len;
      const uint32_t cp2 = after < n ? decode_at(after, &len2) : 0;
      const CpClass cls2 = after < n ? class_of(cp2) : CpClass::kSpace;
      if (cp == ' ' && cls2 != CpClass::kSpace) {
        end = run_end(after + len2, cls2);
      } else {
        size_t last = i;  // start of the run's last code point
        size_t j = i + len;
        while (j < n) {
          const uint32_t cpj = decode_at(j, &len2);
          if (class_of(cpj) != CpClass::kSpace) break;
          last = j;
          j += len2;
        }
        end = (j < n && last > i) ? last : j;
      }
    }
    encode_piece(text.substr(i, end - i), out);
    i = end;
  }
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text, std::string_view source) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  encode_append(text, out, source);
  return out;
}

void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_token_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  // Whole piece is a token (most words): tiktoken takes it as is, without merging.
  const uint64_t h = hash_bytes(piece.data(), piece.size());
  const int32_t whole = lookup_token(piece, h);
  if (whole >= 0) {
    out.push_back(whole);
    return;
  }
  const bool cacheable = piece.size() <= kCacheKeyMax;
  CacheEntry* entry = nullptr;
  if (cacheable) {
    WordCache& cache = t_cache;
    if (cache.owner != instance_id_) {
      cache.entries.assign(kCacheSlots, CacheEntry{});
      cache.owner = instance_id_;
    }
    entry = &cache.entries[(h >> 17) & (kCacheSlots - 1)];
    if (entry->hash == h && entry->key_len == piece.size() &&
        std::memcmp(entry->key, piece.data(), piece.size()) == 0) {
      out.insert(out.end(), entry->ids, entry->ids + entry->num_ids);
      return;
    }
  }
  const size_t before = out.size();
  if (piece.size() <= kSmallPiece) {
    merge_small(piece, out);
  } else {
    merge_large(piece, out);
  }
  const size_t produced = out.size() - before;
  if (cacheable && produced <= kCacheIdsMax) {
    entry->hash = h;
    entry->key_len = static_cast<uint8_t>(piece.size());
    entry->num_ids = static_cast<uint8_t>(produced);
    std::memcpy(entry->key, piece.data(), piece.size());
    std::copy(out.begin() + static_cast<std::ptrdiff_t>(before), out.end(), entry->ids);
  }
}

// Repeatedly merges the adjacent pair with the lowest rank, the leftmost on ties (tiktoken's
// order). parts[k] is a token id; pair k joins parts k and k+1.
void Gpt2Tokenizer::merge_small(std::string_view piece, std::vector<int32_t>& out) const {
  int32_t parts[kSmallPiece];
  int32_t merged[kSmallPiece];  // token pair k becomes, or -1
  int32_t ranks[kSmallPiece];   // its rank, or INT32_MAX
  size_t m = piece.size();
  for (size_t k = 0; k < m; ++k) parts[k] = byte_token_[static_cast<unsigned char>(piece[k])];
  auto set_pair = [&](size_t k) {
    merged[k] = find_pair(parts[k], parts[k + 1]);
    ranks[k] = merged[k] < 0 ? INT32_MAX : rank(merged[k]);
  };
  for (size_t k = 0; k + 1 < m; ++k) set_pair(k);
  while (m > 1) {
    size_t best = 0;
    for (size_t k = 1; k + 1 < m; ++k) {
      if (ranks[k] < ranks[best]) best = k;
    }
    if (ranks[best] == INT32_MAX) break;
    parts[best] = merged[best];
    // Drop part best+1 and pair best+1; pairs after it shift down by one.
    std::memmove(parts + best + 1, parts + best + 2, (m - best - 2) * sizeof(int32_t));
    if (best + 3 < m) {  // pairs best+2 .. m-2 exist
      std::memmove(merged + best + 1, merged + best + 2, (m - best - 3) * sizeof(int32_t));
      std::memmove(ranks + best + 1, ranks + best + 2, (m - best - 3) * sizeof(int32_t));
    }
    --m;
    if (best + 1 < m) set_pair(best);
    if (best > 0) set_pair(best - 1);
  }
  out.insert(out.end(), parts, parts + m);
}

// Same order as merge_small, with a doubly linked list of parts and a min-heap of candidate
// pairs keyed (rank, position of the left part). Entries go stale when either part changes; a
// version per part detects that when the entry is popped.
void Gpt2Tokenizer::merge_large(std::string_view piece, std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  std::vector<int32_t> parts(n);
  std::vector<int32_t> next(n);
  std::vector<int32_t> prev(n);
  std::vector<uint32_t> version(n, 0);
  for (size_t k = 0; k < n; ++k) {
    parts[k] = byte_token_[static_cast<unsigned char>(piece[k])];
    next[k] = k + 1 < n ? static_cast<int32_t>(k + 1) : -1;
    prev[k] = static_cast<int32_t>(k) - 1;
  }
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t right;
    uint32_t left_version;
    uint32_t right_version;
    int32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = next[static_cast<size_t>(left)];
    if (right < 0) return;
    const int32_t m = find_pair(parts[static_cast<size_t>(left)], parts[static_cast<size_t>(right)]);
    if (m < 0) return;
    heap.push(
        Candidate{rank(m), left, right, version[static_cast<size_t>(left)], version[static_cast<size_t>(right)], m});
  };
  for (size_t k = 0; k + 1 < n; ++k) push(static_cast<int32_t>(k));
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto l = static_cast<size_t>(c.left);
    const auto r = static_cast<size_t>(c.right);
    if (next[l] != c.right || version[l] != c.left_version || version[r] != c.right_version) continue;
    parts[l] = c.merged;
    ++version[l];
    ++version[r];  // r is gone; any entry naming it is stale
    next[l] = next[r];
    if (next[r] >= 0) prev[static_cast<size_t>(next[r])] = c.left;
    push(prev[l]);
    push(c.left);
  }
  for (int32_t k = 0; k >= 0; k = next[static_cast<size_t>(k)]) out.push_back(parts[static_cast<size_t>(k)]);
}

// ------------------------------------------------------------------------------------ decoding

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (const int32_t id : ids) {
    if (id < 0 || static_cast<int64_t>(id) >= vocab_size()) {
      throw UserError("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                      std::to_string(vocab_size()) + ")");
    }
    out += id_to_bytes_[static_cast<size_t>(id)];
  }
  return out;
}

std::string find_default_tokenizer_dir() {
  std::vector<std::string> candidates;
  try {
    candidates.push_back(files::parent_path(files::executable_path()) + "/../../data/tokenizer/gpt2");
  } catch (const UserError&) {
    // No /proc (not Linux, or a sandbox): the other places still apply.
  }
  candidates.push_back("data/tokenizer/gpt2");
#ifdef GPT2_SOURCE_DIR_STR
  candidates.push_back(std::string(GPT2_SOURCE_DIR_STR) + "/data/tokenizer/gpt2");
#endif
  std::string tried;
  for (const std::string& dir : candidates) {
    try {
      // real_path: the ".." above resolved, as the log line shows it.
      if (files::is_regular_file(dir + "/encoder.json")) return files::real_path(dir);
    } catch (const UserError&) {
      // Unreadable (EACCES, ...): as good as absent for a default; the next place may do.
    }
    tried += (tried.empty() ? "" : ", ") + dir;
  }
  throw UserError("cannot find the GPT-2 tokenizer (encoder.json, vocab.bpe); looked in " + tried +
                  "; pass --tokenizer_dir");
}

}  // namespace gpt2::data
