//===- OneVictimTest.cu - The decode selection settled from fold blocks ---===//
//
// summarizeSelection (one block per split of a head's slots, as the decode
// fold kernel runs it) and takeOneVictim (the stages kernel's check), run
// on the emulator and followed, when the check does not settle the step,
// by the stages' full selection (protect, selectVictims, compactIndices,
// clearEvicted). The victim list and the cleared device tables are compared
// with a host reference computed from the definitions: kvc.protect's
// `sinks` oldest and `recent` newest live entries score +infinity, and the
// live - budget smallest keys (score, position; ties in slot order) go.
//
// Each case also states whether the check must settle the step: no victim
// (the live entries fit the budget), or one victim when the guessed
// protection (sinks at positions 0 .. sinks - 1, recent entries up to the
// query's position) is exact. It must not settle two victims, positions
// that do not start at 0 under sinks, or a hole in the recent window.
// Exits 1 on the first difference.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_cuda.cuh"
#include "test/cudaemu/EmuCheck.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kStageThreads = 512;

/// What a fold block of the generated decodeFold does for a selection of
/// the score state under kvc.protect.
__global__ void __launch_bounds__(kvc::cuda::kFoldThreads, kvc::cuda::kFoldBlocksPerSM)
    foldSummaries(kvc::cuda::HeadTable t, int32_t slotsPerSplit,
                  int32_t sinks, int32_t recent, bool tieRecent,
                  kvc::cuda::SelectionSummary *summaries) {
  const kvc::cuda::SlotRange r =
      kvc::cuda::foldRange(t.numSlots, slotsPerSplit, blockIdx.y);
  kvc::cuda::summarizeSelection<kvc::cuda::kFoldThreads>(
      t.positions, r,
      kvc::cuda::guessProtection(sinks, recent, t.queryPosition), tieRecent,
      [&](int32_t i) { return t.state[i]; }, &summaries[blockIdx.y]);
}

/// What a fold block of the generated decodeFold does for H2O's selection:
/// the fold of the step's weights into the score state (here one query
/// head, M = 0 and Z = 1, so a slot's weight is e^logit; decay 0, so its
/// new state is that weight), summarized in the same pass (SelectionScan).
__global__ void __launch_bounds__(kvc::cuda::kFoldThreads, kvc::cuda::kFoldBlocksPerSM)
    foldScanned(kvc::cuda::HeadTable t, int32_t slotsPerSplit,
                const float *logits, int32_t sinks, int32_t recent,
                bool tieRecent, kvc::cuda::SelectionSummary *summaries) {
  const kvc::cuda::SlotRange r =
      kvc::cuda::foldRange(t.numSlots, slotsPerSplit, blockIdx.y);
  __shared__ float maxLogit[1], invSum[1];
  if (threadIdx.x == 0) {
    maxLogit[0] = 0.0f;
    invSum[0] = 1.0f;
  }
  __syncthreads();
  kvc::cuda::SelectionScan scan(
      kvc::cuda::guessProtection(sinks, recent, t.queryPosition), tieRecent);
  kvc::cuda::foldAccumulated<1, kvc::cuda::kFoldThreads>(
      t.positions, t.state, r, logits, t.numSlots, maxLogit, invSum, 0.0f,
      kvc::cuda::Reduce::Sum,
      [&](int32_t i, int32_t at) { scan.add(i, at, t.state[i]); });
  scan.summarize<kvc::cuda::kFoldThreads>(r, &summaries[blockIdx.y]);
}

/// What the generated decodeStages does: the check, then the full stages.
__global__ void __launch_bounds__(kStageThreads)
    stages(kvc::cuda::HeadTable t, const kvc::cuda::SelectionSummary *summaries,
           int32_t numSplits, int64_t budget, int32_t sinks, int32_t recent,
           bool tieRecent, float *s0, float *s1, uint8_t *victim,
           int32_t *settled) {
  const int32_t n = t.numSlots;
  const bool done = kvc::cuda::takeOneVictim<kStageThreads>(
      t, summaries, numSplits, budget,
      kvc::cuda::guessProtection(sinks, recent, t.queryPosition));
  if (threadIdx.x == 0)
    *settled = done;
  if (done)
    return;
  for (int32_t i = threadIdx.x; i < n; i += kStageThreads)
    s0[i] = t.positions[i] == KVC_POSITION_NONE ? kvc::cuda::kNegInf
                                                : t.state[i];
  __syncthreads();
  kvc::cuda::protect<kStageThreads>(s0, t.positions, n, sinks, recent, s1);
  kvc::cuda::selectVictims<kStageThreads>(s1, t.positions, n, budget,
                                          tieRecent, victim);
  kvc::cuda::compactIndices<kStageThreads>(
      n, [&](int32_t i) { return victim[i] != 0; }, t.victims + 1, t.victims);
  kvc::cuda::clearEvicted<kStageThreads>(t, victim, n);
}

struct Case {
  const char *name;
  std::vector<int32_t> positions; ///< Per slot; KVC_POSITION_NONE when free.
  std::vector<float> state;
  int32_t queryPosition;
  int64_t budget;
  int32_t sinks, recent;
  bool tieRecent;
  int32_t slotsPerSplit;
  bool mustSettle; ///< The check settles the step (false: it must not).
};

/// The victims by the definitions, in ascending slot order.
std::vector<int32_t> referenceVictims(const Case &c) {
  const int32_t n = static_cast<int32_t>(c.positions.size());
  std::vector<int32_t> live;
  for (int32_t i = 0; i < n; ++i)
    if (c.positions[i] != KVC_POSITION_NONE)
      live.push_back(i);
  std::vector<double> score(n);
  for (int32_t i : live)
    score[i] = c.state[i];
  // Protection by position rank (kvc.protect: cuts at the sinks-th oldest and
  // the recent-th newest position, every entry at or beyond a cut).
  std::vector<int32_t> byPosition(live);
  std::sort(byPosition.begin(), byPosition.end(), [&](int32_t a, int32_t b) {
    return c.positions[a] < c.positions[b];
  });
  const int32_t m = static_cast<int32_t>(live.size());
  if (m > 0) {
    const int64_t low =
        c.sinks > 0 ? c.positions[byPosition[std::min(c.sinks, m) - 1]] : -1;
    const int64_t high =
        c.recent > 0 ? c.positions[byPosition[m - std::min(c.recent, m)]]
                     : INT64_MAX;
    for (int32_t i : live)
      if (c.positions[i] <= low || c.positions[i] >= high)
        score[i] = HUGE_VAL;
  }
  const int64_t drop = m > c.budget ? m - c.budget : 0;
  std::vector<int32_t> order(live);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (score[a] != score[b])
      return score[a] < score[b];
    if (c.positions[a] != c.positions[b])
      return c.tieRecent ? c.positions[a] < c.positions[b]
                         : c.positions[a] > c.positions[b];
    return a < b;
  });
  std::vector<int32_t> victims(order.begin(), order.begin() + drop);
  std::sort(victims.begin(), victims.end());
  return victims;
}

/// Checks the case with the summaries of summarizeSelection or, when
/// `logits` is not empty, of a fold that writes the case's state from them
/// (foldScanned) over a state that held other values: the summaries must
/// then be summarizeSelection's over the new state, which the selection
/// must have read (the old state would rank the slots otherwise).
void check(const Case &c, const std::vector<float> &logits = {}) {
  const int32_t n = static_cast<int32_t>(c.positions.size());
  const bool scanned = !logits.empty();
  const int32_t numSplits =
      std::max(1, (n + c.slotsPerSplit - 1) / c.slotsPerSplit) + 1;
  std::vector<uint64_t> history(n);
  for (int32_t i = 0; i < n; ++i)
    history[i] = 0x9e3779b97f4a7c15ull * (i + 1);
  kvc::cuda::HeadTable t{};
  t.positions = upload(c.positions);
  std::vector<float> before(c.state);
  if (scanned)
    for (int32_t i = 0; i < n; ++i)
      if (c.positions[i] != KVC_POSITION_NONE)
        before[i] = 1.0f - c.state[i];
  t.state = upload(before);
  t.history = upload(history);
  t.numSlots = n;
  t.queryPosition = c.queryPosition;
  t.victims = upload(std::vector<int32_t>(n + 1, -7));
  kvc::cuda::SelectionSummary *summaries =
      upload(std::vector<kvc::cuda::SelectionSummary>(numSplits));
  float *s0 = upload(std::vector<float>(n));
  float *s1 = upload(std::vector<float>(n));
  uint8_t *victim = upload(std::vector<uint8_t>(n));
  int32_t *settled = upload(std::vector<int32_t>{-1});

  // One split more than the head needs: its block covers no slot.
  if (scanned) {
    float *logitRow = upload(logits);
    foldScanned<<<dim3(1, numSplits), kvc::cuda::kFoldThreads>>>(
        t, c.slotsPerSplit, logitRow, c.sinks, c.recent, c.tieRecent,
        summaries);
    // summarizeSelection over the state the fold wrote.
    kvc::cuda::SelectionSummary *separate =
        upload(std::vector<kvc::cuda::SelectionSummary>(numSplits));
    foldSummaries<<<dim3(1, numSplits), kvc::cuda::kFoldThreads>>>(
        t, c.slotsPerSplit, c.sinks, c.recent, c.tieRecent, separate);
    const auto got = download(summaries, numSplits),
               want = download(separate, numSplits);
    for (int32_t j = 0; j < numSplits; ++j)
      CHECK(got[j].key == want[j].key && got[j].slot == want[j].slot &&
                got[j].live == want[j].live &&
                got[j].sinks == want[j].sinks &&
                got[j].recent == want[j].recent,
            "%s, scanned in the fold: split %d's summary (slot %d, %d live, "
            "%d sinks, %d recent), summarizeSelection's (slot %d, %d, %d, "
            "%d)",
            c.name, j, got[j].slot, got[j].live, got[j].sinks,
            got[j].recent, want[j].slot, want[j].live, want[j].sinks,
            want[j].recent);
    cudaFree(logitRow);
    cudaFree(separate);
  } else {
    foldSummaries<<<dim3(1, numSplits), kvc::cuda::kFoldThreads>>>(
        t, c.slotsPerSplit, c.sinks, c.recent, c.tieRecent, summaries);
  }
  stages<<<1, kStageThreads>>>(t, summaries, numSplits, c.budget, c.sinks,
                               c.recent, c.tieRecent, s0, s1, victim, settled);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "%s: launch", c.name);

  const bool gotSettled = download(settled, 1)[0] != 0;
  CHECK(gotSettled == c.mustSettle, "%s: the check %s the step", c.name,
        gotSettled ? "settled" : "did not settle");
  const std::vector<int32_t> want = referenceVictims(c);
  const std::vector<int32_t> list = download(t.victims, n + 1);
  CHECK(list[0] == static_cast<int32_t>(want.size()),
        "%s: %d victims, want %zu", c.name, list[0], want.size());
  for (size_t j = 0; j < want.size(); ++j)
    CHECK(list[1 + j] == want[j], "%s: victim %zu is slot %d, want %d",
          c.name, j, list[1 + j], want[j]);
  const std::vector<int32_t> positions = download(t.positions, n);
  const std::vector<float> state = download(t.state, n);
  const std::vector<uint64_t> bits = download(t.history, n);
  for (int32_t i = 0; i < n; ++i) {
    const bool gone = std::binary_search(want.begin(), want.end(), i);
    CHECK(positions[i] == (gone ? KVC_POSITION_NONE : c.positions[i]),
          "%s: slot %d position %d", c.name, i, positions[i]);
    CHECK(state[i] == (gone ? 0.0f : c.state[i]), "%s: slot %d state %g",
          c.name, i, state[i]);
    CHECK(bits[i] == (gone ? 0 : history[i]), "%s: slot %d history", c.name,
          i);
  }
  cudaFree(t.positions);
  cudaFree(t.state);
  cudaFree(t.history);
  cudaFree(t.victims);
  cudaFree(summaries);
  cudaFree(s0);
  cudaFree(s1);
  cudaFree(victim);
  cudaFree(settled);
}

/// A head in the middle of a decode: positions 0 .. count - 1 (the query's
/// the newest) in shuffled slots, `holes` of them evicted (outside the sinks
/// and the recent window; count > 80 when there are holes), free slots in
/// between, scores from `levels` distinct values
/// (few levels: many ties).
Case decoded(const char *name, std::mt19937 &rng, int32_t count,
             int32_t holes, int32_t freeSlots, int levels) {
  Case c{name, {}, {}, count - 1, 0, 4, 64, true, 256, true};
  std::vector<int32_t> positions(count);
  std::iota(positions.begin(), positions.end(), 0);
  for (int32_t j = 0; j < holes; ++j)
    positions[8 + rng() % (count - 80)] = KVC_POSITION_NONE;
  positions.insert(positions.end(), freeSlots, KVC_POSITION_NONE);
  std::shuffle(positions.begin(), positions.end(), rng);
  c.positions = positions;
  c.state.resize(positions.size());
  for (float &s : c.state)
    s = static_cast<float>(rng() % levels) / levels;
  return c;
}

int32_t liveCount(const Case &c) {
  return static_cast<int32_t>(std::count_if(
      c.positions.begin(), c.positions.end(),
      [](int32_t p) { return p != KVC_POSITION_NONE; }));
}

} // namespace

int main() {
  std::mt19937 rng(20261122);
  std::vector<Case> cases;
  for (int levels : {1000000, 3}) {
    for (bool tieRecent : {true, false}) {
      Case one = decoded(levels > 3 ? "one victim" : "one victim, ties", rng,
                         3000, 40, 130, levels);
      one.tieRecent = tieRecent;
      one.budget = liveCount(one) - 1;
      cases.push_back(one);
    }
    Case none = decoded("no victim", rng, 3000, 40, 130, levels);
    none.budget = liveCount(none);
    cases.push_back(none);
    Case two = decoded("two victims", rng, 3000, 40, 130, levels);
    two.budget = liveCount(two) - 2;
    two.mustSettle = false;
    cases.push_back(two);
  }
  // The live entries all protected: the victim is the oldest entry.
  {
    Case c = decoded("every entry protected", rng, 60, 0, 5, 100);
    c.budget = liveCount(c) - 1;
    cases.push_back(c);
  }
  // Fewer slots than a split, and splits of 256 over a head of 257 slots.
  {
    Case c = decoded("one split", rng, 150, 3, 10, 1000);
    c.slotsPerSplit = 512;
    c.budget = liveCount(c) - 1;
    cases.push_back(c);
    Case d = decoded("a split of one slot", rng, 250, 3, 7, 1000);
    d.budget = liveCount(d) - 1;
    cases.push_back(d);
  }
  // Splits of 3000 slots (3130 in all): each thread takes several passes
  // of kSummaryUnroll slots (the lowest slot of a key still wins).
  for (int levels : {1000000, 3}) {
    Case c = decoded(levels > 3 ? "splits of 3000 slots"
                                : "splits of 3000 slots, ties",
                     rng, 3000, 40, 130, levels);
    c.slotsPerSplit = 3000;
    c.budget = liveCount(c) - 1;
    cases.push_back(c);
  }
  // No kvc.protect: nothing to guess.
  {
    Case c = decoded("no protection", rng, 2000, 10, 50, 1000);
    c.sinks = c.recent = 0;
    c.budget = liveCount(c) - 1;
    cases.push_back(c);
  }
  // Positions from 1000 on: the sinks are not positions 0 .. 3.
  {
    Case c = decoded("positions from 1000", rng, 2000, 10, 50, 1000);
    for (int32_t &p : c.positions)
      if (p != KVC_POSITION_NONE)
        p += 1000;
    c.queryPosition += 1000;
    c.budget = liveCount(c) - 1;
    c.mustSettle = false;
    cases.push_back(c);
    c.name = "positions from 1000, no sinks";
    c.sinks = 0;
    c.mustSettle = true;
    cases.push_back(c);
  }
  // A hole in the recent window: the 64 newest reach further back.
  {
    Case c = decoded("a hole in the recent window", rng, 2000, 10, 50, 1000);
    *std::find(c.positions.begin(), c.positions.end(), c.queryPosition - 5) =
        KVC_POSITION_NONE;
    c.budget = liveCount(c) - 1;
    c.mustSettle = false;
    cases.push_back(c);
  }
  for (const Case &c : cases)
    check(c);
  // The same cases with the summaries taken in the fold's pass: the state
  // becomes e^logit (logits from a few levels where the case has ties, so
  // that the new scores tie too; a free slot's logit is -infinity).
  for (Case c : cases) {
    const int32_t n = static_cast<int32_t>(c.positions.size());
    std::vector<float> logits(n, kvc::cuda::kNegInf);
    const bool ties = c.name == std::string("one victim, ties") ||
                      c.name == std::string("splits of 3000 slots, ties");
    for (int32_t i = 0; i < n; ++i)
      if (c.positions[i] != KVC_POSITION_NONE) {
        logits[i] = -static_cast<float>(rng() % (ties ? 3 : 100000)) / 997.0f;
        c.state[i] = std::exp(logits[i]);
      }
    check(c, logits);
  }
  std::printf("one victim: %zu cases ok, in the fold's pass too\n",
              cases.size());
  return 0;
}
