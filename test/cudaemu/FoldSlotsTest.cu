//===- FoldSlotsTest.cu - The decode fold's per-slot statistics ----------===//
//
// The slot work of the generated decodeFold kernel (runtime/kvc_cuda.cuh),
// run on the emulator for G = 1, 4 and 8 and checked against host
// references computed here from the definitions, with M and 1/Z given:
//  - foldAccumulated (state <- decay * state + reduce_g p_g, sum, mean and
//    max), foldPersistence (bits <- bits << 1 | (reduce_g p_g > threshold)),
//    foldWindowSum (state <- state, or 0 at a restart, + mean_g p_g) on the
//    live slots only, and writeProbabilities (p_g = e^(l_g - M_g) / Z_g, 0
//    for a free slot's logit -infinity) on every slot of the range; slots
//    past the head's numSlots and the rows' padding keep their sentinel.
//    Heads of 3001 slots in one block (several passes of foldUnroll<G>()
//    slots per thread at every G), in splits of 513 and 256, and of 100
//    slots in one split;
//  - forSlotLines (the lines prefetchSlotLines asks L2 for): over every
//    thread of a block, each 128-byte line of the range's elements of each
//    array row is named exactly once, by an address inside the range; none
//    for an empty range or a null array.
// Float results within a relative 1e-6 of the reference (the device code
// and the reference are the same float expressions; a compiler may contract
// a multiply-add differently); a persistence bit may differ only where the
// reference weight lies within 1e-6 of the threshold. Exits 1 on the first
// difference.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_cuda.cuh"
#include "test/cudaemu/EmuCheck.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <tuple>
#include <vector>

namespace {

constexpr int kThreads = kvc::cuda::kFoldThreads;

/// The slot work of a fold block over the range foldRange gives it, with
/// the merged M and 1/Z of the G query heads taken from `maxIn`, `invIn`.
template <int G>
__global__ void __launch_bounds__(kThreads)
    foldBlock(const int32_t *positions, float *state, uint64_t *bits,
              float *window, const float *logits, float *probs, int64_t stride,
              int32_t numSlots, int32_t slotsPerSplit, const float *maxIn,
              const float *invIn, float decay, float threshold,
              kvc::cuda::Reduce kind, bool restart) {
  __shared__ float maxLogit[G], invSum[G];
  if (threadIdx.x < G) {
    maxLogit[threadIdx.x] = maxIn[threadIdx.x];
    invSum[threadIdx.x] = invIn[threadIdx.x];
  }
  __syncthreads();
  const kvc::cuda::SlotRange r = kvc::cuda::foldRange(numSlots, slotsPerSplit);
  kvc::cuda::foldAccumulated<G, kThreads>(positions, state, r, logits, stride,
                                          maxLogit, invSum, decay, kind);
  kvc::cuda::foldPersistence<G, kThreads>(positions, bits, r, logits, stride,
                                          maxLogit, invSum, threshold, kind);
  kvc::cuda::foldWindowSum<G, kThreads>(positions, window, r, logits, stride,
                                        maxLogit, invSum, restart);
  kvc::cuda::writeProbabilities<G, kThreads>(logits, stride, r, maxLogit,
                                             invSum, probs);
}

/// Each thread's lines of forSlotLines over positions, state, `rows` logit
/// rows and a null array: out[thread * perThread + k], counts[thread].
__global__ void __launch_bounds__(kThreads)
    slotLines(int32_t first, int32_t last, const int32_t *positions,
              const float *state, const float *logits, int32_t rows,
              int64_t stride, uintptr_t *out, int32_t perThread,
              int32_t *counts) {
  int32_t count = 0;
  kvc::cuda::forSlotLines<kThreads>(
      kvc::cuda::SlotRange{first, last},
      {kvc::cuda::slotArray(positions), kvc::cuda::slotArray(state),
       kvc::cuda::slotArray(static_cast<const uint64_t *>(nullptr)),
       kvc::cuda::slotArray(logits, rows, stride)},
      [&](const char *address) {
        if (count < perThread)
          out[threadIdx.x * perThread + count] =
              reinterpret_cast<uintptr_t>(address);
        ++count;
      });
  counts[threadIdx.x] = count;
}

bool near(float got, float want) {
  return std::fabs(got - want) <= 1e-6f * std::max(1.0f, std::fabs(want));
}

template <int G>
void checkFold(std::mt19937 &rng, int32_t numSlots, int32_t slotsPerSplit,
               kvc::cuda::Reduce kind, bool restart) {
  // Rows `stride` apart with padding, and slots past numSlots, that no
  // helper may touch.
  const int32_t capacity = numSlots + 19;
  const int64_t stride = capacity + 37;
  const float kSentinel = -12345.0f;
  std::uniform_real_distribution<float> logit(-8.0f, 2.0f), unit(0.0f, 1.0f);
  std::vector<int32_t> positions(capacity, KVC_POSITION_NONE);
  std::vector<float> state(capacity), window(capacity);
  std::vector<uint64_t> bits(capacity);
  std::vector<float> logits(G * stride, kSentinel);
  for (int32_t s = 0; s < capacity; ++s) {
    if (s < numSlots && rng() % 5 != 0)
      positions[s] = s;
    state[s] = unit(rng);
    window[s] = unit(rng);
    bits[s] = 0x9e3779b97f4a7c15ull * (s + 1);
    if (s < numSlots)
      for (int g = 0; g < G; ++g)
        logits[g * stride + s] = positions[s] == KVC_POSITION_NONE
                                     ? kvc::cuda::kNegInf
                                     : logit(rng);
  }
  std::vector<float> maxLogit(G), invSum(G);
  for (int g = 0; g < G; ++g) {
    maxLogit[g] = 2.0f + unit(rng);
    invSum[g] = 1.0f / (1.0f + 50.0f * unit(rng));
  }
  const float decay = 0.9f;
  // A threshold near the middle of the weights the slots get.
  const float threshold = 0.002f;

  const int32_t splits = (numSlots + slotsPerSplit - 1) / slotsPerSplit;
  int32_t *dPositions = upload(positions);
  float *dState = upload(state), *dWindow = upload(window);
  uint64_t *dBits = upload(bits);
  float *dLogits = upload(logits);
  float *dProbs = upload(std::vector<float>(G * stride, kSentinel));
  float *dMax = upload(maxLogit), *dInv = upload(invSum);
  foldBlock<G><<<dim3(1, splits), kThreads>>>(
      dPositions, dState, dBits, dWindow, dLogits, dProbs, stride, numSlots,
      slotsPerSplit, dMax, dInv, decay, threshold, kind, restart);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "foldBlock");
  const std::vector<float> gotState = download(dState, capacity);
  const std::vector<float> gotWindow = download(dWindow, capacity);
  const std::vector<uint64_t> gotBits = download(dBits, capacity);
  const std::vector<float> gotProbs = download(dProbs, G * stride);

  for (int32_t s = 0; s < capacity; ++s) {
    char what[80];
    std::snprintf(what, sizeof what, "G %d, %d slots, splits of %d, slot %d",
                  G, numSlots, slotsPerSplit, s);
    float p[G];
    for (int g = 0; g < G; ++g) {
      const float l = s < numSlots ? logits[g * stride + s] : kSentinel;
      p[g] = l == kvc::cuda::kNegInf
                 ? 0.0f
                 : std::exp(l - maxLogit[g]) * invSum[g];
    }
    for (int g = 0; g < G; ++g) {
      const float want = s < numSlots ? p[g] : kSentinel;
      CHECK(near(gotProbs[g * stride + s], want),
            "probability of head %d: %g, want %g; %s", g,
            gotProbs[g * stride + s], want, what);
    }
    float reduced = kind == kvc::cuda::Reduce::Max ? kvc::cuda::kNegInf : 0.0f,
          mean = 0.0f;
    for (int g = 0; g < G; ++g) {
      reduced = kind == kvc::cuda::Reduce::Max ? std::max(reduced, p[g])
                                               : reduced + p[g];
      mean += p[g];
    }
    if (kind == kvc::cuda::Reduce::Mean)
      reduced /= G;
    mean /= G;
    const bool live = positions[s] != KVC_POSITION_NONE;
    const float wantState = live ? decay * state[s] + reduced : state[s];
    const float wantWindow =
        live ? (restart ? 0.0f : window[s]) + mean : window[s];
    const uint64_t wantBits =
        live ? bits[s] << 1 | (reduced > threshold ? 1u : 0u) : bits[s];
    CHECK(near(gotState[s], wantState), "state %g, want %g; %s", gotState[s],
          wantState, what);
    CHECK(near(gotWindow[s], wantWindow), "window sum %g, want %g; %s",
          gotWindow[s], wantWindow, what);
    CHECK(gotBits[s] == wantBits ||
              (live && std::fabs(reduced - threshold) < 1e-6f &&
               (gotBits[s] ^ wantBits) == 1),
          "bits %llx, want %llx; %s",
          static_cast<unsigned long long>(gotBits[s]),
          static_cast<unsigned long long>(wantBits), what);
  }
  for (int g = 0; g < G; ++g)
    for (int64_t s = capacity; s < stride; ++s)
      CHECK(gotProbs[g * stride + s] == kSentinel,
            "row padding of head %d written at %lld", g,
            static_cast<long long>(s));
  for (void *d : {static_cast<void *>(dPositions), static_cast<void *>(dState),
                  static_cast<void *>(dWindow), static_cast<void *>(dBits),
                  static_cast<void *>(dLogits), static_cast<void *>(dProbs),
                  static_cast<void *>(dMax), static_cast<void *>(dInv)})
    cudaFree(d);
}

/// The lines of [first, last) of each row, as forSlotLines must name them.
void addLines(std::vector<uintptr_t> &want, const void *base, int32_t bytes,
              int64_t rowStart, int32_t first, int32_t last) {
  if (last <= first)
    return;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(base) +
                       (rowStart + first) * static_cast<uintptr_t>(bytes);
  const uintptr_t hi = reinterpret_cast<uintptr_t>(base) +
                       (rowStart + last) * static_cast<uintptr_t>(bytes) - 1;
  want.push_back(lo);
  for (uintptr_t line = lo / 128 + 1; line <= hi / 128; ++line)
    want.push_back(line * 128);
}

void checkLines(int32_t first, int32_t last, int32_t rows) {
  const int32_t capacity = 5000;
  const int64_t stride = capacity + 13;
  int32_t *positions = upload(std::vector<int32_t>(capacity));
  float *state = upload(std::vector<float>(capacity));
  float *logits = upload(std::vector<float>(rows * stride));
  const int32_t perThread = 64;
  uintptr_t *out = upload(std::vector<uintptr_t>(kThreads * perThread));
  int32_t *counts = upload(std::vector<int32_t>(kThreads));
  slotLines<<<1, kThreads>>>(first, last, positions, state, logits, rows,
                             stride, out, perThread, counts);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "slotLines");
  const std::vector<uintptr_t> got = download(out, kThreads * perThread);
  const std::vector<int32_t> gotCounts = download(counts, kThreads);

  std::vector<uintptr_t> want;
  addLines(want, positions, 4, 0, first, last);
  addLines(want, state, 4, 0, first, last);
  for (int32_t row = 0; row < rows; ++row)
    addLines(want, logits, 4, row * stride, first, last);
  std::vector<uintptr_t> named;
  for (int t = 0; t < kThreads; ++t) {
    CHECK(gotCounts[t] <= perThread, "thread %d named %d lines", t,
          gotCounts[t]);
    named.insert(named.end(), got.begin() + t * perThread,
                 got.begin() + t * perThread + gotCounts[t]);
  }
  // The threads share the lines evenly (they take them in turn).
  const auto [fewest, most] =
      std::minmax_element(gotCounts.begin(), gotCounts.end());
  CHECK(*most - *fewest <= 1, "lines per thread from %d to %d", *fewest,
        *most);
  std::sort(named.begin(), named.end());
  std::sort(want.begin(), want.end());
  CHECK(named == want,
        "slots [%d, %d), %d logit rows: %zu lines named, %zu expected", first,
        last, rows, named.size(), want.size());
  for (void *d : {static_cast<void *>(positions), static_cast<void *>(state),
                  static_cast<void *>(logits), static_cast<void *>(out),
                  static_cast<void *>(counts)})
    cudaFree(d);
}

} // namespace

int main() {
  std::mt19937 rng(20261127);
  int cases = 0;
  for (kvc::cuda::Reduce kind :
       {kvc::cuda::Reduce::Sum, kvc::cuda::Reduce::Mean,
        kvc::cuda::Reduce::Max}) {
    for (const auto &[numSlots, slotsPerSplit, restart] :
         {std::tuple{3001, 3001, false}, std::tuple{3001, 513, true},
          std::tuple{3001, 256, false}, std::tuple{100, 256, true}}) {
      checkFold<1>(rng, numSlots, slotsPerSplit, kind, restart);
      checkFold<4>(rng, numSlots, slotsPerSplit, kind, restart);
      checkFold<8>(rng, numSlots, slotsPerSplit, kind, restart);
      cases += 3;
    }
  }
  for (const auto &[first, last, rows] :
       {std::tuple{0, 513, 4}, std::tuple{5, 518, 8}, std::tuple{37, 38, 1},
        std::tuple{1000, 4000, 8}, std::tuple{100, 100, 4},
        std::tuple{3, 33, 0}}) {
    checkLines(first, last, rows);
    ++cases;
  }
  std::printf("fold slots: %d cases ok\n", cases);
  return 0;
}
