//===- Model.cpp - Llama-architecture forward pass ------------------------===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// Rotary embedding pairing: GGUF conversion of llama checkpoints permutes the
// rows of the Q and K projections so that the two coordinates rotated
// together are adjacent, (2i, 2i + 1), rather than half a head apart as in
// the original checkpoints. This file therefore rotates adjacent pairs;
// scripts/check_logits.py undoes the permutation and rotates half-split
// pairs, and the two agree.
//
//===----------------------------------------------------------------------===//

#include "tools/kvc-run/Model.h"

#include "tools/kvc-run/Gguf.h"
#include "tools/kvc-run/Quant.h"
#include "tools/kvc-run/ThreadPool.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace kvc {
namespace run {

namespace {

/// Below this many vectors a matmul dots the quantized rows directly; from
/// it on, each row is dequantized once and reused for every vector.
constexpr size_t kBatchedMatmulMin = 4;

/// Rows handled together by the batched matmul (see dotF32x4).
constexpr size_t kRowTile = 4;

void rmsNorm(const float *x, const float *weight, size_t dim, float eps,
             float *out) {
  double ss = 0.0;
  for (size_t i = 0; i < dim; ++i)
    ss += double(x[i]) * double(x[i]);
  float scale = float(1.0 / std::sqrt(ss / double(dim) + double(eps)));
  for (size_t i = 0; i < dim; ++i)
    out[i] = x[i] * scale * weight[i];
}

std::vector<float> loadVector(const GgufFile &file, const std::string &name,
                              uint64_t dim) {
  const GgufTensor &t = file.requireTensor(name, {dim});
  std::vector<float> out(dim);
  dequantizeRow(t.type, t.data, out.data(), dim);
  return out;
}

int requireInt(const GgufFile &file, const std::string &key) {
  uint64_t v = file.requireUInt(key);
  if (v == 0 || v > (uint64_t(1) << 30))
    throw GgufError(file.path() + ": metadata '" + key +
                    "' = " + std::to_string(v) + " is out of range");
  return int(v);
}

} // namespace

KvGeometry LlamaConfig::kvGeometry() const {
  KvGeometry g;
  g.numLayers = numLayers;
  g.numHeads = numHeads;
  g.numKvHeads = numKvHeads;
  g.headDim = headDim;
  return g;
}

std::string LlamaConfig::describe() const {
  std::ostringstream os;
  os << numLayers << " layers, dim " << embedDim << ", ffn " << ffnDim
     << ", heads " << numHeads << "/" << numKvHeads << " x " << headDim
     << ", rope " << ropeDims << " dims base " << ropeBase << ", vocab "
     << vocabSize << ", context " << contextLength
     << (tiedOutput ? ", tied output" : "");
  return os.str();
}

LlamaModel::LlamaModel(const GgufFile &file) {
  std::string arch = file.requireString("general.architecture");
  if (arch != "llama")
    throw GgufError(file.path() + ": general.architecture is \"" + arch +
                    "\"; kvc-run implements \"llama\"");
  LlamaConfig &c = config_;
  c.numLayers = requireInt(file, "llama.block_count");
  c.embedDim = requireInt(file, "llama.embedding_length");
  c.ffnDim = requireInt(file, "llama.feed_forward_length");
  c.numHeads = requireInt(file, "llama.attention.head_count");
  c.numKvHeads =
      int(file.getUInt("llama.attention.head_count_kv", uint64_t(c.numHeads)));
  if (c.numKvHeads <= 0 || c.numHeads % c.numKvHeads != 0)
    throw GgufError(file.path() + ": llama.attention.head_count_kv = " +
                    std::to_string(c.numKvHeads) + " does not divide " +
                    "head_count = " + std::to_string(c.numHeads));
  if (c.embedDim % c.numHeads != 0)
    throw GgufError(file.path() + ": embedding_length " +
                    std::to_string(c.embedDim) + " is not a multiple of " +
                    "head_count " + std::to_string(c.numHeads));
  c.headDim = c.embedDim / c.numHeads;
  c.ropeDims =
      int(file.getUInt("llama.rope.dimension_count", uint64_t(c.headDim)));
  if (c.ropeDims <= 0 || c.ropeDims > c.headDim || c.ropeDims % 2 != 0)
    throw GgufError(file.path() + ": llama.rope.dimension_count = " +
                    std::to_string(c.ropeDims) + " must be even and at most " +
                    "the head size " + std::to_string(c.headDim));
  c.ropeBase = file.getFloat("llama.rope.freq_base", 10000.0);
  c.rmsEps = float(file.requireFloat("llama.attention.layer_norm_rms_epsilon"));
  c.contextLength = size_t(file.requireUInt("llama.context_length"));

  tokenEmbedding_ = file.findTensor("token_embd.weight");
  if (!tokenEmbedding_ || tokenEmbedding_->dims.size() != 2)
    throw GgufError(file.path() + ": missing 2-D tensor 'token_embd.weight'");
  c.vocabSize = int(tokenEmbedding_->dims[1]);
  uint64_t d = uint64_t(c.embedDim), f = uint64_t(c.ffnDim),
           kv = uint64_t(c.numKvHeads) * uint64_t(c.headDim),
           vocab = uint64_t(c.vocabSize);
  file.requireTensor("token_embd.weight", {d, vocab});
  c.tiedOutput = file.findTensor("output.weight") == nullptr;
  output_ = c.tiedOutput ? tokenEmbedding_
                         : &file.requireTensor("output.weight", {d, vocab});
  outputNorm_ = loadVector(file, "output_norm.weight", d);

  layers_.resize(size_t(c.numLayers));
  for (int l = 0; l < c.numLayers; ++l) {
    std::string p = "blk." + std::to_string(l) + ".";
    Layer &L = layers_[size_t(l)];
    L.attnNorm = loadVector(file, p + "attn_norm.weight", d);
    L.ffnNorm = loadVector(file, p + "ffn_norm.weight", d);
    L.wq = &file.requireTensor(p + "attn_q.weight", {d, d});
    L.wk = &file.requireTensor(p + "attn_k.weight", {d, kv});
    L.wv = &file.requireTensor(p + "attn_v.weight", {d, kv});
    L.wo = &file.requireTensor(p + "attn_output.weight", {d, d});
    L.wGate = &file.requireTensor(p + "ffn_gate.weight", {d, f});
    L.wUp = &file.requireTensor(p + "ffn_up.weight", {d, f});
    L.wDown = &file.requireTensor(p + "ffn_down.weight", {f, d});
  }

  for (int i = 0; i < c.ropeDims / 2; ++i)
    ropeFreqs_.push_back(
        std::pow(c.ropeBase, -2.0 * double(i) / double(c.ropeDims)));
}

void LlamaModel::applyRope(float *x, int numHeads, size_t pos) const {
  size_t hd = size_t(config_.headDim);
  for (size_t i = 0; i < ropeFreqs_.size(); ++i) {
    double angle = double(pos) * ropeFreqs_[i];
    float cs = float(std::cos(angle));
    float sn = float(std::sin(angle));
    for (int h = 0; h < numHeads; ++h) {
      float *p = x + size_t(h) * hd + 2 * i;
      float a = p[0], b = p[1];
      p[0] = a * cs - b * sn;
      p[1] = a * sn + b * cs;
    }
  }
}

void matmul(const GgufTensor &w, const float *x, size_t n, float *y,
            ThreadPool &pool) {
  size_t cols = size_t(w.dims[0]);
  size_t rows = size_t(w.numRows());
  size_t rowBytes = size_t(w.rowBytes());
  if (n < kBatchedMatmulMin) {
    pool.parallelFor(
        rows,
        [&](size_t begin, size_t end) {
          for (size_t r = begin; r < end; ++r) {
            const uint8_t *row = w.data + r * rowBytes;
            for (size_t t = 0; t < n; ++t)
              y[t * rows + r] = dotRow(w.type, row, x + t * cols, cols);
          }
        },
        kRowTile);
    return;
  }
  pool.parallelFor(
      rows,
      [&](size_t begin, size_t end) {
        std::vector<float> tile(kRowTile * cols);
        size_t r = begin;
        for (; r + kRowTile <= end; r += kRowTile) {
          for (size_t k = 0; k < kRowTile; ++k)
            dequantizeRow(w.type, w.data + (r + k) * rowBytes,
                          tile.data() + k * cols, cols);
          float out[kRowTile];
          for (size_t t = 0; t < n; ++t) {
            dotF32x4(tile.data(), cols, x + t * cols, cols, out);
            for (size_t k = 0; k < kRowTile; ++k)
              y[t * rows + r + k] = out[k];
          }
        }
        for (; r < end; ++r) {
          dequantizeRow(w.type, w.data + r * rowBytes, tile.data(), cols);
          for (size_t t = 0; t < n; ++t)
            y[t * rows + r] = dotF32(tile.data(), x + t * cols, cols);
        }
      },
      kRowTile);
}

void LlamaModel::forward(const TokenId *tokens, size_t n, size_t pos,
                         KvCache &cache, ThreadPool &pool, float *logits) {
  const LlamaConfig &c = config_;
  size_t d = size_t(c.embedDim), f = size_t(c.ffnDim),
         kvd = size_t(c.numKvHeads) * size_t(c.headDim);
  x_.resize(n * d);
  xn_.resize(n * d);
  q_.resize(n * d);
  k_.resize(n * kvd);
  v_.resize(n * kvd);
  att_.resize(n * d);
  gate_.resize(n * f);
  up_.resize(n * f);

  size_t embRowBytes = size_t(tokenEmbedding_->rowBytes());
  for (size_t t = 0; t < n; ++t)
    dequantizeRow(tokenEmbedding_->type,
                  tokenEmbedding_->data + size_t(tokens[t]) * embRowBytes,
                  x_.data() + t * d, d);

  for (int l = 0; l < c.numLayers; ++l) {
    const Layer &L = layers_[size_t(l)];
    for (size_t t = 0; t < n; ++t)
      rmsNorm(x_.data() + t * d, L.attnNorm.data(), d, c.rmsEps,
              xn_.data() + t * d);
    matmul(*L.wq, xn_.data(), n, q_.data(), pool);
    matmul(*L.wk, xn_.data(), n, k_.data(), pool);
    matmul(*L.wv, xn_.data(), n, v_.data(), pool);
    for (size_t t = 0; t < n; ++t) {
      applyRope(q_.data() + t * d, c.numHeads, pos + t);
      applyRope(k_.data() + t * kvd, c.numKvHeads, pos + t);
    }
    if (n == 1) {
      cache.append(l, k_.data(), v_.data());
      cache.attention(l, q_.data(), att_.data());
    } else {
      cache.appendAndAttend(l, n, q_.data(), k_.data(), v_.data(), att_.data());
    }
    // The output projection reuses xn_; its result is added to the residual.
    matmul(*L.wo, att_.data(), n, xn_.data(), pool);
    for (size_t i = 0; i < n * d; ++i)
      x_[i] += xn_[i];

    for (size_t t = 0; t < n; ++t)
      rmsNorm(x_.data() + t * d, L.ffnNorm.data(), d, c.rmsEps,
              xn_.data() + t * d);
    matmul(*L.wGate, xn_.data(), n, gate_.data(), pool);
    matmul(*L.wUp, xn_.data(), n, up_.data(), pool);
    for (size_t i = 0; i < n * f; ++i) {
      float g = gate_[i];
      gate_[i] = g / (1.0f + std::exp(-g)) * up_[i];
    }
    matmul(*L.wDown, gate_.data(), n, xn_.data(), pool);
    for (size_t i = 0; i < n * d; ++i)
      x_[i] += xn_[i];
  }

  if (!logits)
    return;
  rmsNorm(x_.data() + (n - 1) * d, outputNorm_.data(), d, c.rmsEps, xn_.data());
  matmul(*output_, xn_.data(), 1, logits, pool);
}

} // namespace run
} // namespace kvc
