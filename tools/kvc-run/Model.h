//===- Model.h - Llama-architecture forward pass ----------------*- C++ -*-===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// The llama architecture as GGUF describes it: token embedding, per block
// RMSNorm -> grouped-query attention with rotary embeddings -> residual,
// RMSNorm -> SwiGLU MLP -> residual, final RMSNorm and the output projection
// (tied to the embedding when the file has no output.weight). Weights stay
// quantized in the mapped file; matrix products dot the quantized rows.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TOOLS_KVCRUN_MODEL_H
#define KVC_TOOLS_KVCRUN_MODEL_H

#include "tools/kvc-run/KvCache.h"
#include "tools/kvc-run/Tokenizer.h"

#include <cstddef>
#include <string>
#include <vector>

namespace kvc {
namespace run {

class GgufFile;
struct GgufTensor;
class ThreadPool;

/// Hyperparameters read from the `<arch>.*` metadata.
struct LlamaConfig {
  int numLayers = 0;
  int embedDim = 0;
  int ffnDim = 0;
  int numHeads = 0;
  int numKvHeads = 0;
  int headDim = 0;
  /// Leading dimensions of each head that are rotated.
  int ropeDims = 0;
  double ropeBase = 10000.0;
  float rmsEps = 1e-5f;
  size_t contextLength = 0;
  int vocabSize = 0;
  bool tiedOutput = false;

  /// The cache geometry this model needs.
  KvGeometry kvGeometry() const;
  /// One-line summary for logs.
  std::string describe() const;
};

/// A llama-architecture model whose weights live in a mapped GGUF file.
class LlamaModel {
public:
  /// Reads the configuration and locates every weight, checking shapes and
  /// types; throws GgufError on any mismatch. `file` must outlive the model.
  explicit LlamaModel(const GgufFile &file);

  const LlamaConfig &config() const { return config_; }

  /// Runs tokens `tokens[0..n)` at positions `pos..pos+n` through the model,
  /// adding their keys and values to `cache` (which must have seen exactly
  /// `pos` tokens per layer; a compressing cache may hold fewer entries).
  /// When `logits` is non-null it receives the vocabSize logits of the last
  /// token.
  void forward(const TokenId *tokens, size_t n, size_t pos, KvCache &cache,
               ThreadPool &pool, float *logits);

private:
  struct Layer {
    std::vector<float> attnNorm;
    std::vector<float> ffnNorm;
    const GgufTensor *wq = nullptr;
    const GgufTensor *wk = nullptr;
    const GgufTensor *wv = nullptr;
    const GgufTensor *wo = nullptr;
    const GgufTensor *wGate = nullptr;
    const GgufTensor *wUp = nullptr;
    const GgufTensor *wDown = nullptr;
  };

  void applyRope(float *x, int numHeads, size_t pos) const;

  LlamaConfig config_;
  const GgufTensor *tokenEmbedding_ = nullptr;
  const GgufTensor *output_ = nullptr;
  std::vector<float> outputNorm_;
  std::vector<Layer> layers_;
  /// Rotation frequency of each dimension pair: base^(-2i / ropeDims).
  std::vector<double> ropeFreqs_;
  /// Activations, grown to the largest batch seen.
  std::vector<float> x_, xn_, q_, k_, v_, att_, gate_, up_;
};

/// Computes y[t] = W x[t] for the `n` vectors of `x` (W.dims[0] floats each),
/// writing W.numRows() floats per vector to `y`, in parallel over rows.
void matmul(const GgufTensor &w, const float *x, size_t n, float *y,
            ThreadPool &pool);

} // namespace run
} // namespace kvc

#endif // KVC_TOOLS_KVCRUN_MODEL_H
