//===- Tokenizer.cpp - Byte-level BPE tokenizer ---------------------------===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// The pre-tokenizer is a hand-written matcher for the GPT-2 expression
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// applied left to right with leftmost-first alternation, which is how regex
// engines run it. \p{L} and \p{N} come from the generated UnicodeTables.inc;
// \s is the Unicode White_Space property.
//
//===----------------------------------------------------------------------===//

#include "tools/kvc-run/Tokenizer.h"

#include "tools/kvc-run/Gguf.h"

#include <algorithm>
#include <climits>

namespace kvc {
namespace run {

namespace {

struct CodepointRange {
  uint32_t first;
  uint32_t last;
};

#include "tools/kvc-run/UnicodeTables.inc"

/// GGUF token types (tokenizer.ggml.token_type).
enum TokenType : int32_t {
  kTypeNormal = 1,
  kTypeUnknown = 2,
  kTypeControl = 3,
  kTypeUserDefined = 4,
  kTypeUnused = 5,
  kTypeByte = 6,
};

template <size_t N>
bool inRanges(const CodepointRange (&ranges)[N], uint32_t cp) {
  const CodepointRange *end = ranges + N;
  const CodepointRange *it = std::upper_bound(
      ranges, end, cp,
      [](uint32_t c, const CodepointRange &r) { return c < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

enum class CharClass { Letter, Number, Space, Other };

bool isWhiteSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

CharClass classify(uint32_t cp) {
  if (cp < 0x80) {
    // Fast path for ASCII, which is nearly all of the text we see.
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'))
      return CharClass::Letter;
    if (cp >= '0' && cp <= '9')
      return CharClass::Number;
    return isWhiteSpace(cp) ? CharClass::Space : CharClass::Other;
  }
  if (isWhiteSpace(cp))
    return CharClass::Space;
  if (inRanges(kLetterRanges, cp))
    return CharClass::Letter;
  if (inRanges(kNumberRanges, cp))
    return CharClass::Number;
  return CharClass::Other;
}

/// Sentinel for bytes that do not start a valid UTF-8 sequence; it falls in
/// no class but Other, like a lone byte in a regex engine's byte fallback.
constexpr uint32_t kInvalid = 0xFFFFFFFFu;

/// Decodes the code point at `s[i]` and returns its length in bytes.
size_t decodeUtf8(const std::string &s, size_t i, uint32_t &cp) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  size_t len;
  uint32_t min;
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  if ((c & 0xe0) == 0xc0) {
    len = 2;
    cp = c & 0x1f;
    min = 0x80;
  } else if ((c & 0xf0) == 0xe0) {
    len = 3;
    cp = c & 0x0f;
    min = 0x800;
  } else if ((c & 0xf8) == 0xf0) {
    len = 4;
    cp = c & 0x07;
    min = 0x10000;
  } else {
    cp = kInvalid;
    return 1;
  }
  if (i + len > s.size()) {
    cp = kInvalid;
    return 1;
  }
  for (size_t k = 1; k < len; ++k) {
    unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xc0) != 0x80) {
      cp = kInvalid;
      return 1;
    }
    cp = (cp << 6) | (cc & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
    cp = kInvalid;
    return 1;
  }
  return len;
}

void appendUtf8(std::string &out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

CharClass classAt(const std::string &s, size_t i, size_t &len) {
  uint32_t cp;
  len = decodeUtf8(s, i, cp);
  return cp == kInvalid ? CharClass::Other : classify(cp);
}

/// Returns the end of the run of characters of class `cls` starting at `i`.
size_t runEnd(const std::string &s, size_t i, CharClass cls) {
  size_t len;
  while (i < s.size() && classAt(s, i, len) == cls)
    i += len;
  return i;
}

/// Applies the GPT-2 expression to `s`, appending the matches to `out`.
void splitGpt2(const std::string &s, std::vector<std::string> &out) {
  static const char *const kContractions[] = {"s", "t",  "re", "ve",
                                              "m", "ll", "d"};
  size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (s[i] == '\'') {
      bool matched = false;
      for (const char *c : kContractions) {
        size_t len = std::char_traits<char>::length(c);
        if (s.compare(i + 1, len, c) == 0) {
          out.push_back(s.substr(i, 1 + len));
          i += 1 + len;
          matched = true;
          break;
        }
      }
      if (matched)
        continue;
    }
    // " ?X+" for X in letters, numbers, other: the optional space only
    // counts when a run of X follows it.
    size_t j = (s[i] == ' ' && i + 1 < n) ? i + 1 : i;
    size_t len;
    CharClass cls = classAt(s, j, len);
    if (cls != CharClass::Space) {
      size_t end = runEnd(s, j, cls);
      out.push_back(s.substr(i, end - i));
      i = end;
      continue;
    }
    // Whitespace at i: "\s+(?!\S)" takes the run but leaves its last
    // character to prefix the next word; when that would leave nothing,
    // "\s+" takes the single character.
    size_t end = i;
    size_t last = i;
    while (end < n && classAt(s, end, len) == CharClass::Space) {
      last = end;
      end += len;
    }
    if (end < n && last > i)
      end = last;
    out.push_back(s.substr(i, end - i));
    i = end;
  }
}

} // namespace

Tokenizer::Tokenizer(const GgufFile &file) {
  const std::string &path = file.path();
  std::string model = file.requireString("tokenizer.ggml.model");
  if (model != "gpt2")
    throw GgufError(path + ": tokenizer.ggml.model is \"" + model +
                    "\"; kvc-run implements only \"gpt2\" (byte-level BPE)");
  std::string pre = file.getString("tokenizer.ggml.pre", "gpt2");
  if (pre == "gpt2")
    pre_ = PreTokenizer::Gpt2;
  else if (pre == "smollm" || pre == "starcoder")
    pre_ = PreTokenizer::Gpt2IsolatedDigits;
  else
    throw GgufError(path + ": tokenizer.ggml.pre is \"" + pre +
                    "\"; kvc-run implements \"gpt2\", \"smollm\" and "
                    "\"starcoder\"");

  const GgufValue &tokens =
      file.requireArray("tokenizer.ggml.tokens", GgufType::String);
  tokens_.reserve(tokens.elems.size());
  for (const GgufValue &t : tokens.elems)
    tokens_.push_back(t.str);
  if (tokens_.empty())
    throw GgufError(path + ": tokenizer.ggml.tokens is empty");
  for (size_t id = 0; id < tokens_.size(); ++id)
    ids_.emplace(tokens_[id], TokenId(id));

  types_.assign(tokens_.size(), kTypeNormal);
  if (file.find("tokenizer.ggml.token_type")) {
    const GgufValue &types =
        file.requireArray("tokenizer.ggml.token_type", GgufType::Int32);
    if (types.elems.size() != tokens_.size())
      throw GgufError(path + ": tokenizer.ggml.token_type has " +
                      std::to_string(types.elems.size()) + " entries for " +
                      std::to_string(tokens_.size()) + " tokens");
    for (size_t id = 0; id < types_.size(); ++id)
      types_[id] = int32_t(types.elems[id].i);
  }

  const GgufValue &merges =
      file.requireArray("tokenizer.ggml.merges", GgufType::String);
  mergeRank_.reserve(merges.elems.size());
  for (size_t r = 0; r < merges.elems.size(); ++r) {
    const std::string &m = merges.elems[r].str;
    size_t sp = m.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == m.size())
      throw GgufError(path + ": tokenizer.ggml.merges[" + std::to_string(r) +
                      "] = \"" + m + "\" is not of the form \"left right\"");
    // Earlier merges win; a duplicate keeps its first rank.
    mergeRank_.emplace(m, int32_t(r));
  }

  auto tokenId = [&](const char *key, int64_t fallback) -> TokenId {
    uint64_t v = file.getUInt(key, uint64_t(fallback));
    if (fallback < 0 && v == uint64_t(fallback))
      return -1;
    if (v >= tokens_.size())
      throw GgufError(path + ": " + key + " = " + std::to_string(v) +
                      " is outside the vocabulary of " +
                      std::to_string(tokens_.size()) + " tokens");
    return TokenId(v);
  };
  bos_ = tokenId("tokenizer.ggml.bos_token_id", -1);
  eos_ = tokenId("tokenizer.ggml.eos_token_id", -1);
  addBos_ = file.getBool("tokenizer.ggml.add_bos_token", false) && bos_ >= 0;
  if (eos_ >= 0)
    endOfGeneration_.push_back(eos_);
  TokenId eot = tokenId("tokenizer.ggml.eot_token_id", -1);
  if (eot >= 0)
    endOfGeneration_.push_back(eot);
  // Chat models end a turn with a control token the metadata may not name.
  for (const char *s : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>"}) {
    TokenId id = lookup(s);
    if (id >= 0 && types_[size_t(id)] == kTypeControl)
      endOfGeneration_.push_back(id);
  }

  for (size_t id = 0; id < tokens_.size(); ++id)
    if ((types_[id] == kTypeControl || types_[id] == kTypeUserDefined) &&
        !tokens_[id].empty())
      specials_.push_back(TokenId(id));
  // Longest first, so that a special token that prefixes another loses.
  std::stable_sort(
      specials_.begin(), specials_.end(), [&](TokenId a, TokenId b) {
        return tokens_[size_t(a)].size() > tokens_[size_t(b)].size();
      });

  // GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves;
  // the others (controls, space, a few Latin-1 gaps) are renumbered from
  // U+0100 in byte order so every byte has a visible character.
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) ||
                     (b >= 174 && b <= 255);
    uint32_t cp = printable ? b : next++;
    appendUtf8(byteToChar_[b], cp);
    charToByte_[cp] = uint8_t(b);
  }
  // Vocabularies may leave out bytes that never occur in valid UTF-8 text
  // (0xC0, 0xF5..0xFF) and rare control characters; those encode as the
  // unknown token.
  unknown_ = tokenId("tokenizer.ggml.unknown_token_id", -1);
}

TokenId Tokenizer::lookup(const std::string &piece) const {
  auto it = ids_.find(piece);
  return it == ids_.end() ? -1 : it->second;
}

bool Tokenizer::isEndOfGeneration(TokenId id) const {
  return std::find(endOfGeneration_.begin(), endOfGeneration_.end(), id) !=
         endOfGeneration_.end();
}

std::vector<std::string> Tokenizer::preTokenize(const std::string &text) const {
  std::vector<std::string> out;
  if (pre_ == PreTokenizer::Gpt2) {
    splitGpt2(text, out);
    return out;
  }
  // Every numeric character is a pre-token of its own; the GPT-2 rules run
  // on the text between them.
  size_t start = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t len;
    if (classAt(text, i, len) == CharClass::Number) {
      if (i > start)
        splitGpt2(text.substr(start, i - start), out);
      out.push_back(text.substr(i, len));
      start = i + len;
    }
    i += len;
  }
  if (start < text.size())
    splitGpt2(text.substr(start), out);
  return out;
}

void Tokenizer::bpe(const std::string &word, std::vector<TokenId> &out) const {
  auto cached = cache_.find(word);
  if (cached != cache_.end()) {
    out.insert(out.end(), cached->second.begin(), cached->second.end());
    return;
  }
  std::vector<std::string> syms;
  syms.reserve(word.size());
  for (unsigned char c : word)
    syms.push_back(byteToChar_[c]);
  // Repeatedly merge the adjacent pair of lowest rank, leftmost on ties.
  std::string key;
  while (syms.size() > 1) {
    int32_t bestRank = INT32_MAX;
    size_t best = 0;
    for (size_t k = 0; k + 1 < syms.size(); ++k) {
      key.assign(syms[k]).append(1, ' ').append(syms[k + 1]);
      auto it = mergeRank_.find(key);
      if (it != mergeRank_.end() && it->second < bestRank) {
        bestRank = it->second;
        best = k;
      }
    }
    if (bestRank == INT32_MAX)
      break;
    syms[best] += syms[best + 1];
    syms.erase(syms.begin() + std::ptrdiff_t(best) + 1);
  }
  std::vector<TokenId> ids;
  for (const std::string &s : syms) {
    TokenId id = lookup(s);
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    // A merge result missing from the vocabulary: spell it byte by byte,
    // and bytes the vocabulary lacks as the unknown token (or not at all
    // when the file names none).
    size_t i = 0;
    while (i < s.size()) {
      uint32_t cp;
      size_t len = decodeUtf8(s, i, cp);
      TokenId byteId = lookup(s.substr(i, len));
      if (byteId < 0)
        byteId = unknown_;
      if (byteId >= 0)
        ids.push_back(byteId);
      i += len;
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  cache_.emplace(word, std::move(ids));
}

void Tokenizer::encodeChunk(const std::string &text,
                            std::vector<TokenId> &out) const {
  for (const std::string &word : preTokenize(text))
    bpe(word, out);
}

std::vector<TokenId> Tokenizer::encode(const std::string &text,
                                       bool parseSpecial) const {
  std::vector<TokenId> out;
  if (addBos_)
    out.push_back(bos_);
  size_t start = 0;
  if (parseSpecial) {
    for (size_t i = 0; i < text.size(); ++i) {
      for (TokenId id : specials_) {
        const std::string &sp = tokens_[size_t(id)];
        if (text.compare(i, sp.size(), sp) != 0)
          continue;
        if (i > start)
          encodeChunk(text.substr(start, i - start), out);
        out.push_back(id);
        start = i + sp.size();
        i = start - 1;
        break;
      }
    }
  }
  if (start < text.size())
    encodeChunk(text.substr(start), out);
  return out;
}

std::string Tokenizer::decode(TokenId id) const {
  if (id < 0 || size_t(id) >= tokens_.size())
    return std::string();
  const std::string &piece = tokens_[size_t(id)];
  int32_t type = types_[size_t(id)];
  if (type == kTypeControl || type == kTypeUserDefined)
    return piece;
  std::string out;
  size_t i = 0;
  while (i < piece.size()) {
    uint32_t cp;
    size_t len = decodeUtf8(piece, i, cp);
    auto it = charToByte_.find(cp);
    if (it != charToByte_.end())
      out += char(it->second);
    else
      out.append(piece, i, len);
    i += len;
  }
  return out;
}

} // namespace run
} // namespace kvc
