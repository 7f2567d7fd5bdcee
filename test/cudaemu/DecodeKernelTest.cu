//===- DecodeKernelTest.cu - The split decode attention kernel alone ------===//
//
// decodeAttentionSplit of runtime/kvc_cuda.cuh on the emulator, against a
// host reference in double precision, for its three paths: tensor cores
// (decodeMmaRows: f16 and bf16 with 2 <= G <= 8), the shared-memory tiles
// of decodeStagedRows (the other storages at G = 4, 8; f16 at G = 16) and
// the register tiles (G = 1; G = 2, 3 but for f16 and bf16), over every
// single-class storage (f32, f16, bf16, int8, fp8) at head dim 32, 64 and
// 128. The emulator runs the tensor-core path's mma.sync and ldmatrix as
// the PTX ISA defines their fragments (kvc_cuda.cuh's fallbacks). A batch
// of three heads of different lengths (one shorter than a split, so that
// some of its splits are empty) over pages of 12 slots (not a power of
// two: PageDivisor's multiply-high), with free slots, a page hole and a
// split size that is not a multiple of the tile. The references use the kernel's own decoding of
// the stored bytes (Codec), so that only the attention arithmetic is under
// test: every slot's logit and the merged split records
// (DecodeReference.h). Each case runs again without a logits row, as a
// decode without statistics does: the same records, bit for bit, and no
// logit stored; and once more with the merge in the last block of each
// head (mergeInLastSplit), whose output rows are checked against the
// records merged on the host.
// Exits 1 on the first difference.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_cuda.cuh"
#include "test/cudaemu/DecodeReference.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

using kvc::cuda::Storage;

constexpr int32_t kPageSize = 12;
constexpr int kThreads = kvc::cuda::kDecodeThreads;

const char *storageName(Storage s) {
  switch (s) {
  case Storage::F32:
    return "f32";
  case Storage::F16:
    return "f16";
  case Storage::BF16:
    return "bf16";
  case Storage::Int8:
    return "int8";
  case Storage::Fp8E4M3:
    return "fp8";
  }
  return "?";
}

/// A random stored row of D channels: bytes whose decoding is finite.
template <int D, Storage S> void randomRow(uint8_t *row, std::mt19937 &rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  using Codec = kvc::cuda::Codec<S>;
  for (int c = 0; c < D; ++c) {
    if constexpr (S == Storage::Int8) {
      row[c] = static_cast<uint8_t>(rng() % 255 + 1); // -127..127
    } else if constexpr (S == Storage::Fp8E4M3) {
      uint8_t b = static_cast<uint8_t>(rng());
      if ((b & 0x7f) == 0x7f)
        b &= 0xfe; // not NaN
      row[c] = b;
    } else {
      Codec::store(row, c, u(rng), 1.0f);
    }
  }
}

/// Channels of a stored row as floats, with the kernel's decoding.
template <int D, Storage S>
std::vector<float> decodeRow(const uint8_t *row, float scale) {
  using Shape = kvc::cuda::RowShape<D, S>;
  std::vector<float> out(D);
  for (int v = 0; v < Shape::kVecs; ++v) {
    uint4 raw;
    std::memcpy(&raw, row + 16 * v, 16);
    kvc::cuda::Codec<S>::decode(raw, scale, &out[v * Shape::kElemsPerVec]);
  }
  return out;
}

template <int G, int D, Storage S> void check(std::mt19937 &rng) {
  using Shape = kvc::cuda::RowShape<D, S>;
  constexpr bool kScaled = kvc::cuda::Codec<S>::kScaled;
  constexpr uint64_t kRowBytes = Shape::kRowBytes;
  // Page: keys, values, then the key and value scales.
  kvc::cuda::PageLayout layout{};
  layout.pages = kvc::cuda::PageDivisor::of(kPageSize);
  layout.keyOffset = 0;
  layout.valueOffset = kPageSize * kRowBytes;
  layout.keyParamOffset = 2 * kPageSize * kRowBytes;
  layout.valueParamOffset = layout.keyParamOffset + 4 * kPageSize;
  const uint64_t pageBytes =
      (layout.valueParamOffset + 4 * kPageSize + 255) / 256 * 256;

  const std::vector<int32_t> slots = {700, 37, 513};
  // Splits of 100 slots: not a multiple of any tile.
  DecodeBatch batch(G, D, slots, 100);
  const int32_t heads = batch.heads, numSplits = batch.numSplits;

  std::vector<kvc::cuda::HeadTable> tables(heads);
  // Host copies: per head, per slot, the decoded key and value (empty:
  // free slot).
  std::vector<std::vector<std::vector<float>>> keys(heads), values(heads);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int32_t h = 0; h < heads; ++h) {
    const int32_t n = slots[h];
    const int32_t numPages = (n + kPageSize - 1) / kPageSize;
    std::vector<uint64_t> pages(numPages);
    std::vector<int32_t> positions(n, KVC_POSITION_NONE);
    keys[h].resize(n);
    values[h].resize(n);
    for (int32_t p = 0; p < numPages; ++p) {
      if (h == 0 && p == 3)
        continue; // a hole: every slot of the page is free
      auto *page = static_cast<uint8_t *>(batch.alloc(pageBytes));
      pages[p] = reinterpret_cast<uint64_t>(page);
      for (int32_t o = 0; o < kPageSize; ++o) {
        const int32_t s = p * kPageSize + o;
        uint8_t *k = page + layout.keyOffset + o * kRowBytes;
        uint8_t *v = page + layout.valueOffset + o * kRowBytes;
        auto *ks = reinterpret_cast<float *>(page + layout.keyParamOffset);
        auto *vs = reinterpret_cast<float *>(page + layout.valueParamOffset);
        randomRow<D, S>(k, rng);
        randomRow<D, S>(v, rng);
        ks[o] = kScaled ? 0.01f + 0.02f * (u(rng) + 1.0f) : 1.0f;
        vs[o] = kScaled ? 0.01f + 0.02f * (u(rng) + 1.0f) : 1.0f;
        if (s >= n || rng() % 5 == 0)
          continue; // past the head, or free
        positions[s] = s;
        keys[h][s] = decodeRow<D, S>(k, ks[o]);
        values[h][s] = decodeRow<D, S>(v, vs[o]);
      }
    }
    tables[h] = batch.table(pages, positions);
  }
  std::vector<float> q(static_cast<size_t>(heads) * G * D);
  for (float &x : q)
    x = 2.0f * u(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const kvc::cuda::DecodeSplitArgs args =
      batch.args(tables, layout, q, scale);
  auto launch = [&](const kvc::cuda::DecodeSplitArgs &a) {
    kvc::cuda::decodeAttentionSplit<G, D, S, kThreads>
        <<<dim3(heads, numSplits), kThreads>>>(a);
  };
  launch(args);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "launch");

  const char *name = storageName(S);
  char prefix[64];
  std::snprintf(prefix, sizeof prefix, "G=%d D=%d %s", G, D, name);
  batch.check(prefix, keys, values, scale);
  batch.checkWithoutLogits(prefix, args, launch);
  batch.checkMergeInLastSplit(prefix, args, tables, launch);
  std::printf("decode G=%d D=%d %s (%s): ok\n", G, D, name,
              kvc::cuda::MmaDecode<G, D, S, kThreads>::kApplies
                  ? "tensor cores"
              : kvc::cuda::StagedDecode<G, D, S, kThreads>::kApplies
                  ? "shared-memory tiles"
                  : "register tiles");
}

template <int G, int D> void checkStorages(std::mt19937 &rng) {
  check<G, D, Storage::F32>(rng);
  check<G, D, Storage::F16>(rng);
  check<G, D, Storage::BF16>(rng);
  check<G, D, Storage::Int8>(rng);
  check<G, D, Storage::Fp8E4M3>(rng);
}

} // namespace

int main() {
  if (const int skip = skipWithoutDevice("the decode kernel test"))
    return skip;
  std::mt19937 rng(20261122);
  checkStorages<1, 128>(rng);
  checkStorages<3, 64>(rng);
  checkStorages<4, 128>(rng);
  checkStorages<4, 64>(rng);
  checkStorages<8, 128>(rng);
  // G > 4 on tensor cores: the value sums' columns are the heads
  // (MmaDecode::kHeadColumns), six of eight at G = 6.
  check<8, 64, Storage::F16>(rng);
  check<6, 128, Storage::BF16>(rng);
  checkStorages<2, 32>(rng);
  check<16, 64, Storage::F16>(rng);
  std::printf("decode kernel: ok\n");
  return 0;
}
