//===- Tokenizer.h - Byte-level BPE tokenizer -------------------*- C++ -*-===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// The GPT-2 style byte-level BPE tokenizer described by a GGUF file's
// tokenizer.ggml.* metadata: vocabulary, merge list, token types and the
// pre-tokenizer name. Text is first cut at special (control) tokens, then
// into pre-tokens by the pre-tokenizer's rules, each pre-token's bytes are
// mapped to printable characters and merged by rank.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TOOLS_KVCRUN_TOKENIZER_H
#define KVC_TOOLS_KVCRUN_TOKENIZER_H

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvc {
namespace run {

class GgufFile;

/// Token id as stored in the vocabulary.
using TokenId = int32_t;

/// A byte-level BPE tokenizer (tokenizer.ggml.model = "gpt2").
class Tokenizer {
public:
  /// Pre-tokenizers kvc-run implements, selected by tokenizer.ggml.pre.
  enum class PreTokenizer {
    /// The GPT-2 expression: contractions, letter runs, number runs,
    /// punctuation runs and whitespace, each optionally after one space.
    Gpt2,
    /// GPT-2's rules after isolating every numeric character, as the
    /// "smollm" and "starcoder" pre-tokenizers do.
    Gpt2IsolatedDigits,
  };

  /// Builds the tokenizer from `file`'s metadata; throws GgufError when the
  /// metadata is missing, inconsistent or names an unsupported model.
  explicit Tokenizer(const GgufFile &file);

  /// Splits `text` into token ids. Control tokens spelled in the text
  /// ("<|im_start|>") become their ids when `parseSpecial` is set.
  std::vector<TokenId> encode(const std::string &text,
                              bool parseSpecial = true) const;

  /// Returns the bytes a token stands for (control tokens give their text).
  std::string decode(TokenId id) const;

  /// Returns the vocabulary entry of `id` as stored (byte-level spelling).
  const std::string &piece(TokenId id) const { return tokens_[size_t(id)]; }

  size_t vocabSize() const { return tokens_.size(); }
  TokenId bos() const { return bos_; }
  TokenId eos() const { return eos_; }
  bool addBos() const { return addBos_; }
  /// True for tokens that end a generation (end of sequence, end of turn).
  bool isEndOfGeneration(TokenId id) const;
  /// Returns the id of a vocabulary entry, or -1 when absent.
  TokenId lookup(const std::string &piece) const;
  PreTokenizer preTokenizer() const { return pre_; }

  /// Splits `text` into pre-tokens, the units within which BPE merges.
  std::vector<std::string> preTokenize(const std::string &text) const;

private:
  void encodeChunk(const std::string &text, std::vector<TokenId> &out) const;
  void bpe(const std::string &word, std::vector<TokenId> &out) const;

  std::vector<std::string> tokens_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, TokenId> ids_;
  std::unordered_map<std::string, int32_t> mergeRank_;
  /// Special tokens matched verbatim in the input, longest first.
  std::vector<TokenId> specials_;
  std::vector<TokenId> endOfGeneration_;
  /// Byte-level spelling of each byte value, and its inverse.
  std::string byteToChar_[256];
  std::unordered_map<uint32_t, uint8_t> charToByte_;
  TokenId bos_ = -1;
  TokenId eos_ = -1;
  TokenId unknown_ = -1;
  bool addBos_ = false;
  PreTokenizer pre_ = PreTokenizer::Gpt2;
  /// Memoized BPE results per pre-token; long documents repeat words a lot.
  mutable std::unordered_map<std::string, std::vector<TokenId>> cache_;
};

} // namespace run
} // namespace kvc

#endif // KVC_TOOLS_KVCRUN_TOKENIZER_H
