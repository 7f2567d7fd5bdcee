//===- DeviceTablesTest.cu - Device-resident slot tables on the emulator --===//
//
// kvc::cuda::DeviceTables against the runtime's host bookkeeping, over a
// long randomized decode of two sequences: appends that grow the page
// tables past a mirror's capacity, evictions of single entries and of whole
// pages (holes in the page table, trailing ones trimmed, then mapped again
// by later appends), and score state and importance bits that a stand-in
// for the stages kernel updates on the device; the words that change the
// tables go up through a region of three words, in chunks. The stand-in
// also clears the step's victims and leaves them in the mirrors' victim
// lists of the step's buffer, which the runtime evicts only when the step
// after next checks the mirrors out (the next step on a KIVI pool), or a
// metadata read settles them. After every step the mirrors (detached for
// the look, so nothing is settled) must hold the runtime's page addresses
// exactly and its positions but for the victims of the step and, on a
// full-precision pool, of the step before (unless a read settled them),
// which must be cleared on the device and listed, each step's in its own
// buffer and the step's in its download too; so a long list that the
// runtime reads from the device must survive the next step. Every few
// steps the state is read through kvc_get_metadata, which must evict every
// pending victim and write the device's state back (the runtime settles
// the attachment), and must equal a host model of it. The run is made
// twice: on a full-precision pool, and on a KIVI pool (residual window of 8,
// groups of 4), whose mirrors must also hold every slot's window word as
// the runtime's window and formats give it, through values and blocks of
// keys leaving the window and window entries evicted. A mirror that its
// page tables outgrow is moved into a larger region on the device, pending
// victims, state and all (checked by the steps and reads after it). A third
// run serves a batch that sequences join and leave every other step: no
// synchronizing allocation or free after the first steps, pinned victim
// rows reused, and a released mirror's memory kept until its last step has
// finished (events held unfinished by the emulator). On the full-precision
// pool every third step stores its new rows with storeAppended, which must
// write them into the pages the HeadTables name and write the step's last
// chunk of words, and every third step from the next one does so as a
// planned run (launchPlannedStores), which reads the chunk's count on the
// device from the header word that the upload put before it (two words
// of the region's three a chunk); every other step's victim rows reach the
// host from the
// stand-in stages (publishVictims) rather than from checkIn's download.
// A step whose words were left to stores that never ran must fail its
// check-in. Exits 1 on the first difference.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_cuda.cuh"
#include "test/cudaemu/EmuCheck.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kHeads = 2;
constexpr int kBatch = 2;
constexpr int kPageSize = 4;
constexpr int kPrompt = 10;
constexpr int kSteps = 80;
constexpr int kThreads = 64;
constexpr int64_t kStride = 1024;

/// The smallest and largest capacity (pages) of the mirrors seen.
int minCapacity = 1 << 30, maxCapacity = 0;
/// Per sequence, the capacity of the mirror seen after the last step (0
/// after a write-back), and how often a step rebuilt it larger (it outgrew
/// its capacity).
int lastCapacity[2] = {};
int growths = 0;
/// KIVI run: steps whose appends quantized a block of keys on tables the
/// device kept, and victims that were in a residual window.
int keyBlocks = 0, windowVictims = 0;

/// The event of the last step, as the batch's first mirror holds it.
const kvc::cuda::StepEvent *batchEvent = nullptr;

/// The word HeadTable::kiviRows must hold for slot s of a KIVI head, from
/// the runtime's window and formats: -1 unless the slot is in the window
/// with a part in full precision, else its row and kKiviKeyFull /
/// kKiviValueFull.
int32_t expectedKiviWord(const kvc_kivi_work_t &work, const kvc_metadata_t &m,
                         int32_t s) {
  for (int32_t r = 0; r < work.residual_length; ++r) {
    if (work.residual_slot[r] != s)
      continue;
    const bool key = m.key_format[s] == KVC_FORMAT_FULL;
    const bool value = m.value_format[s] == KVC_FORMAT_FULL;
    if (!key && !value)
      return -1;
    return r | (key ? kvc::cuda::kKiviKeyFull : 0) |
           (value ? kvc::cuda::kKiviValueFull : 0);
  }
  return -1;
}

/// What the stages of a stateful policy do to the tables, in miniature:
/// every live slot's state counts the steps it was live and its importance
/// bits shift in a 1; then the victims are listed for the host and cleared
/// as the runtime will, and with `publish` the block writes the head's
/// host row too (publishVictims, as generated stages do).
__global__ void stages(const kvc::cuda::HeadTable *heads,
                       const uint8_t *victims, bool publish) {
  const kvc::cuda::HeadTable t = heads[blockIdx.x];
  for (int32_t i = threadIdx.x; i < t.numSlots; i += kThreads)
    if (t.positions[i] != KVC_POSITION_NONE) {
      t.state[i] += 1.0f;
      t.history[i] = t.history[i] << 1 | 1;
    }
  __syncthreads();
  const uint8_t *victim = victims + blockIdx.x * kStride;
  kvc::cuda::compactIndices<kThreads>(
      t.numSlots, [&](int32_t i) { return victim[i] != 0; }, t.victims + 1,
      t.victims);
  kvc::cuda::clearEvicted<kThreads>(t, victim, t.numSlots);
  if (publish)
    kvc::cuda::publishVictims<kThreads>(t);
}

/// A device pool of one layer, kHeads kv-heads of 8 f32 channels and pages
/// of kPageSize: full precision, or KIVI int2 (residual window of 8, groups
/// of 4).
kvc_config_t deviceConfig(bool kivi, int32_t pages, int32_t sequences) {
  kvc_config_t config{};
  config.num_layers = 1;
  config.num_q_heads = kHeads;
  config.num_kv_heads = kHeads;
  config.head_dim = 8;
  config.dtype = KVC_DTYPE_F32;
  config.format = kivi ? KVC_FORMAT_KIVI_INT2 : KVC_FORMAT_FULL;
  if (kivi) {
    config.group_size = 4;
    config.residual_length = 8;
  }
  config.page_size = kPageSize;
  config.num_pages = pages;
  config.max_sequences = sequences;
  config.memory = KVC_MEMORY_DEVICE;
  return config;
}

/// The end of a step of `batch` sequences: the victim flags go up, the
/// stand-in stages run over the step's HeadTables `heads`, every sequence
/// keeps its victims and the mirrors are checked in. The victim rows reach
/// the host from the stages (`publish`) or from checkIn's copyVictimRows.
void endStep(kvc::cuda::DeviceTables &tables,
             const kvc::cuda::HeadTable *heads, uint8_t *victims,
             const std::vector<uint8_t> &flags, int batch, bool keep,
             bool publish) {
  CHECK(cudaMemcpy(victims, flags.data(), flags.size(),
                   cudaMemcpyHostToDevice) == cudaSuccess,
        "victims");
  stages<<<batch * kHeads, kThreads>>>(heads, victims, publish);
  CHECK(cudaGetLastError() == cudaSuccess, "launch");
  for (int b = 0; keep && b < batch; ++b)
    CHECK(tables.keepVictims(b) == KVC_STATUS_OK, "keep victims");
  CHECK(tables.checkIn(/*victimsPublished=*/publish) == KVC_STATUS_OK,
        "check in");
}

/// The float (key, or value with `value`) of channel c that
/// storeAppended wrote for head i of the batch at `step` (test rows).
float storedChannel(int step, int i, int c, bool value) {
  const float key = static_cast<float>(step * 1000 + i * 10 + c);
  return value ? -key : key;
}

/// The mirror of (sequence, layer 0) equals the runtime's page table and
/// positions, but for the step's victims `chosen` and, when `olderPending`,
/// the step before's `older` (per head, ascending), which the device
/// cleared and lists in the two steps' buffers while the runtime has not
/// evicted them yet. Records the runtime's page counts in `pages`.
/// Detaches the mirror for the look and attaches it again.
void expectMirror(kvc_context_t *ctx, bool kivi, int b, uint64_t sequence,
                  int step, const std::vector<int32_t> *chosen,
                  const std::vector<int32_t> *older, bool olderPending,
                  int32_t *pageCounts) {
  kvc_attachment_t a{};
  CHECK(kvc_detach(ctx, sequence, 0, &a) == KVC_STATUS_OK, "detach");
  CHECK(a.release == &kvc::cuda::releaseMirror, "step %d: no mirror", step);
  const auto &m = *static_cast<const kvc::cuda::TableMirror *>(a.data);
  // A mirror that outgrew its capacity was moved into a larger region on
  // the device, pending victims and all: nothing was written back.
  const bool rebuilt = lastCapacity[b] && m.capPages != lastCapacity[b];
  const int32_t last = m.bufferOf(0), before = m.bufferOf(1);
  CHECK(m.pending[last] && m.pending[before] == olderPending &&
            m.recheck.empty(),
        "step %d: pending in the mirror: the step's victims %s, the step "
        "before's %s (expected %s); %zu stale pages",
        step, m.pending[last] ? "yes" : "no", m.pending[before] ? "yes" : "no",
        olderPending ? "yes" : "no", m.recheck.size());
  CHECK(m.done[last] &&
            cudaEventSynchronize(m.done[last]->event) == cudaSuccess,
        "event");
  // The step recorded one event for its whole batch (DeviceTables::checkIn).
  if (b == 0)
    batchEvent = m.done[last].get();
  CHECK(m.done[last].get() == batchEvent,
        "step %d: sequence %d does not share the batch's event", step, b);
  growths += rebuilt;
  lastCapacity[b] = m.capPages;
  minCapacity = std::min(minCapacity, m.capPages);
  maxCapacity = std::max(maxCapacity, m.capPages);
  for (int h = 0; h < kHeads; ++h) {
    kvc_metadata_t meta;
    CHECK(kvc_get_metadata(ctx, sequence, 0, h, &meta) == KVC_STATUS_OK,
          "metadata");
    int32_t pages = 0;
    CHECK(kvc_get_num_pages(ctx, sequence, 0, h, &pages) == KVC_STATUS_OK,
          "pages");
    pageCounts[h] = pages;
    const std::vector<int32_t> &victims = chosen[h];
    const int32_t count = static_cast<int32_t>(victims.size());
    const int32_t *row =
        m.hostVictimsOf(last) + h * (1 + kvc::cuda::kInlineVictims);
    const int32_t *list = m.victimsOf(h, last);
    CHECK(row[0] == count && list[0] == count,
          "step %d sequence %llu head %d: %d victims listed (%d downloaded), "
          "chose %d",
          step, static_cast<unsigned long long>(sequence), h, list[0], row[0],
          count);
    for (int32_t k = 0; k < count; ++k)
      CHECK(list[1 + k] == victims[k] &&
                (k >= kvc::cuda::kInlineVictims || row[1 + k] == victims[k]),
            "step %d head %d: victim %d is slot %d (downloaded %d), chose %d",
            step, h, k, list[1 + k],
            k < kvc::cuda::kInlineVictims ? row[1 + k] : -1, victims[k]);
    // The step before's list, which the runtime reads at the next
    // check-out: this step used the other buffer.
    const std::vector<int32_t> none;
    const std::vector<int32_t> &earlier = olderPending ? older[h] : none;
    if (olderPending) {
      const int32_t *kept = m.victimsOf(h, before);
      CHECK(kept[0] == static_cast<int32_t>(earlier.size()) &&
                std::equal(earlier.begin(), earlier.end(), kept + 1),
            "step %d sequence %llu head %d: the step before's list holds %d "
            "victims (chose %zu) or other slots",
            step, static_cast<unsigned long long>(sequence), h, kept[0],
            earlier.size());
    }
    CHECK(static_cast<int32_t>(m.pages[h].size()) == pages,
          "step %d sequence %llu head %d: mirror has %zu pages, runtime %d",
          step, static_cast<unsigned long long>(sequence), h,
          m.pages[h].size(), pages);
    for (int p = 0; p < pages; ++p) {
      void *address = nullptr;
      CHECK(kvc_get_page(ctx, sequence, 0, h, p, nullptr, nullptr,
                         &address) == KVC_STATUS_OK,
            "page");
      CHECK(m.pagesOf(h)[p] == reinterpret_cast<uint64_t>(address),
            "step %d sequence %llu head %d: device page %d is %llx, runtime "
            "%p",
            step, static_cast<unsigned long long>(sequence), h, p,
            static_cast<unsigned long long>(m.pagesOf(h)[p]), address);
    }
    for (int s = 0; s < meta.num_slots; ++s) {
      const bool victim =
          std::binary_search(victims.begin(), victims.end(), s) ||
          std::binary_search(earlier.begin(), earlier.end(), s);
      CHECK(victim == (meta.position[s] != KVC_POSITION_NONE &&
                       m.positionsOf(h)[s] == KVC_POSITION_NONE) &&
                (victim || m.positionsOf(h)[s] == meta.position[s]),
            "step %d sequence %llu head %d: device position of slot %d is "
            "%d, runtime %d%s",
            step, static_cast<unsigned long long>(sequence), h, s,
            m.positionsOf(h)[s], meta.position[s],
            victim ? " (a victim)" : "");
    }
    if (!kivi)
      continue;
    kvc_kivi_work_t work;
    CHECK(kvc_kivi_pending_work(ctx, sequence, 0, h, &work) == KVC_STATUS_OK,
          "work");
    CHECK(m.withKivi && m.residual[h] == work.residual,
          "step %d head %d: no KIVI words, or another residual region", step,
          h);
    for (int s = 0; s < meta.num_slots; ++s)
      CHECK(m.kiviRowsOf(h)[s] == expectedKiviWord(work, meta, s),
            "step %d sequence %llu head %d: KIVI word of slot %d is %x, "
            "runtime %x",
            step, static_cast<unsigned long long>(sequence), h, s,
            m.kiviRowsOf(h)[s], expectedKiviWord(work, meta, s));
    for (int32_t v : victims)
      for (int32_t r = 0; r < work.residual_length; ++r)
        windowVictims += work.residual_slot[r] == v;
  }
  CHECK(kvc_attach(ctx, sequence, 0, &a) == KVC_STATUS_OK, "attach");
}

/// One randomized run over a full-precision pool, or a KIVI one.
void run(bool kivi) {
  minCapacity = 1 << 30;
  maxCapacity = growths = 0;
  lastCapacity[0] = lastCapacity[1] = 0;
  const kvc_config_t config = deviceConfig(kivi, 128, kBatch);
  uint64_t poolBytes = 0;
  CHECK(kvc_pool_bytes_required(&config, &poolBytes) == KVC_STATUS_OK, "pool");
  void *pool = nullptr, *region = nullptr;
  uint8_t *victims = nullptr;
  CHECK(cudaMalloc(&pool, poolBytes) == cudaSuccess, "pool");
  // Room for the HeadTables, their arrival counters and three words only
  // (the generated code gives deviceTableBytes): every step's words go up
  // in chunks.
  const uint64_t regionBytes =
      kvc::cuda::TableMirror::align(sizeof(kvc::cuda::HeadTable) * kBatch *
                                    kHeads) +
      kvc::cuda::TableMirror::align(sizeof(int32_t) * kBatch * kHeads) +
      3 * sizeof(kvc::cuda::TableWord);
  // On a full-precision pool every third step stores its new rows with
  // storeAppended, which then writes the last chunk of the words: the rows
  // of every step (batch x kHeads keys, then as many values, 8 channels),
  // written once.
  constexpr int kRows = kBatch * kHeads;
  std::vector<float> rowsHost(static_cast<size_t>(kSteps) * 2 * kRows * 8);
  for (int step = 0; step < kSteps; ++step)
    for (int i = 0; i < kRows; ++i)
      for (int c = 0; c < 8; ++c)
        for (int value = 0; value < 2; ++value)
          rowsHost[((static_cast<size_t>(step) * 2 + value) * kRows + i) * 8 +
                   c] = storedChannel(step, i, c, value != 0);
  float *rows = nullptr;
  CHECK(cudaMalloc(reinterpret_cast<void **>(&rows),
                   sizeof(float) * rowsHost.size()) == cudaSuccess &&
            cudaMemcpy(rows, rowsHost.data(), sizeof(float) * rowsHost.size(),
                       cudaMemcpyHostToDevice) == cudaSuccess,
        "rows");
  kvc_page_layout_t pageLayout;
  CHECK(kvc_page_layout(&config, &pageLayout) == KVC_STATUS_OK, "layout");
  CHECK(cudaMalloc(&region, regionBytes) == cudaSuccess, "region");
  CHECK(cudaMalloc(reinterpret_cast<void **>(&victims),
                   kBatch * kHeads * kStride) == cudaSuccess,
        "victims");
  kvc_context_t *ctx = nullptr;
  CHECK(kvc_context_create(&config, pool, poolBytes, &ctx) == KVC_STATUS_OK,
        "context");
  const uint64_t sequences[kBatch] = {7, 3};
  // Host model: per (sequence, head), the steps each live position was
  // live for.
  std::map<int32_t, int> live[kBatch][kHeads];
  for (int b = 0; b < kBatch; ++b) {
    CHECK(kvc_sequence_add(ctx, sequences[b]) == KVC_STATUS_OK, "add");
    std::vector<int32_t> positions(kPrompt);
    for (int i = 0; i < kPrompt; ++i)
      positions[i] = i;
    for (int h = 0; h < kHeads; ++h) {
      CHECK(kvc_append(ctx, sequences[b], 0, h, kPrompt, 8, nullptr, nullptr,
                       positions.data(), nullptr) == KVC_STATUS_OK,
            "prompt");
      for (int i = 0; i < kPrompt; ++i)
        live[b][h][i] = 0;
    }
  }
  std::mt19937 rng(1234);
  int holes = 0, trims = 0, rebuilds = 0, longLists = 0, longReadSteps = 0,
      batchedReads = 0, twoHeadLists = 0, storeSteps = 0,
      plannedSteps = 0;
  const kvc::emu::Counters atStart = kvc::emu::counters();
  // Per head of the batch: the runtime's page count after the last step,
  // before the check-out evicted victims.
  std::vector<int32_t> pagesBefore(kBatch * kHeads, 0);
  // Per head: the last step's victims, sorted; per sequence, whether the
  // runtime has not evicted them yet (a full-precision pool keeps them
  // through the next step's append unless a metadata read settled them).
  std::vector<std::vector<int32_t>> lastChosen(kBatch * kHeads);
  bool lastPending[kBatch] = {};
  std::vector<uint8_t> flags(kBatch * kHeads * kStride);
  // Reading the metadata writes the device state back (the runtime settles
  // the mirrors); it must equal the model.
  auto verifyState = [&](int step) {
    ++rebuilds;
    for (int b = 0; b < kBatch; ++b)
      for (int h = 0; h < kHeads; ++h) {
        kvc_metadata_t meta;
        CHECK(kvc_get_metadata(ctx, sequences[b], 0, h, &meta) ==
                  KVC_STATUS_OK,
              "metadata");
        int counted = 0;
        for (int s = 0; s < meta.num_slots; ++s) {
          if (meta.position[s] == KVC_POSITION_NONE) {
            CHECK(meta.score[s] == 0.0f && meta.history[s] == 0,
                  "step %d: free slot %d has state %g", step, s,
                  meta.score[s]);
            continue;
          }
          auto it = live[b][h].find(meta.position[s]);
          CHECK(it != live[b][h].end(), "step %d: position %d not live", step,
                meta.position[s]);
          ++counted;
          const uint64_t bits = it->second >= 64
                                    ? ~uint64_t{0}
                                    : (uint64_t{1} << it->second) - 1;
          CHECK(meta.score[s] == static_cast<float>(it->second) &&
                    meta.history[s] == bits,
                "step %d sequence %d head %d position %d: state %g bits "
                "%llx, expected %d steps",
                step, b, h, meta.position[s], meta.score[s],
                static_cast<unsigned long long>(meta.history[s]),
                it->second);
        }
        CHECK(counted == static_cast<int>(live[b][h].size()),
              "step %d: %d live entries, model %zu", step, counted,
              live[b][h].size());
      }
  };
  for (int step = 0; step < kSteps; ++step) {
    const int32_t positions[kBatch] = {kPrompt + step, kPrompt + 2 * step};
    // The mirrors after the last step (kept unless a metadata read settled
    // them), for the KIVI count of key blocks quantized on kept tables.
    // Also the victim buffers whose lists the check-out reads from the
    // device (a head with more victims than its host row holds).
    bool kept[kBatch];
    int longReads = 0;
    for (int b = 0; b < kBatch; ++b) {
      kvc_attachment_t a{};
      CHECK(kvc_detach(ctx, sequences[b], 0, &a) == KVC_STATUS_OK, "detach");
      kept[b] = a.data != nullptr;
      if (!a.data)
        continue;
      const auto &m = *static_cast<const kvc::cuda::TableMirror *>(a.data);
      for (int32_t age = kivi ? 0 : 1; age < kvc::cuda::kVictimBuffers;
           ++age) {
        const int32_t buffer = m.bufferOf(age);
        bool longList = false;
        for (int h = 0; h < kHeads && m.pending[buffer]; ++h)
          longList = longList || m.hostVictimsOf(buffer)[h * (
                                     1 + kvc::cuda::kInlineVictims)] >
                                     kvc::cuda::kInlineVictims;
        longReads += longList;
      }
      CHECK(kvc_attach(ctx, sequences[b], 0, &a) == KVC_STATUS_OK, "attach");
    }
    const kvc::emu::Counters beforeCheckOut = kvc::emu::counters();
    kvc::cuda::DeviceTables tables;
    CHECK(tables.checkOut(ctx, kBatch, sequences, 0, kHeads, true, true, true,
                          "test", kivi) == KVC_STATUS_OK,
          "check out");
    // The long lists of the batch came in one copy per victim buffer on
    // kvc's own stream, and one wait for them all; nothing else was
    // copied, and nothing went through the legacy default stream.
    const kvc::emu::Counters &afterCheckOut = kvc::emu::counters();
    const uint64_t listCopies =
        afterCheckOut.asyncCopies - beforeCheckOut.asyncCopies;
    const uint64_t listWaits =
        afterCheckOut.nonBlockingWaits - beforeCheckOut.nonBlockingWaits;
    CHECK(listCopies == static_cast<uint64_t>(longReads) &&
              listWaits == (longReads > 0 ? 1u : 0u) &&
              afterCheckOut.syncCopies == beforeCheckOut.syncCopies,
          "step %d: the check-out read %d buffers' long victim lists with "
          "%llu copies, %llu waits on its own stream and %llu synchronous "
          "copies",
          step, longReads, static_cast<unsigned long long>(listCopies),
          static_cast<unsigned long long>(listWaits),
          static_cast<unsigned long long>(afterCheckOut.syncCopies -
                                          beforeCheckOut.syncCopies));
    longReadSteps += longReads > 0;
    batchedReads += longReads > 1;
    // The runtime has evicted the victims of the step before the last now
    // (of the last step too on a KIVI pool), at the check-out or at the
    // metadata read that settled the mirror: a trailing page they emptied
    // left the table.
    int32_t mostPages = 0;
    for (int i = 0; i < kBatch * kHeads; ++i) {
      int32_t after = 0;
      CHECK(kvc_get_num_pages(ctx, sequences[i / kHeads], 0, i % kHeads,
                              &after) == KVC_STATUS_OK,
            "pages");
      trims += after < pagesBefore[i];
      mostPages = std::max(mostPages, after);
    }
    // The tables' count, from the kept mirrors' shadows without asking the
    // runtime, is the runtime's.
    int32_t mostSlots = -1;
    CHECK(tables.slotsBeforeStep(&mostSlots) == KVC_STATUS_OK,
          "slots before the step");
    CHECK(mostSlots == mostPages * kPageSize,
          "step %d: the tables count %d slots before the step, the runtime "
          "%d",
          step, mostSlots, mostPages * kPageSize);
    // Odd steps append head by head and let upload ask the runtime for the
    // page-table lengths; even steps append the batch in one
    // kvc_append_step, whose lengths upload takes.
    std::vector<int32_t> newSlots(kBatch * kHeads), numPages(kBatch * kHeads);
    const bool batched = step % 2 == 0;
    if (batched)
      CHECK(kvc_append_step(ctx, 0, kBatch, sequences, 8, nullptr, nullptr,
                            positions, newSlots.data(),
                            numPages.data()) == KVC_STATUS_OK,
            "append step");
    for (int i = 0; i < kBatch * kHeads; ++i) {
      if (!batched)
        CHECK(kvc_append(ctx, sequences[i / kHeads], 0, i % kHeads, 1, 8,
                         nullptr, nullptr, &positions[i / kHeads],
                         &newSlots[i]) == KVC_STATUS_OK,
              "append");
      live[i / kHeads][i % kHeads][positions[i / kHeads]] = 0;
      if (kivi) {
        kvc_kivi_work_t work;
        CHECK(kvc_kivi_pending_work(ctx, sequences[i / kHeads], 0, i % kHeads,
                                    &work) == KVC_STATUS_OK,
              "work");
        keyBlocks += work.num_key_blocks > 0 && kept[i / kHeads];
      }
    }
    const kvc::cuda::HeadTable *heads = nullptr;
    const bool stores = !kivi && step % 3 != 0;
    const bool planned = stores && step % 3 == 2;
    CHECK(tables.upload(positions, newSlots.data(),
                        batched ? numPages.data() : nullptr, false, region,
                        regionBytes, nullptr, &heads, /*kiviWork=*/nullptr,
                        !stores   ? kvc::cuda::WordsBy::Upload
                        : planned ? kvc::cuda::WordsBy::PlannedStores
                                  : kvc::cuda::WordsBy::Stores) ==
              KVC_STATUS_OK,
          "upload");
    if (stores) {
      const float *k = rows + static_cast<size_t>(step) * 2 * kRows * 8;
      const kvc::cuda::PageLayout layout =
          kvc::cuda::devicePageLayout(config, pageLayout);
      CHECK((planned
                 ? kvc::cuda::launchPlannedStores<8, kvc::cuda::Storage::F32>(
                       heads, kRows, kHeads, layout, k, k + kRows * 8,
                       kHeads * 8, nullptr, "stores")
                 : kvc::cuda::launchAppendStores<8, kvc::cuda::Storage::F32>(
                       tables, heads, kRows, kHeads, layout, k,
                       k + kRows * 8, kHeads * 8, nullptr, "stores")) ==
                KVC_STATUS_OK,
            "step %d: stores", step);
      plannedSteps += planned;
      kvc::emu::runQueuedWork();
      // Each new row is in the slot's page, which the HeadTable names.
      for (int i = 0; i < kRows; ++i) {
        void *address = nullptr;
        CHECK(kvc_get_page(ctx, sequences[i / kHeads], 0, i % kHeads,
                           newSlots[i] / kPageSize, nullptr, nullptr,
                           &address) == KVC_STATUS_OK &&
                  heads[i].appendPage == reinterpret_cast<uint64_t>(address),
              "step %d head %d: appendPage is not the page of slot %d", step,
              i, newSlots[i]);
        const char *page = static_cast<const char *>(address);
        const int64_t row = newSlots[i] % kPageSize * 8;
        for (int c = 0; c < 8; ++c)
          CHECK(reinterpret_cast<const float *>(
                    page + pageLayout.key_offset)[row + c] ==
                        storedChannel(step, i, c, false) &&
                    reinterpret_cast<const float *>(
                        page + pageLayout.value_offset)[row + c] ==
                        storedChannel(step, i, c, true),
                "step %d head %d: channel %d of the stored row", step, i, c);
      }
      ++storeSteps;
    }
    // Victims: now and then one entry, or every entry of one page.
    std::vector<std::vector<int32_t>> chosen(kBatch * kHeads);
    std::fill(flags.begin(), flags.end(), 0);
    for (int i = 0; i < kBatch * kHeads; ++i) {
      kvc_metadata_t meta;
      CHECK(kvc_get_metadata(ctx, sequences[i / kHeads], 0, i % kHeads,
                             &meta) == KVC_STATUS_OK,
            "metadata");
      // Live on the device: the last step's victims are still live in the
      // runtime's bookkeeping of a full-precision pool.
      std::vector<int32_t> liveSlots;
      const std::vector<int32_t> &gone = lastChosen[i];
      for (int s = 0; s < meta.num_slots; ++s)
        if (meta.position[s] != KVC_POSITION_NONE &&
            !(lastPending[i / kHeads] &&
              std::binary_search(gone.begin(), gone.end(), s)))
          liveSlots.push_back(s);
      // The second sequence stops evicting halfway: its table grows.
      const int roll = static_cast<int>(rng() % 10) +
                       (i / kHeads == 1 && step > kSteps / 2 ? 10 : 0);
      // Now and then more victims than a step downloads with the counts
      // (a budget that shrank): the list is read from the device. Head 0,
      // head 1, then both, with lists of different lengths; not from the
      // sequence that stopped evicting.
      const int longHeads = (step / 8 + 2) % 3;
      const size_t longCount = kvc::cuda::kInlineVictims + 1 + 2 * (i % kHeads);
      if (step % 8 == 5 && (longHeads == 2 || i % kHeads == longHeads) &&
          !(i / kHeads == 1 && step > kSteps / 2) &&
          liveSlots.size() >= longCount + 2) {
        std::shuffle(liveSlots.begin(), liveSlots.end(), rng);
        chosen[i].assign(liveSlots.begin(), liveSlots.begin() + longCount);
      } else if (roll < 3 && liveSlots.size() > 4) {
        chosen[i].push_back(liveSlots[rng() % liveSlots.size()]);
      } else if (roll < 5 && liveSlots.size() > 8) {
        const int32_t page = liveSlots[rng() % liveSlots.size()] / kPageSize;
        for (int32_t s : liveSlots)
          if (s / kPageSize == page)
            chosen[i].push_back(s);
      }
      for (int32_t s : chosen[i]) {
        flags[i * kStride + s] = 1;
        live[i / kHeads][i % kHeads].erase(meta.position[s]);
      }
    }
    for (int i = 0; i < kBatch * kHeads; ++i)
      for (auto &entry : live[i / kHeads][i % kHeads])
        ++entry.second;
    endStep(tables, heads, victims, flags, kBatch, true, step % 2 == 1);
    for (int i = 0; i < kBatch * kHeads; ++i) {
      std::sort(chosen[i].begin(), chosen[i].end());
      holes += chosen[i].size() > 1 &&
               chosen[i].size() <= static_cast<size_t>(kPageSize);
      longLists += chosen[i].size() > kvc::cuda::kInlineVictims;
      twoHeadLists += i % kHeads == 1 &&
                      chosen[i].size() > kvc::cuda::kInlineVictims &&
                      chosen[i - 1].size() > kvc::cuda::kInlineVictims;
    }
    for (int b = 0; b < kBatch; ++b)
      expectMirror(ctx, kivi, b, sequences[b], step, &chosen[b * kHeads],
                   &lastChosen[b * kHeads], lastPending[b] && !kivi,
                   &pagesBefore[b * kHeads]);
    lastChosen = chosen;
    for (int b = 0; b < kBatch; ++b)
      lastPending[b] = !kivi;
    // Write-backs in the first half; in the second, the tables grow past
    // their mirrors' capacity.
    if (step % 9 != 8 || step > kSteps / 2)
      continue;
    lastCapacity[0] = lastCapacity[1] = 0;
    verifyState(step);
    lastPending[0] = lastPending[1] = false;
    kvc_attachment_t a{};
    CHECK(kvc_detach(ctx, sequences[0], 0, &a) == KVC_STATUS_OK &&
              a.data == nullptr,
          "step %d: the mirror stayed attached after a metadata read", step);
  }
  verifyState(kSteps);
  CHECK(holes > 3 && trims > 0 && rebuilds > 3 && growths > 0 &&
            longReadSteps > 0 && batchedReads > 0 && twoHeadLists > 0 &&
            (kivi || (storeSteps > 40 && plannedSteps > 20)),
        "the run made %d page evictions, %d trims, %d write-backs, %d "
        "mirrors outgrown, %d long victim lists (%d check-outs read some, "
        "%d of several sequences; %d steps with both heads'), %d steps "
        "whose stores wrote the words (%d of them planned)",
        holes, trims, rebuilds, growths, longLists, longReadSteps,
        batchedReads, twoHeadLists, storeSteps, plannedSteps);
  // The write-backs too read the device on kvc's own stream: the only
  // synchronous copies (on the legacy default stream) are the test's own
  // victim flags, one per step (endStep).
  CHECK(kvc::emu::counters().syncCopies - atStart.syncCopies == kSteps,
        "%llu synchronous copies in %d steps",
        static_cast<unsigned long long>(kvc::emu::counters().syncCopies -
                                        atStart.syncCopies),
        kSteps);
  kvc_context_destroy(ctx);
  cudaFree(rows);
  cudaFree(victims);
  cudaFree(region);
  cudaFree(pool);
  std::printf("device tables%s: %d steps, %d page evictions, %d trims, %d "
              "write-backs, %d mirrors outgrown (%d to %d pages), %d long "
              "victim lists (read by %d check-outs, %d of several "
              "sequences; both heads' in %d): ok\n",
              kivi ? " (KIVI)" : "", kSteps, holes, trims, rebuilds, growths,
              minCapacity, maxCapacity, longLists, longReadSteps,
              batchedReads, twoHeadLists);
}

/// Sequences joining and leaving the batch, as a serving engine decodes
/// them: every other step one sequence ends (kvc_sequence_remove releases
/// its mirror) and a new one with a prompt of its own length joins (its
/// first step builds its mirror). After every step the mirrors hold the
/// runtime's page addresses and, but for the step's victims, positions.
/// Once the first steps have made kvc's memory pool, pinned chunk, staging
/// blocks and events, neither a step nor a removal makes a CUDA call that
/// synchronizes (the emulator counts cudaMalloc, cudaMallocHost, cudaFree,
/// cudaFreeHost and event creation as allocations, and copies from pageable
/// host memory, which may synchronize with the stream), and the pinned victim
/// rows of ended sequences are reused. With the device's events held
/// unfinished, a released mirror's memory is neither freed nor reused
/// until a wait covers its last step; right after, it is.
void serve() {
  constexpr int kMaxBatch = 4, kWarmSteps = 6, kServeSteps = 40;
  const kvc_config_t config = deviceConfig(false, 256, kMaxBatch + 1);
  constexpr int kMostHeads = (kMaxBatch + 1) * kHeads;
  uint64_t poolBytes = 0;
  CHECK(kvc_pool_bytes_required(&config, &poolBytes) == KVC_STATUS_OK, "pool");
  void *pool = nullptr, *region = nullptr;
  uint8_t *victims = nullptr;
  const uint64_t regionBytes =
      kvc::cuda::deviceTableBytes(kMostHeads, kStride);
  CHECK(cudaMalloc(&pool, poolBytes) == cudaSuccess &&
            cudaMalloc(&region, regionBytes) == cudaSuccess &&
            cudaMalloc(reinterpret_cast<void **>(&victims),
                       kMostHeads * kStride) == cudaSuccess,
        "device memory");
  kvc_context_t *ctx = nullptr;
  CHECK(kvc_context_create(&config, pool, poolBytes, &ctx) == KVC_STATUS_OK,
        "context");
  std::mt19937 rng(99);
  std::vector<uint64_t> active;
  std::map<uint64_t, int32_t> nextPosition;
  uint64_t nextId = 100;
  auto join = [&] {
    const uint64_t id = nextId++;
    CHECK(kvc_sequence_add(ctx, id) == KVC_STATUS_OK, "add");
    const int32_t prompt = 5 + static_cast<int32_t>(id % 7) * 3;
    std::vector<int32_t> positions(prompt);
    for (int32_t i = 0; i < prompt; ++i)
      positions[i] = i;
    for (int h = 0; h < kHeads; ++h)
      CHECK(kvc_append(ctx, id, 0, h, prompt, 8, nullptr, nullptr,
                       positions.data(), nullptr) == KVC_STATUS_OK,
            "prompt");
    active.push_back(id);
    nextPosition[id] = prompt;
  };
  auto leave = [&](size_t index) {
    CHECK(kvc_sequence_remove(ctx, active[index]) == KVC_STATUS_OK, "remove");
    active.erase(active.begin() + static_cast<std::ptrdiff_t>(index));
  };
  // The mirror of sequence `id` (detached for the look, attached again).
  auto mirrorOf = [&](uint64_t id) {
    kvc_attachment_t a{};
    CHECK(kvc_detach(ctx, id, 0, &a) == KVC_STATUS_OK &&
              a.release == &kvc::cuda::releaseMirror,
          "sequence %llu has no mirror", static_cast<unsigned long long>(id));
    CHECK(kvc_attach(ctx, id, 0, &a) == KVC_STATUS_OK, "attach");
    return static_cast<const kvc::cuda::TableMirror *>(a.data);
  };
  std::vector<int32_t> newSlots(kMostHeads), numPages(kMostHeads);
  std::vector<uint8_t> flags(kMostHeads * kStride);
  // Per sequence and head, the last step's victims: the runtime evicts
  // them when the step after next checks the mirror out.
  std::map<uint64_t, std::vector<std::vector<int32_t>>> lastChosen;
  int evicted = 0;
  // A step without victims (`evict` false) leaves nothing for a later
  // step to wait for.
  auto step = [&](int index, bool evict = true) {
    const int32_t n = static_cast<int32_t>(active.size());
    std::vector<int32_t> positions(n);
    for (int32_t b = 0; b < n; ++b)
      positions[b] = nextPosition[active[b]]++;
    kvc::cuda::DeviceTables tables;
    CHECK(tables.checkOut(ctx, n, active.data(), 0, kHeads, true, true, true,
                          "serve") == KVC_STATUS_OK,
          "check out");
    CHECK(kvc_append_step(ctx, 0, n, active.data(), 8, nullptr, nullptr,
                          positions.data(), newSlots.data(),
                          numPages.data()) == KVC_STATUS_OK,
          "append step");
    const kvc::cuda::HeadTable *heads = nullptr;
    CHECK(tables.upload(positions.data(), newSlots.data(), numPages.data(),
                        false, region, regionBytes, nullptr,
                        &heads) == KVC_STATUS_OK,
          "upload");
    kvc::emu::runQueuedWork();
    // A head over 12 live entries on the device evicts one of them.
    std::fill(flags.begin(), flags.end(), 0);
    std::vector<std::vector<int32_t>> chosen(n * kHeads);
    for (int32_t i = 0; i < n * kHeads; ++i) {
      std::vector<int32_t> live;
      for (int32_t s = 0; s < heads[i].numSlots; ++s)
        if (heads[i].positions[s] != KVC_POSITION_NONE)
          live.push_back(s);
      if (!evict || live.size() <= 12)
        continue;
      chosen[i].push_back(live[rng() % live.size()]);
      flags[i * kStride + chosen[i][0]] = 1;
      ++evicted;
    }
    endStep(tables, heads, victims, flags, n, evict, index % 2 == 0);
    kvc::emu::runQueuedWork(); // the stages' writes, for the reads below
    for (int32_t b = 0; b < n; ++b) {
      const kvc::cuda::TableMirror &m = *mirrorOf(active[b]);
      kvc_attachment_t a{};
      CHECK(kvc_detach(ctx, active[b], 0, &a) == KVC_STATUS_OK, "detach");
      for (int h = 0; h < kHeads; ++h) {
        int32_t pages = 0;
        kvc_metadata_t meta;
        CHECK(kvc_get_num_pages(ctx, active[b], 0, h, &pages) ==
                      KVC_STATUS_OK &&
                  kvc_get_metadata(ctx, active[b], 0, h, &meta) ==
                      KVC_STATUS_OK,
              "runtime");
        for (int32_t p = 0; p < pages; ++p) {
          void *address = nullptr;
          CHECK(kvc_get_page(ctx, active[b], 0, h, p, nullptr, nullptr,
                             &address) == KVC_STATUS_OK &&
                    m.pagesOf(h)[p] == reinterpret_cast<uint64_t>(address),
                "serve step %d sequence %llu head %d: device page %d is not "
                "the runtime's",
                index, static_cast<unsigned long long>(active[b]), h, p);
        }
        const std::vector<int32_t> &gone = chosen[b * kHeads + h];
        const std::vector<std::vector<int32_t>> &earlier =
            lastChosen[active[b]];
        for (int32_t s = 0; s < meta.num_slots; ++s) {
          const bool victim =
              std::count(gone.begin(), gone.end(), s) ||
              (!earlier.empty() &&
               std::count(earlier[h].begin(), earlier[h].end(), s));
          const int32_t expected =
              victim ? KVC_POSITION_NONE : meta.position[s];
          CHECK(m.positionsOf(h)[s] == expected,
                "serve step %d sequence %llu head %d: device position of "
                "slot %d is %d, expected %d",
                index, static_cast<unsigned long long>(active[b]), h, s,
                m.positionsOf(h)[s], expected);
        }
      }
      CHECK(kvc_attach(ctx, active[b], 0, &a) == KVC_STATUS_OK, "attach");
      lastChosen[active[b]].assign(chosen.begin() + b * kHeads,
                                   chosen.begin() + (b + 1) * kHeads);
    }
  };

  for (int i = 0; i < kMaxBatch; ++i)
    join();
  int index = 0;
  for (; index < kWarmSteps; ++index)
    step(index);
  const kvc::emu::Counters before = kvc::emu::counters();
  std::vector<const int32_t *> rows;
  int joined = 0;
  for (; index < kWarmSteps + kServeSteps; ++index) {
    if (index % 2 == 1) {
      leave(rng() % active.size());
      join();
      ++joined;
    }
    step(index);
    for (uint64_t id : active) {
      const int32_t *r = mirrorOf(id)->hostVictims;
      if (std::find(rows.begin(), rows.end(), r) == rows.end())
        rows.push_back(r);
    }
  }
  const kvc::emu::Counters &after = kvc::emu::counters();
  CHECK(after.pageableCopies == before.pageableCopies,
        "%llu copies from pageable host memory in %d steps",
        static_cast<unsigned long long>(after.pageableCopies -
                                        before.pageableCopies),
        kServeSteps);
  CHECK(after.allocations == before.allocations,
        "%llu synchronizing allocations or frees in %d steps with %d "
        "sequences joining and leaving",
        static_cast<unsigned long long>(after.allocations -
                                        before.allocations),
        kServeSteps, joined);
  // One event per step: the staging blocks of its copies wait for it too.
  CHECK(after.eventRecords - before.eventRecords ==
            static_cast<uint64_t>(kServeSteps),
        "%llu event records in %d steps",
        static_cast<unsigned long long>(after.eventRecords -
                                        before.eventRecords),
        kServeSteps);
  const uint64_t regions = after.poolAllocations - before.poolAllocations,
                 freed = after.poolFrees - before.poolFrees;
  CHECK(regions >= static_cast<uint64_t>(joined) &&
            freed + kMaxBatch + 1 >= regions && evicted > 10,
        "%llu regions allocated from the pool, %llu freed, %d joined, %d "
        "victims",
        static_cast<unsigned long long>(regions),
        static_cast<unsigned long long>(freed), joined, evicted);
  // The batch's own rows plus those of the sequence that left last.
  CHECK(rows.size() <= static_cast<size_t>(kMaxBatch + 1),
        "%zu different pinned victim rows for %d sequences at a time",
        rows.size(), kMaxBatch);

  // Released while its last step is still running (held): kept, through
  // a step that waits for the step before it only. Neither is a staging
  // block rewritten before the copies of the step that used it have run.
  const uint64_t unfinishedBefore = kvc::emu::counters().unfinishedSourceCopies;
  kvc::emu::holdEvents(true);
  step(index++);
  step(index++);
  const int32_t *leftRows = mirrorOf(active.front())->hostVictims;
  leave(0);
  join();
  const uint64_t freesBefore = kvc::emu::counters().poolFrees;
  step(index++);
  CHECK(kvc::emu::counters().poolFrees == freesBefore &&
            mirrorOf(active.back())->hostVictims != leftRows,
        "the memory of a mirror whose last step had not finished was freed "
        "or reused");
  // A wait covers it: the next step frees the region, and a sequence that
  // joins takes the rows.
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "synchronize");
  join();
  step(index++);
  CHECK(kvc::emu::counters().poolFrees == freesBefore + 1 &&
            mirrorOf(active.back())->hostVictims == leftRows,
        "the memory of a mirror whose steps had finished was not reused "
        "(%llu regions freed)",
        static_cast<unsigned long long>(kvc::emu::counters().poolFrees -
                                        freesBefore));
  // Steps that wait for nothing while the device runs behind, more than
  // the thread has staging blocks: each takes a block of its own.
  const size_t blocks = kvc::cuda::pinnedStaging().blocks();
  for (size_t k = 0; k < blocks + 2; ++k)
    step(index++, false);
  CHECK(kvc::cuda::pinnedStaging().blocks() >= blocks + 2,
        "%zu staging blocks after %zu steps of a device running behind, "
        "%zu before",
        kvc::cuda::pinnedStaging().blocks(), blocks + 2, blocks);
  // A step that fails after its upload (no check-in): its staging block
  // is not left waiting for an event that never comes.
  {
    const int32_t n = static_cast<int32_t>(active.size());
    std::vector<int32_t> positions(n);
    for (int32_t b = 0; b < n; ++b)
      positions[b] = nextPosition[active[b]]++;
    kvc::cuda::DeviceTables tables;
    const kvc::cuda::HeadTable *heads = nullptr;
    CHECK(tables.checkOut(ctx, n, active.data(), 0, kHeads, true, true, true,
                          "failing step") == KVC_STATUS_OK &&
              kvc_append_step(ctx, 0, n, active.data(), 8, nullptr, nullptr,
                              positions.data(), newSlots.data(),
                              numPages.data()) == KVC_STATUS_OK &&
              tables.upload(positions.data(), newSlots.data(),
                            numPages.data(), false, region, regionBytes,
                            nullptr, &heads) == KVC_STATUS_OK,
          "failing step");
    CHECK(kvc::cuda::pinnedStaging().blocksInStep() > 0,
          "the upload's staging block does not wait for its step");
  }
  CHECK(kvc::cuda::pinnedStaging().blocksInStep() == 0,
        "%zu staging blocks wait for a failed step's event",
        kvc::cuda::pinnedStaging().blocksInStep());
  lastChosen.clear();
  step(index++);
  CHECK(kvc::emu::counters().unfinishedSourceCopies == unfinishedBefore,
        "%llu copies from a pinned staging block whose earlier copy had not "
        "run",
        static_cast<unsigned long long>(
            kvc::emu::counters().unfinishedSourceCopies - unfinishedBefore));
  kvc::emu::holdEvents(false);
  // Every mirror released after its steps finished: every region of the
  // process went back (the mirrors of the other runs' last steps too).
  const uint64_t allocationsBefore = kvc::emu::counters().allocations;
  kvc_context_destroy(ctx);
  const kvc::emu::Counters &end = kvc::emu::counters();
  CHECK(end.poolFrees == end.poolAllocations &&
            end.allocations > allocationsBefore,
        "%llu of %llu mirror regions not freed, or the pinned chunk kept, "
        "with no mirror left",
        static_cast<unsigned long long>(end.poolAllocations - end.poolFrees),
        static_cast<unsigned long long>(end.poolAllocations));
  cudaFree(victims);
  cudaFree(region);
  cudaFree(pool);
  std::printf("serving: %d steps, %d sequences joined and left, %d victims, "
              "%llu mirror regions from the pool (%llu freed), %zu pinned "
              "victim rows, no synchronizing allocation: ok\n",
              index, joined, evicted, static_cast<unsigned long long>(regions),
              static_cast<unsigned long long>(freed), rows.size());
}

/// One sequence of kHeads kv-heads on a small full-precision pool, with a
/// region of deviceTableBytes for its device tables (unwrittenWords,
/// plannedWords).
struct OneSequence {
  const kvc_config_t config = deviceConfig(false, 16, 1);
  const uint64_t regionBytes = kvc::cuda::deviceTableBytes(kHeads, kStride);
  const uint64_t sequence;
  void *pool = nullptr, *region = nullptr;
  kvc_context_t *ctx = nullptr;
  int32_t newSlots[kHeads], numPages[kHeads];

  explicit OneSequence(uint64_t id) : sequence(id) {
    uint64_t poolBytes = 0;
    CHECK(kvc_pool_bytes_required(&config, &poolBytes) == KVC_STATUS_OK,
          "pool");
    CHECK(cudaMalloc(&pool, poolBytes) == cudaSuccess &&
              cudaMalloc(&region, regionBytes) == cudaSuccess,
          "device memory");
    CHECK(kvc_context_create(&config, pool, poolBytes, &ctx) ==
              KVC_STATUS_OK,
          "context");
    CHECK(kvc_sequence_add(ctx, sequence) == KVC_STATUS_OK, "add");
  }
  ~OneSequence() {
    kvc_context_destroy(ctx);
    cudaFree(region);
    cudaFree(pool);
  }
  /// Checks `tables` out for the step at `position` and appends its entry
  /// (newSlots, numPages).
  void step(kvc::cuda::DeviceTables &tables, int32_t position,
            const char *name) {
    CHECK(tables.checkOut(ctx, 1, &sequence, 0, kHeads, false, false, false,
                          name) == KVC_STATUS_OK,
          "check out");
    CHECK(kvc_append_step(ctx, 0, 1, &sequence, 8, nullptr, nullptr,
                          &position, newSlots, numPages) == KVC_STATUS_OK,
          "append step");
  }
};

/// A step that leaves its table words to storeAppended must run it: a
/// check-in with the words unwritten fails, naming the cause, and so does a
/// second take of the words; the failed step's mirror is written back, so
/// the runtime still answers. A KIVI plan with nothing to stage writes the
/// words it was given in a launch of their own.
void unwrittenWords() {
  OneSequence one(5);
  kvc_context_t *ctx = one.ctx;
  const uint64_t sequence = one.sequence;
  const int32_t *newSlots = one.newSlots;
  for (int32_t position = 0; position < 4; ++position) {
    kvc::cuda::DeviceTables tables;
    one.step(tables, position, "unwritten");
    const kvc::cuda::HeadTable *heads = nullptr;
    CHECK(tables.upload(&position, one.newSlots, one.numPages, false,
                        one.region, one.regionBytes, nullptr, &heads, nullptr,
                        kvc::cuda::WordsBy::Stores) == KVC_STATUS_OK,
          "upload");
    if (position < 2) {
      // The first step builds the mirror (no words); the second writes the
      // new slot's position into it.
      const kvc::cuda::TableWord *words = nullptr;
      int32_t n = -1;
      CHECK(tables.takeDeferredWords(&words, &n) == KVC_STATUS_OK &&
                (n > 0) == (position == 1),
            "step %d: the step's words (%d)", position, n);
      CHECK(tables.takeDeferredWords(&words, &n) == KVC_STATUS_INTERNAL &&
                std::string(kvc_last_error()).find("no table words") !=
                    std::string::npos,
            "a second take: %s", kvc_last_error());
      kvc::cuda::writeTableWords<256><<<1, 256>>>(words, n);
      CHECK(tables.checkIn() == KVC_STATUS_OK, "check in");
      continue;
    }
    if (position == 2) {
      // A KIVI plan with nothing to stage still writes the words it takes.
      kvc::cuda::KiviWorkPlan empty;
      CHECK((empty.launch<8, 2, 4, KVC_DTYPE_F32>(
                nullptr, kvc::cuda::KiviWorkBounds{}, nullptr, nullptr,
                nullptr, "unwritten", &tables)) ==
                KVC_STATUS_OK,
            "an empty KIVI plan");
      CHECK(tables.checkIn() == KVC_STATUS_OK, "check in");
      kvc::emu::runQueuedWork(); // the launch's writes, for the reads below
      kvc_attachment_t a{};
      CHECK(kvc_detach(ctx, sequence, 0, &a) == KVC_STATUS_OK && a.data,
            "detach");
      const auto *m = static_cast<const kvc::cuda::TableMirror *>(a.data);
      for (int h = 0; h < kHeads; ++h)
        CHECK(m->positionsOf(h)[newSlots[h]] == position,
              "head %d: the words of the empty plan's launch were not "
              "written (slot %d holds position %d)",
              h, newSlots[h], m->positionsOf(h)[newSlots[h]]);
      CHECK(kvc_attach(ctx, sequence, 0, &a) == KVC_STATUS_OK, "attach");
      continue;
    }
    CHECK(tables.checkIn() == KVC_STATUS_INTERNAL &&
              std::string(kvc_last_error()) ==
                  "unwritten: the step's table words were left to stores "
                  "that never ran",
          "check in with unwritten words: %s", kvc_last_error());
  }
  kvc_metadata_t meta;
  CHECK(kvc_get_metadata(ctx, sequence, 0, 0, &meta) == KVC_STATUS_OK &&
            meta.num_slots >= 4,
        "metadata after the failed steps");
  std::printf("unwritten words: a check-in without the stores fails: ok\n");
}

/// A planned step (WordsBy::PlannedStores): the upload puts the count of
/// its words in the header word at DeviceTables::plannedWords, 0 when it
/// has none (the first step builds the mirror), and launches nothing; the
/// words stay unwritten until the run's launchPlannedStores, which reads
/// the count on the device and writes them (the new slots' positions),
/// with the new rows in the pages the HeadTables name.
void plannedWords() {
  OneSequence one(9);
  const kvc_config_t &config = one.config;
  kvc_context_t *ctx = one.ctx;
  const uint64_t sequence = one.sequence;
  const int32_t *newSlots = one.newSlots;
  kvc_page_layout_t pageLayout;
  CHECK(kvc_page_layout(&config, &pageLayout) == KVC_STATUS_OK, "layout");
  std::vector<float> rowsHost(2 * kHeads * 8);
  for (size_t i = 0; i < rowsHost.size(); ++i)
    rowsHost[i] = 0.25f * static_cast<float>(i);
  float *rows = upload(rowsHost);
  const uint64_t launchesBefore = kvc::emu::counters().launches;
  int32_t written = 0;
  for (int32_t position = 0; position < 6; ++position) {
    kvc::cuda::DeviceTables tables;
    one.step(tables, position, "planned");
    const kvc::cuda::HeadTable *heads = nullptr;
    const uint64_t launches = kvc::emu::counters().launches;
    CHECK(tables.upload(&position, one.newSlots, one.numPages, false,
                        one.region, one.regionBytes, nullptr, &heads, nullptr,
                        kvc::cuda::WordsBy::PlannedStores) == KVC_STATUS_OK,
          "upload");
    CHECK(kvc::emu::counters().launches == launches,
          "step %d: the planned upload launched a kernel", position);
    kvc::emu::runQueuedWork(); // the upload's copy
    const kvc::cuda::TableWord header =
        download(kvc::cuda::DeviceTables::plannedWords(heads, kHeads), 1)[0];
    CHECK((header.address > 0) == (position > 0) && header.value == 0,
          "step %d: the header word counts %llu words", position,
          static_cast<unsigned long long>(header.address));
    // The run, from the region alone.
    CHECK((kvc::cuda::launchPlannedStores<8, kvc::cuda::Storage::F32>(
              heads, kHeads, kHeads,
              kvc::cuda::devicePageLayout(config, pageLayout), rows,
              rows + kHeads * 8, kHeads * 8, nullptr, "planned")) ==
              KVC_STATUS_OK,
          "step %d: the planned stores", position);
    CHECK(tables.checkIn() == KVC_STATUS_OK, "step %d: check in", position);
    kvc::emu::runQueuedWork();
    kvc_attachment_t a{};
    CHECK(kvc_detach(ctx, sequence, 0, &a) == KVC_STATUS_OK && a.data,
          "detach");
    const auto *m = static_cast<const kvc::cuda::TableMirror *>(a.data);
    for (int h = 0; h < kHeads; ++h) {
      CHECK(m->positionsOf(h)[newSlots[h]] == position,
            "step %d head %d: the planned stores did not write the words "
            "(slot %d holds position %d)",
            position, h, newSlots[h], m->positionsOf(h)[newSlots[h]]);
      const char *page = reinterpret_cast<const char *>(
          m->pagesOf(h)[newSlots[h] / config.page_size]);
      const float *key = reinterpret_cast<const float *>(
                             page + pageLayout.key_offset) +
                         newSlots[h] % config.page_size * 8;
      CHECK(key[3] == rowsHost[h * 8 + 3],
            "step %d head %d: key channel 3 of the stored row is %g", position,
            h, key[3]);
    }
    written += position > 0;
    CHECK(kvc_attach(ctx, sequence, 0, &a) == KVC_STATUS_OK, "attach");
  }
  std::printf("planned words: %d steps' words written by the run's stores, "
              "%llu launches: ok\n",
              written,
              static_cast<unsigned long long>(kvc::emu::counters().launches -
                                              launchesBefore));
  cudaFree(rows);
}

} // namespace

int main() {
  run(false);
  run(true);
  serve();
  unwrittenWords();
  plannedWords();
  CHECK(keyBlocks > 3 && windowVictims > 3,
        "the KIVI run quantized %d blocks of keys on kept tables and evicted "
        "%d window entries",
        keyBlocks, windowVictims);
  std::printf("KIVI words: %d blocks of keys left the window on kept tables, "
              "%d window entries evicted: ok\n",
              keyBlocks, windowVictims);
  return 0;
}
