//===- KiviDecodeTest.cu - The KIVI decode attention kernel alone ---------===//
//
// decodeAttentionKivi of runtime/kvc_cuda.cuh on the emulator, against a host
// reference in double precision, for its three paths: the tensor-core tiles
// of decodeKiviMma (key blocks of 32 tokens or a multiple, 2 <= G <= 8: the
// logits in integers, key codes as bytes against the digits of the query's
// fixed-point factors; the value sums with codes as bf16 units and the
// weights split into bf16 parts; mma.sync as the emulator computes it from
// the PTX fragment layout), the CUDA-core tiles of decodeKiviTiles (the same
// blocks at G = 1, whose keys go through mma.sync too: the slots' codes
// against three digit bytes of the folded query, KiviTiles::kKeyMma; and at
// G = 4 and 8 through a kernel of this test that calls it directly, with
// dp2a keys: the fallback should the tensor-core path lose on a GPU)
// and the row groups of decodeKiviRows (other groups). KIVI pages are built
// by hand: random packed codes (LSB-first, as kvc_pack_bits), a {scale, min}
// per channel per block of KG key slots and per group of KG channels per
// value, and window entries whose key and value, or value only, are read from
// the residual region (the slot's word: row and kKiviKeyFull /
// kKiviValueFull). Three heads of different lengths over pages of 192 slots
// (not a power of two), with free slots, a page hole, a head whose keys are
// all in the window (no block to fold), a head laid out as a KIVI cache
// (every slot live, the window at its end), a split size that is not a
// multiple of the tile, and one split per head (each warp walks many tiles),
// cases whose key blocks have outlier channels (one in 16 with 8 times the
// range), and cases whose largest key factor is the float below 1. The
// reference dequantizes as x = code * scale + min in double and reads
// window rows with the kernel's Codec, and checks every slot's
// logit and the merged split records (DecodeReference.h); each case runs
// again without a logits row (as the KIVI policies' decode, which has no
// statistics): the same records, bit for bit, and no logit stored; then, but
// for the tiles-only kernel, with the merge in the last block of each head
// (mergeInLastSplit), whose output rows are checked against the records
// merged on the host. On the two tile paths the emulator's log of L2
// prefetches must hold the lines of every tile after a warp's first in its
// split, each once (KiviTilePrefetch; the tables' lines of the tile only
// without kIssueAhead). Exits 1 on the first difference.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_cuda.cuh"
#include "test/cudaemu/DecodeReference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

using kvc::cuda::Storage;

constexpr int32_t kPageSize = 192;
constexpr int32_t kResidual = 64;
constexpr int kThreads = kvc::cuda::kDecodeThreads;

const char *dtypeName(kvc_dtype_t t) {
  return t == KVC_DTYPE_F32 ? "f32" : (t == KVC_DTYPE_F16 ? "f16" : "bf16");
}

uint64_t alignUp(uint64_t x) { return (x + 255) / 256 * 256; }

/// A record half: x truncated to f16 (any f16 value does for the random
/// records; magnitudes below f16's normal range become 0), and its value
/// exactly.
uint16_t toF16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t sign = bits >> 31 << 15;
  const int e = static_cast<int>((bits >> 23) & 0xff) - 127;
  if (e < -14)
    return static_cast<uint16_t>(sign);
  return static_cast<uint16_t>(sign | static_cast<uint32_t>(e + 15) << 10 |
                               (bits & 0x7fffffu) >> 13);
}
double fromF16(uint16_t half) {
  const int biased = (half >> 10) & 0x1f;
  const double magnitude =
      biased == 0 ? std::ldexp(half & 0x3ff, -24)
                  : std::ldexp(1024 + (half & 0x3ff), biased - 25);
  return half & 0x8000 ? -magnitude : magnitude;
}

/// decodeAttentionKivi with its path chosen by the test.
enum class Path { Dispatch, Tiles };

/// decodeAttentionKivi's prologue, then decodeKiviTiles whatever G is.
template <int G, int D, int kBits, int KG, kvc_dtype_t T, int kThreads>
__global__ void decodeKiviTilesOnly(kvc::cuda::DecodeSplitArgs a,
                                    int32_t residualLength) {
  const int32_t h = blockIdx.x, split = blockIdx.y;
  const kvc::cuda::HeadTable t = a.heads[h];
  const int32_t begin = split * a.splitSlots;
  const int32_t end = min(begin + a.splitSlots, t.numSlots);
  kvc::cuda::decodeKiviTiles<G, D, kBits, KG, T, kThreads>(
      a, t, h, split, begin, end, residualLength);
}

/// The path decodeAttentionKivi takes for a geometry.
template <int G, int D, int kBits, int KG, kvc_dtype_t T>
const char *pathName(Path path) {
  if (path == Path::Tiles ||
      (!kvc::cuda::KiviMma<G, D, kBits, KG, T, kThreads>::kApplies &&
       kvc::cuda::KiviTiles<G, D, kBits, KG, T, kThreads>::kApplies))
    return "tiles";
  return kvc::cuda::KiviMma<G, D, kBits, KG, T, kThreads>::kApplies
             ? "mma"
             : "row groups";
}

/// Code c of a packed row (kBits-bit codes, LSB-first).
template <int kBits> void putCode(uint8_t *row, int c, uint32_t code) {
  const int bit = c * kBits;
  row[bit / 8] |= static_cast<uint8_t>(code << (bit % 8));
}

template <int G, int D, int kBits, int KG, kvc_dtype_t T>
void check(std::mt19937 &rng, Path path = Path::Dispatch,
           int32_t splitSlots = 100, float outlier = 1.0f,
           bool edge = false) {
  constexpr Storage S = kvc::cuda::kKiviFullStorage<T>;
  using Full = kvc::cuda::RowShape<D, S>;
  constexpr uint64_t kRowBytes = D * kBits / 8;
  // A {scale, min} record is two f16 (4 bytes).
  constexpr uint64_t kKeyRecordBytes = 4 * D;
  constexpr uint64_t kValueRecordBytes = 4 * (D / KG);
  constexpr uint32_t kMaxCode = (1u << kBits) - 1;
  static_assert(kPageSize % KG == 0, "pages hold whole key blocks");
  kvc::cuda::PageLayout layout{};
  layout.pages = kvc::cuda::PageDivisor::of(kPageSize);
  layout.keyOffset = 0;
  layout.valueOffset = alignUp(kPageSize * kRowBytes);
  layout.keyParamOffset = alignUp(layout.valueOffset + kPageSize * kRowBytes);
  layout.valueParamOffset = alignUp(layout.keyParamOffset +
                                    kPageSize / KG * kKeyRecordBytes);
  const uint64_t pageBytes =
      alignUp(layout.valueParamOffset + kPageSize * kValueRecordBytes);

  const std::vector<int32_t> slots = {700, 45, 513};
  // Splits of 100 slots by default: not a multiple of any tile, and
  // shorter than a block's tiles (one tile per warp and split); with one
  // split per head, each warp walks many tiles, across pages.
  DecodeBatch batch(G, D, slots, splitSlots);
  const int32_t heads = batch.heads, numSplits = batch.numSplits;

  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<kvc::cuda::HeadTable> tables(heads);
  std::vector<std::vector<uint64_t>> pagesOf(heads);
  // Per head and slot, the key and value the kernel must see (empty: free).
  std::vector<std::vector<std::vector<double>>> keys(heads), values(heads);
  for (int32_t h = 0; h < heads; ++h) {
    const int32_t n = slots[h];
    const int32_t numPages = (n + kPageSize - 1) / kPageSize;
    // The residual region: kResidual key rows, then kResidual value rows.
    auto *residual = static_cast<uint8_t *>(
        batch.alloc(2 * kResidual * Full::kRowBytes));
    std::vector<std::vector<double>> fullRows(2 * kResidual,
                                              std::vector<double>(D));
    for (int32_t r = 0; r < 2 * kResidual; ++r) {
      uint8_t *row = residual + r * Full::kRowBytes;
      for (int c = 0; c < D; ++c)
        kvc::cuda::Codec<S>::store(row, c, 2.0f * u(rng) - 1.0f, 1.0f);
      for (int v = 0; v < Full::kVecs; ++v) {
        uint4 raw;
        std::memcpy(&raw, row + 16 * v, 16);
        float x[Full::kElemsPerVec];
        kvc::cuda::Codec<S>::decode(raw, 1.0f, x);
        for (int e = 0; e < Full::kElemsPerVec; ++e)
          fullRows[r][v * Full::kElemsPerVec + e] = x[e];
      }
    }
    std::vector<uint64_t> pages(numPages);
    std::vector<int32_t> positions(n, KVC_POSITION_NONE), words(n, -1);
    keys[h].resize(n);
    values[h].resize(n);
    for (int32_t p = 0; p < numPages; ++p) {
      if (h == 0 && p == 2)
        continue; // a hole: every slot of the page is free
      auto *page = static_cast<uint8_t *>(batch.alloc(pageBytes));
      pages[p] = reinterpret_cast<uint64_t>(page);
      auto *keyRecords =
          reinterpret_cast<uint16_t *>(page + layout.keyParamOffset);
      for (int32_t i = 0; i < kPageSize / KG * D; ++i) {
        // Outlier channels (c % 16 == 5) have their range times `outlier`.
        const float f = i % D % 16 == 5 ? outlier : 1.0f;
        keyRecords[2 * i] = toF16(f * (0.02f + 0.2f * u(rng))); // scale
        keyRecords[2 * i + 1] = toF16(f * (u(rng) - 0.8f));     // min
        if (edge && i % D == 0)
          keyRecords[2 * i] = toF16(1.0f);
      }
      for (int32_t o = 0; o < kPageSize; ++o) {
        const int32_t s = p * kPageSize + o;
        uint8_t *k = page + layout.keyOffset + o * kRowBytes;
        uint8_t *v = page + layout.valueOffset + o * kRowBytes;
        auto *valueRecord = reinterpret_cast<uint16_t *>(
            page + layout.valueParamOffset + o * kValueRecordBytes);
        std::vector<uint32_t> kc(D), vc(D);
        for (int c = 0; c < D; ++c) {
          kc[c] = static_cast<uint32_t>(rng() % (kMaxCode + 1));
          vc[c] = static_cast<uint32_t>(rng() % (kMaxCode + 1));
          putCode<kBits>(k, c, kc[c]);
          putCode<kBits>(v, c, vc[c]);
        }
        for (int x = 0; x < D / KG; ++x) {
          valueRecord[2 * x] = toF16(0.02f + 0.2f * u(rng));
          valueRecord[2 * x + 1] = toF16(u(rng) - 0.8f);
        }
        // Head 2 as a KIVI cache holds it: every slot live, the window at
        // the end (keys of the newest 72 entries, values of the newest
        // 40), so that most of its tiles are whole blocks of quantized
        // entries.
        const bool dense = h == 2;
        if (s >= n || (!dense && rng() % 5 == 0))
          continue; // past the head, or free
        positions[s] = s;
        // Head 1's keys are all in the window; on heads 0 and 1 one entry
        // in 8 has its key and value there, one in 8 its value only.
        const uint32_t pick = rng() % 8;
        const bool keyFull = dense ? s >= n - 72 : h == 1 || pick == 0;
        const bool valueFull =
            dense ? s >= n - 40 : keyFull ? pick != 1 : pick == 1;
        const int32_t row = static_cast<int32_t>(rng() % kResidual);
        if (keyFull || valueFull)
          words[s] = row | (keyFull ? kvc::cuda::kKiviKeyFull : 0) |
                     (valueFull ? kvc::cuda::kKiviValueFull : 0);
        keys[h][s].resize(D);
        values[h][s].resize(D);
        const uint16_t *keyRecord = keyRecords + o / KG * 2 * D;
        for (int c = 0; c < D; ++c) {
          keys[h][s][c] = keyFull ? fullRows[row][c]
                                  : kc[c] * fromF16(keyRecord[2 * c]) +
                                        fromF16(keyRecord[2 * c + 1]);
          values[h][s][c] =
              valueFull ? fullRows[kResidual + row][c]
                        : vc[c] * fromF16(valueRecord[2 * (c / KG)]) +
                              fromF16(valueRecord[2 * (c / KG) + 1]);
        }
      }
    }
    pagesOf[h] = pages;
    tables[h] = batch.table(pages, positions);
    tables[h].kiviRows = batch.copy(words);
    tables[h].kiviResidual = residual;
  }
  std::vector<float> q(static_cast<size_t>(heads) * G * D);
  for (float &x : q)
    x = 4.0f * u(rng) - 2.0f;
  // `edge`: channel 0's factor q s, the largest of every key block, is the
  // float just below 1 (its scale 1, the query's channel 0 1 - 2^-24), which
  // a fixed-point factor under 1's power of two must not round up to it.
  if (edge)
    for (size_t i = 0; i < q.size(); i += D)
      q[i] = std::nextafter(1.0f, 0.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const kvc::cuda::DecodeSplitArgs args =
      batch.args(tables, layout, q, scale);
  auto launch = [&](const kvc::cuda::DecodeSplitArgs &a) {
    if (path == Path::Tiles)
      decodeKiviTilesOnly<G, D, kBits, KG, T, kThreads>
          <<<dim3(heads, numSplits), kThreads>>>(a, kResidual);
    else
      kvc::cuda::decodeAttentionKivi<G, D, kBits, KG, T, kThreads>
          <<<dim3(heads, numSplits), kThreads>>>(a, kResidual);
  };
  // The emulator logs the L2 prefetches (on a device they leave no trace).
  std::vector<const void *> prefetched;
#if defined(KVC_CUDA_EMULATED)
  kvc::emu::setPrefetchLog(&prefetched);
#endif
  launch(args);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "launch");
#if defined(KVC_CUDA_EMULATED)
  kvc::emu::setPrefetchLog(nullptr);
#endif

  char prefix[144];
  std::snprintf(prefix, sizeof prefix,
                "KIVI int%d G=%d D=%d KG=%d %s (%s, splits of %d%s%s)", kBits,
                G, D, KG, dtypeName(T), pathName<G, D, kBits, KG, T>(path),
                splitSlots, outlier != 1.0f ? ", outlier channels" : "",
                edge ? ", a factor just below 1" : "");
  // The tiles' L2 prefetch (both tile paths): warp w of a split walks the
  // tiles of 32 slots from the w-th on, every fourth, and asks for the
  // lines of each tile after its first that lies in the split on a page:
  // its key and value codes and value records, and its key block's record,
  // each line once; without kIssueAhead also the tile's positions and KIVI
  // words (with it the walk copies those a tile ahead instead).
#if defined(KVC_CUDA_EMULATED)
  if (std::strcmp(pathName<G, D, kBits, KG, T>(path), "row groups") != 0) {
    constexpr int32_t kWarps = kThreads / 32;
    std::vector<const void *> expected;
    auto lines = [&](const uint8_t *at, uint64_t bytes) {
      for (uint64_t b = 0; b < bytes; b += 128)
        expected.push_back(at + b);
    };
    for (int32_t h = 0; h < heads; ++h)
      for (int32_t split = 0; split < numSplits; ++split) {
        const int32_t begin = split * splitSlots;
        const int32_t end = std::min(begin + splitSlots, slots[h]);
        for (int32_t w = 0; w < kWarps; ++w)
          for (int32_t base = begin / 32 * 32 + (w + kWarps) * 32;
               base < end; base += kWarps * 32) {
            const auto *page = reinterpret_cast<const uint8_t *>(
                pagesOf[h][base / kPageSize]);
            if (!page)
              continue;
            const uint64_t o0 = base % kPageSize;
            if (!kvc::cuda::kIssueAhead) {
              expected.push_back(tables[h].positions + base);
              expected.push_back(tables[h].kiviRows + base);
            }
            lines(page + layout.keyOffset + o0 * kRowBytes, 32 * kRowBytes);
            lines(page + layout.valueOffset + o0 * kRowBytes, 32 * kRowBytes);
            lines(page + layout.valueParamOffset + o0 * kValueRecordBytes,
                  32 * kValueRecordBytes);
            lines(page + layout.keyParamOffset + o0 / KG * kKeyRecordBytes,
                  kKeyRecordBytes);
          }
      }
    std::sort(expected.begin(), expected.end());
    std::sort(prefetched.begin(), prefetched.end());
    CHECK(prefetched == expected,
          "%s: the tiles' prefetch asked for %zu lines, %zu expected%s",
          prefix, prefetched.size(), expected.size(),
          prefetched.size() == expected.size() ? " (other lines)" : "");
  }
#endif
  const DecodeErrors errors = batch.check(prefix, keys, values, scale);
  batch.checkWithoutLogits(prefix, args, launch);
  // decodeAttentionKivi ends with the merge in the last block of each head.
  if (path != Path::Tiles)
    batch.checkMergeInLastSplit(prefix, args, tables, launch);
  std::printf("%s: ok (logits within %.2g, outputs within %.2g)\n", prefix,
              errors.logit, errors.output);
}

} // namespace

int main() {
  if (const int skip = skipWithoutDevice("the KIVI decode kernel test"))
    return skip;
  std::mt19937 rng(20261123);
  // Tensor cores (G >= 2) and CUDA-core tiles (G = 1): the bundled
  // policies' geometries (G 1, 3, 8) and G = 4, both code widths, every
  // dtype, blocks of 32 and of 64 tokens.
  check<1, 128, 2, 32, KVC_DTYPE_F16>(rng);
  check<4, 128, 2, 32, KVC_DTYPE_F16>(rng);
  check<4, 128, 4, 32, KVC_DTYPE_BF16>(rng);
  check<8, 128, 2, 32, KVC_DTYPE_BF16>(rng);
  // G > 4: the value sums' columns are the heads (KiviMma::kHeadColumns),
  // all eight or six of them.
  check<8, 128, 2, 32, KVC_DTYPE_F16>(rng, Path::Dispatch, 704);
  check<6, 128, 2, 32, KVC_DTYPE_F16>(rng);
  check<8, 64, 2, 32, KVC_DTYPE_F16>(rng);
  check<8, 64, 4, 32, KVC_DTYPE_BF16>(rng, Path::Dispatch, 100, 8.0f);
  check<3, 64, 2, 32, KVC_DTYPE_F16>(rng);
  check<1, 64, 4, 32, KVC_DTYPE_F32>(rng);
  check<2, 64, 2, 64, KVC_DTYPE_F32>(rng);
  check<2, 32, 4, 32, KVC_DTYPE_F16>(rng);
  // The CUDA-core tiles at head dim 32: one value group, two pairs of
  // slots per value lane.
  check<1, 32, 2, 32, KVC_DTYPE_F16>(rng);
  check<1, 32, 4, 32, KVC_DTYPE_BF16>(rng);
  // One split per head: a warp's tiles in turn (the page read a tile
  // ahead, the running maximum across tiles), every path.
  check<4, 128, 2, 32, KVC_DTYPE_F16>(rng, Path::Dispatch, 704);
  check<1, 64, 4, 32, KVC_DTYPE_BF16>(rng, Path::Dispatch, 704);
  check<4, 64, 4, 32, KVC_DTYPE_F16>(rng, Path::Tiles, 704);
  check<2, 64, 2, 16, KVC_DTYPE_F32>(rng, Path::Dispatch, 704);
  // Outlier key channels (one in 16 with 8 times the range, as KIVI's
  // per-channel keys expect): the tensor-core tiles' fixed point takes its
  // unit from the block's largest scale, so the other channels' factors
  // keep fewer bits; the logits still within the reference's 2e-5.
  check<4, 128, 2, 32, KVC_DTYPE_F16>(rng, Path::Dispatch, 100, 8.0f);
  check<8, 128, 4, 32, KVC_DTYPE_BF16>(rng, Path::Dispatch, 100, 8.0f);
  check<4, 128, 2, 32, KVC_DTYPE_F16>(rng, Path::Tiles, 100, 8.0f);
  check<1, 128, 2, 32, KVC_DTYPE_F16>(rng, Path::Dispatch, 100, 8.0f);
  check<1, 64, 4, 32, KVC_DTYPE_BF16>(rng, Path::Dispatch, 100, 8.0f);
  // The G = 1 tensor-core keys' other forms: head dim 256 (int2 whose key
  // sums take two floats), key blocks of 64 tokens.
  check<1, 256, 2, 32, KVC_DTYPE_F16>(rng);
  check<1, 64, 2, 64, KVC_DTYPE_BF16>(rng, Path::Dispatch, 704);
  // A block's largest key factor just below a power of two: the G = 1
  // tiles' fixed-point keys (KiviTiles::kKeyMma) and the tensor-core tiles.
  check<1, 128, 2, 32, KVC_DTYPE_F16>(rng, Path::Dispatch, 100, 1.0f, true);
  check<1, 64, 4, 32, KVC_DTYPE_F32>(rng, Path::Dispatch, 704, 1.0f, true);
  check<4, 128, 2, 32, KVC_DTYPE_F16>(rng, Path::Dispatch, 100, 1.0f, true);
  // CUDA-core tiles where the tensor cores would go.
  check<4, 128, 2, 32, KVC_DTYPE_F16>(rng, Path::Tiles);
  check<8, 64, 4, 64, KVC_DTYPE_BF16>(rng, Path::Tiles);
  // Row groups: blocks of 16 tokens, and 16 query heads.
  check<4, 64, 2, 16, KVC_DTYPE_F16>(rng);
  check<1, 128, 4, 16, KVC_DTYPE_BF16>(rng);
  check<16, 64, 2, 32, KVC_DTYPE_F16>(rng);
  std::printf("KIVI decode kernel: ok\n");
  return 0;
}
