#pragma once
// Code point classes for the GPT-2 pre-tokenizer, and a strict UTF-8 decoder.
// Contract: classify(cp) gives letter (\p{L}), number (\p{N}), whitespace (Unicode White_Space,
// what \s means in the regex engine tiktoken uses) or other, for any cp <= U+10FFFF. The tables
// are generated at development time by data/tools/gen_unicode_tables.py (see kUnicodeVersion).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gpt2::data::unicode {

#include "data/unicode_tables.inc"

enum class CpClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

constexpr CpClass classify(uint32_t cp) {
  if (cp >= 0x110000) return CpClass::kOther;
  return static_cast<CpClass>(
      kStage2[(static_cast<uint32_t>(kStage1[cp >> kBlockShift]) << kBlockShift) | (cp & ((1u << kBlockShift) - 1))]);
}

inline constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFFu;

// Decodes the code point at s[i] (i < n) and stores its byte length in *len. Returns
// kInvalidCodePoint for anything RFC 3629 forbids: stray continuation bytes, truncated sequences,
// overlong forms, surrogates, code points above U+10FFFF.
inline uint32_t decode_utf8(const unsigned char* s, size_t n, size_t i, uint32_t* len) {
  const uint32_t b0 = s[i];
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  uint32_t need;
  uint32_t cp;
  uint32_t min;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2, cp = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3, cp = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return kInvalidCodePoint;
  }
  if (i + need > n) return kInvalidCodePoint;
  for (uint32_t k = 1; k < need; ++k) {
    const uint32_t b = s[i + k];
    if ((b & 0xC0) != 0x80) return kInvalidCodePoint;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kInvalidCodePoint;
  *len = need;
  return cp;
}

// Byte offset of the first invalid UTF-8 sequence in s[0, n), or n when all of it is valid.
inline size_t find_invalid_utf8(const unsigned char* s, size_t n) {
  size_t i = 0;
  uint32_t len = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    if (decode_utf8(s, n, i, &len) == kInvalidCodePoint) return i;
    i += len;
  }
  return n;
}

// Bytes of `s` up to the last complete UTF-8 character: a token may end inside a character, whose
// remaining bytes come with the next token.
inline size_t complete_utf8_prefix(std::string_view s) {
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? s.size() - back : s.size();
  }
  return s.size();
}

// Bytes of the longest start of a well-formed UTF-8 sequence at s[i] (Unicode 15, Table 3-7), at
// least 1: the "maximal subpart" that one U+FFFD replaces.
inline size_t maximal_subpart(const unsigned char* s, size_t n, size_t i) {
  const unsigned char b = s[i];
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (b >= 0xC2 && b <= 0xDF)
    need = 1;
  else if (b >= 0xE0 && b <= 0xEF)
    need = 2, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
  else if (b >= 0xF0 && b <= 0xF4)
    need = 3, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
  size_t k = 1;
  while (k <= need && i + k < n && s[i + k] >= (k == 1 ? lo : 0x80) && s[i + k] <= (k == 1 ? hi : 0xBF)) ++k;
  return k;
}

// `s` with every ill-formed UTF-8 subsequence replaced by one U+FFFD per maximal subpart, as
// Unicode recommends and Python's and browsers' decoders do (for printing decoded samples, whose
// last token may end inside a multi-byte character).
inline std::string to_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  uint32_t len = 0;
  while (i < s.size()) {
    if (decode_utf8(p, s.size(), i, &len) == kInvalidCodePoint) {
      out += "\xEF\xBF\xBD";
      i += maximal_subpart(p, s.size(), i);
    } else {
      out.append(s.data() + i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace gpt2::data::unicode
