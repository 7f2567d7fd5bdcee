//===- Compare.cpp - Policies against the full cache on one prompt --------===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//

#include "tools/kvc-run/Compare.h"

#include "tools/kvc-run/KvCache.h"
#include "tools/kvc-run/Model.h"
#include "tools/kvc-run/PolicyKvCache.h"
#include "tools/kvc-run/PolicyLibrary.h"
#include "tools/kvc-run/ThreadPool.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

namespace kvc {
namespace run {

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// The model's pass over a prompt as one batch: per layer the queries, keys
/// and values handed to the cache and the attention output it returned, and
/// the logits of the last position.
struct PromptRecording {
  size_t n = 0;
  std::vector<std::vector<float>> q, k, v, out;
  std::vector<float> logits;

  bool complete(int numLayers) const {
    if (n == 0 || int(q.size()) != numLayers)
      return false;
    for (const auto &layer : q)
      if (layer.empty())
        return false;
    return !logits.empty();
  }
};

/// Passes every call to `inner` and records the prompt batches.
class RecordingKvCache final : public KvCache {
public:
  RecordingKvCache(KvCache &inner, PromptRecording &recording)
      : KvCache(inner.geometry()), inner_(inner), recording_(recording) {
    size_t layers = size_t(inner.geometry().numLayers);
    recording_.q.assign(layers, {});
    recording_.k.assign(layers, {});
    recording_.v.assign(layers, {});
    recording_.out.assign(layers, {});
  }

  void append(int layer, const float *k, const float *v) override {
    inner_.append(layer, k, v);
  }
  void attention(int layer, const float *q, float *out) override {
    inner_.attention(layer, q, out);
  }
  void appendAndAttend(int layer, size_t n, const float *q, const float *k,
                       const float *v, float *out) override {
    inner_.appendAndAttend(layer, n, q, k, v, out);
    const KvGeometry &g = geometry();
    size_t l = size_t(layer);
    recording_.n = n;
    recording_.q[l].assign(q, q + n * g.queryFloats());
    recording_.k[l].assign(k, k + n * g.kvFloats());
    recording_.v[l].assign(v, v + n * g.kvFloats());
    recording_.out[l].assign(out, out + n * g.queryFloats());
  }
  size_t size(int layer) const override { return inner_.size(layer); }
  size_t bytes() const override { return inner_.bytes(); }
  void clear() override { inner_.clear(); }

private:
  KvCache &inner_;
  PromptRecording &recording_;
};

/// Hands the recorded prompt to `cache` layer by layer; false when an
/// attention output differs from the recorded one in any bit.
bool replayPrompt(KvCache &cache, const PromptRecording &recording) {
  const KvGeometry &g = cache.geometry();
  std::vector<float> out(recording.n * g.queryFloats());
  for (int l = 0; l < g.numLayers; ++l) {
    size_t i = size_t(l);
    cache.appendAndAttend(l, recording.n, recording.q[i].data(),
                          recording.k[i].data(), recording.v[i].data(),
                          out.data());
    if (std::memcmp(out.data(), recording.out[i].data(),
                    out.size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

/// log(sum(exp(x))) in double precision.
double logSumExp(const std::vector<float> &x) {
  float m = *std::max_element(x.begin(), x.end());
  double s = 0.0;
  for (float v : x)
    s += std::exp(double(v) - double(m));
  return double(m) + std::log(s);
}

size_t argmax(const std::vector<float> &x) {
  return size_t(std::max_element(x.begin(), x.end()) - x.begin());
}

std::string jsonString(const std::string &s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      } else {
        out += char(c);
      }
    }
  }
  return out + "\"";
}

/// What one run measured.
struct RunResult {
  std::string policy;
  std::string description;
  bool replayed = false;
  double promptSeconds = 0.0;
  size_t entries = 0;
  size_t maxLayerEntries = 0;
  size_t bytes = 0;
  size_t bytesEnd = 0;
  double bytesPerEntry = 0.0;
  double nllSum = 0.0;
  double klSum = 0.0;
  size_t top1 = 0;
  size_t scored = 0;
  double maxAbsDiff = 0.0;
  double maxAbsRef = 0.0;
  double promptMaxAbsDiff = 0.0;
  int decodeSteps = 0;
  double decodeSeconds = 0.0;
  std::string completion;
};

/// The full-cache run every policy is measured against.
struct Reference {
  std::vector<float> promptLogits;
  std::vector<std::vector<float>> evalLogits;
  std::vector<double> evalLse;
};

class Comparison {
public:
  Comparison(LlamaModel &model, const Tokenizer &tokenizer,
             const std::vector<TokenId> &prompt, ThreadPool &pool,
             const CompareOptions &options)
      : model_(model), tokenizer_(tokenizer), prompt_(prompt), pool_(pool),
        options_(options), context_(prompt.size() - options.evalTokens) {}

  int run();

private:
  /// Runs the prompt, the scored tokens and the completion with `cache`.
  RunResult measure(KvCache &cache, const std::string &name,
                    const PolicyLibrary *library, bool reference);
  void print(const RunResult &r) const;

  LlamaModel &model_;
  const Tokenizer &tokenizer_;
  const std::vector<TokenId> &prompt_;
  ThreadPool &pool_;
  const CompareOptions &options_;
  /// Prompt tokens before the scored ones.
  size_t context_;
  Reference reference_;
  PromptRecording recording_;
  bool recorded_ = false;
};

RunResult Comparison::measure(KvCache &cache, const std::string &name,
                              const PolicyLibrary *library, bool reference) {
  const LlamaConfig &cfg = model_.config();
  RunResult r;
  r.policy = name;
  r.description = library ? library->description : "full f32 cache";
  std::vector<float> logits(size_t(cfg.vocabSize));

  // The prompt: the full cache in batches; a policy as one batch, since its
  // prefill scores the whole prompt.
  auto start = Clock::now();
  bool done = false;
  if (library && options_.replay && recorded_ &&
      recording_.n == context_) {
    done = replayPrompt(cache, recording_);
    if (done) {
      logits = recording_.logits;
      r.replayed = true;
    } else {
      std::fprintf(stderr,
                   "kvc-run: %s: replayed prompt attention differs from the "
                   "recorded pass; running the prompt through the model\n",
                   name.c_str());
      cache.clear();
    }
  }
  if (!done) {
    if (library && options_.replay && !recorded_) {
      RecordingKvCache recorder(cache, recording_);
      model_.forward(prompt_.data(), context_, 0, recorder, pool_,
                     logits.data());
      recording_.logits = logits;
      recorded_ = recording_.complete(cfg.numLayers);
    } else {
      size_t batch = library ? context_ : options_.prefillBatch;
      for (size_t at = 0; at < context_;) {
        size_t n = std::min(batch, context_ - at);
        bool last = at + n == context_;
        model_.forward(prompt_.data() + at, n, at, cache, pool_,
                       last ? logits.data() : nullptr);
        at += n;
      }
    }
  }
  r.promptSeconds = secondsSince(start);

  const KvGeometry g = cfg.kvGeometry();
  if (library) {
    // Only policy runs get a library.
    auto *policy = static_cast<PolicyKvCache *>(&cache);
    r.entries = policy->totalEntries();
    r.bytesPerEntry = policy->bytesPerEntry();
  } else {
    r.entries = cache.size(0) * size_t(g.numLayers) * size_t(g.numKvHeads);
    r.bytesPerEntry = double(2 * g.headDim * sizeof(float));
  }
  for (int l = 0; l < g.numLayers; ++l)
    r.maxLayerEntries = std::max(r.maxLayerEntries, cache.size(l));
  r.bytes = cache.bytes();

  if (reference) {
    reference_.promptLogits = logits;
  } else {
    for (size_t i = 0; i < logits.size(); ++i)
      r.promptMaxAbsDiff =
          std::max(r.promptMaxAbsDiff,
                   std::fabs(double(logits[i]) -
                             double(reference_.promptLogits[i])));
  }

  // Teacher-forced decoding of the scored tokens.
  size_t n = options_.evalTokens;
  for (size_t i = 0; i < n; ++i) {
    TokenId target = prompt_[context_ + i];
    double lse = logSumExp(logits);
    r.nllSum += lse - double(logits[size_t(target)]);
    ++r.scored;
    if (reference) {
      reference_.evalLogits.push_back(logits);
      reference_.evalLse.push_back(lse);
    } else {
      const std::vector<float> &ref = reference_.evalLogits[i];
      double refLse = reference_.evalLse[i];
      double kl = 0.0;
      for (size_t v = 0; v < logits.size(); ++v) {
        double refLog = double(ref[v]) - refLse;
        kl += std::exp(refLog) * (refLog - (double(logits[v]) - lse));
        r.maxAbsDiff = std::max(
            r.maxAbsDiff, std::fabs(double(logits[v]) - double(ref[v])));
        r.maxAbsRef = std::max(r.maxAbsRef, std::fabs(double(ref[v])));
      }
      r.klSum += std::max(kl, 0.0);
      r.top1 += argmax(logits) == argmax(ref);
    }
    if (i + 1 < n || options_.nPredict > 0) {
      auto step = Clock::now();
      model_.forward(&target, 1, context_ + i, cache, pool_, logits.data());
      r.decodeSeconds += secondsSince(step);
      ++r.decodeSteps;
    }
  }

  // Greedy completion.
  size_t pos = prompt_.size();
  for (int i = 0; i < options_.nPredict; ++i) {
    TokenId next = TokenId(argmax(logits));
    if (tokenizer_.isEndOfGeneration(next))
      break;
    r.completion += tokenizer_.decode(next);
    if (i + 1 == options_.nPredict)
      break;
    auto step = Clock::now();
    model_.forward(&next, 1, pos++, cache, pool_, logits.data());
    r.decodeSeconds += secondsSince(step);
    ++r.decodeSteps;
  }
  r.bytesEnd = cache.bytes();
  return r;
}

void Comparison::print(const RunResult &r) const {
  double ppl = r.scored ? std::exp(r.nllSum / double(r.scored)) : 0.0;
  double kl = r.scored ? r.klSum / double(r.scored) : 0.0;
  double top1 = r.scored ? double(r.top1) / double(r.scored) : 0.0;
  bool reference = r.policy == "none";
  if (reference)
    top1 = r.scored ? 1.0 : 0.0;
  double rate = r.decodeSteps ? double(r.decodeSteps) / r.decodeSeconds : 0.0;
  std::printf(
      "{\"policy\": %s, \"description\": %s, \"prompt_tokens\": %zu, "
      "\"eval_tokens\": %zu, \"replayed\": %s, \"prompt_s\": %.3f, "
      "\"entries\": %zu, \"max_layer_entries\": %zu, \"kv_bytes\": %zu, "
      "\"kv_bytes_end\": %zu, \"bytes_per_entry\": %.3f, \"nll\": %.6f, "
      "\"ppl\": %.6f, \"kl\": %.8f, \"top1\": %.6f, "
      "\"max_abs_logit_diff\": %.8g, \"max_abs_ref_logit\": %.8g, "
      "\"prompt_max_abs_logit_diff\": %.8g, \"decode_steps\": %d, "
      "\"decode_tok_s\": %.3f, \"completion\": %s}\n",
      jsonString(r.policy).c_str(), jsonString(r.description).c_str(),
      context_, r.scored, r.replayed ? "true" : "false", r.promptSeconds,
      r.entries, r.maxLayerEntries, r.bytes, r.bytesEnd, r.bytesPerEntry,
      r.scored ? r.nllSum / double(r.scored) : 0.0, ppl, kl, top1,
      r.maxAbsDiff, r.maxAbsRef, r.promptMaxAbsDiff, r.decodeSteps, rate,
      jsonString(r.completion).c_str());
  std::fflush(stdout);
  char quality[96] = "";
  if (r.scored)
    std::snprintf(quality, sizeof quality, ", ppl %.3f, KL %.5f, top-1 %.3f",
                  ppl, kl, top1);
  std::fprintf(stderr,
               "kvc-run: %-20s prompt %.1f s%s, %zu entries (%.2f MiB)%s, "
               "decode %.1f tok/s\n",
               r.policy.c_str(), r.promptSeconds,
               r.replayed ? " (replayed)" : "", r.entries,
               double(r.bytes) / (1 << 20), quality, rate);
}

int Comparison::run() {
  const LlamaConfig &cfg = model_.config();
  FullKvCache full(cfg.kvGeometry(), pool_);
  print(measure(full, "none", nullptr, true));
  size_t maxTokens = prompt_.size() + size_t(options_.nPredict) + 1;
  for (const std::string &name : options_.policies) {
    if (name == "none")
      continue;
    const PolicyLibrary *library = findPolicyLibrary(name);
    if (!library)
      throw PolicyError("no policy library '" + name + "' is linked");
    PolicyKvCache cache(cfg.kvGeometry(), *library, maxTokens);
    print(measure(cache, name, library, false));
  }
  return 0;
}

} // namespace

int runCompare(LlamaModel &model, const Tokenizer &tokenizer,
               const std::vector<TokenId> &prompt, ThreadPool &pool,
               const CompareOptions &options) {
  Comparison comparison(model, tokenizer, prompt, pool, options);
  return comparison.run();
}

} // namespace run
} // namespace kvc
