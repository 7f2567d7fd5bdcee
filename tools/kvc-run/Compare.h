//===- Compare.h - Policies against the full cache on one prompt -*- C++ -*-===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// kvc-run --compare: runs one prompt with the full cache and then with each
// listed policy, and reports for each run the cache it kept (entries and
// bytes) and how far its next-token distributions are from the full
// cache's while it decodes: the last --eval-tokens tokens of the prompt are
// fed one decode step at a time (teacher forcing) and scored for
// perplexity, KL divergence from the full cache and top-1 agreement. An
// optional greedy completion follows. One JSON object per run goes to
// stdout, a readable line to stderr.
//
// Replay: every generated prefill computes the same causal attention of the
// prompt (compression happens after it), so the model's pass over the
// prompt is the same for every policy. The first policy runs the prompt
// through the model and its queries, keys and values are recorded per
// layer; the later policies are handed the recorded tensors layer by layer,
// and their attention outputs are checked bit for bit against the recorded
// ones (a mismatch falls back to a real pass). The decode steps always run
// the model.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TOOLS_KVCRUN_COMPARE_H
#define KVC_TOOLS_KVCRUN_COMPARE_H

#include "tools/kvc-run/Tokenizer.h"

#include <cstddef>
#include <string>
#include <vector>

namespace kvc {
namespace run {

class LlamaModel;
class ThreadPool;

struct CompareOptions {
  /// Policy library names; the full cache ("none") always runs first.
  std::vector<std::string> policies;
  /// Trailing prompt tokens scored by teacher-forced decoding.
  size_t evalTokens = 0;
  /// Greedy tokens generated after the prompt.
  int nPredict = 0;
  /// Replay the recorded prompt pass for the second and later policies.
  bool replay = true;
  /// Prompt batch of the full-cache run.
  size_t prefillBatch = 64;
};

/// Runs the comparison and prints its results; returns the exit status.
/// Throws GgufError or PolicyError on failures.
int runCompare(LlamaModel &model, const Tokenizer &tokenizer,
               const std::vector<TokenId> &prompt, ThreadPool &pool,
               const CompareOptions &options);

} // namespace run
} // namespace kvc

#endif // KVC_TOOLS_KVCRUN_COMPARE_H
