//===- AttachmentTest.cpp - Backend records beside (sequence, layer) ------===//
//
// kvc_attach / kvc_detach and the settling contract of kvc_attachment_t:
// which calls flush and release a record (every access of its layer, every
// record for the pool-wide queries), in which order, that a flush sees no
// attachment and may write the host metadata or evict (and the call then
// reports the result), that a failed flush fails the call with nothing
// else changed, and that removal and destruction release without flushing.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_runtime.h"
#include "test/runtime/TestSupport.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

namespace {

using namespace kvc::test;

/// A record that logs its callbacks and, on flush, writes `flushScore`
/// into slot 0 of head 0 of its layer (what a backend holding newer score
/// state would do).
struct Record {
  std::vector<std::string> *log;
  float flushScore = 0.0f;
  kvc_status_t flushStatus = KVC_STATUS_OK;
  bool sawAttachmentInFlush = false;
  /// Evicts slot 0 of head 0 on flush (a backend handing over an eviction
  /// it decided on the device).
  bool evictOnFlush = false;
};

kvc_status_t flushRecord(void *data, kvc_context_t *ctx, uint64_t sequence,
                         int32_t layer) {
  Record &r = *static_cast<Record *>(data);
  r.log->push_back("flush " + std::to_string(sequence) + "/" +
                   std::to_string(layer));
  kvc_attachment_t inside{};
  if (kvc_detach(ctx, sequence, layer, &inside) != KVC_STATUS_OK ||
      inside.data)
    r.sawAttachmentInFlush = true;
  if (r.flushStatus != KVC_STATUS_OK)
    return kvc_report_error(r.flushStatus, "record: flush failed");
  kvc_metadata_t m;
  kvc_status_t status = kvc_get_metadata(ctx, sequence, layer, 0, &m);
  if (status != KVC_STATUS_OK)
    return status;
  if (m.num_slots > 0)
    m.score[0] = r.flushScore;
  if (r.evictOnFlush) {
    const int32_t slot = 0;
    return kvc_evict(ctx, sequence, layer, 0, 1, &slot);
  }
  return KVC_STATUS_OK;
}

void releaseRecord(void *data) {
  static_cast<Record *>(data)->log->push_back("release");
}

kvc_attachment_t attachmentOf(Record &r) {
  return kvc_attachment_t{&r, flushRecord, releaseRecord};
}

kvc_config_t deviceConfig() {
  kvc_config_t c = smallConfig();
  c.memory = KVC_MEMORY_DEVICE;
  return c;
}

/// One entry at position 7 in head 0 of (sequence 1, layer 0).
void appendOne(kvc_context_t *ctx, int32_t position = 7) {
  int32_t slot = -1;
  ASSERT_EQ(kvc_append(ctx, 1, 0, 0, 1, 8, nullptr, nullptr, &position, &slot),
            KVC_STATUS_OK)
      << kvc_last_error();
}

TEST(Attachment, MetadataAccessFlushesThenReleases) {
  Fixture f(deviceConfig());
  ASSERT_EQ(kvc_sequence_add(f.ctx, 1), KVC_STATUS_OK);
  appendOne(f.ctx);
  std::vector<std::string> log;
  Record r{&log, 2.5f};
  const kvc_attachment_t a = attachmentOf(r);
  ASSERT_EQ(kvc_attach(f.ctx, 1, 0, &a), KVC_STATUS_OK) << kvc_last_error();
  // Calls that do not touch the layer's bookkeeping leave it attached.
  int32_t n = 0;
  ASSERT_EQ(kvc_get_num_slots(f.ctx, 1, 1, 0, &n), KVC_STATUS_OK);
  kvc_config_t config;
  ASSERT_EQ(kvc_context_config(f.ctx, &config), KVC_STATUS_OK);
  kvc_metadata_t other;
  ASSERT_EQ(kvc_get_metadata(f.ctx, 1, 1, 0, &other), KVC_STATUS_OK);
  EXPECT_TRUE(log.empty());

  kvc_metadata_t m;
  ASSERT_EQ(kvc_get_metadata(f.ctx, 1, 0, 1, &m), KVC_STATUS_OK);
  EXPECT_EQ(log, (std::vector<std::string>{"flush 1/0", "release"}));
  EXPECT_FALSE(r.sawAttachmentInFlush);
  ASSERT_EQ(kvc_get_metadata(f.ctx, 1, 0, 0, &m), KVC_STATUS_OK);
  EXPECT_EQ(m.score[0], 2.5f);
  // Settled once: the next access finds nothing attached.
  EXPECT_EQ(log.size(), 2u);
  kvc_attachment_t none{&r, flushRecord, releaseRecord};
  ASSERT_EQ(kvc_detach(f.ctx, 1, 0, &none), KVC_STATUS_OK);
  EXPECT_EQ(none.data, nullptr);
  EXPECT_EQ(none.flush, nullptr);
  EXPECT_EQ(none.release, nullptr);
}

TEST(Attachment, EveryHostAccessOfTheLayerSettles) {
  Fixture f(deviceConfig());
  ASSERT_EQ(kvc_sequence_add(f.ctx, 1), KVC_STATUS_OK);
  appendOne(f.ctx);
  std::vector<std::string> log;
  Record r{&log};
  const kvc_attachment_t a = attachmentOf(r);
  const std::vector<std::string> settled{"flush 1/0", "release"};
  struct Call {
    const char *what;
    std::function<kvc_status_t()> run;
    kvc_status_t expected = KVC_STATUS_OK;
  };
  int32_t position = 8, slot = 0;
  kvc_move_t moves[8];
  int32_t numMoves = 0, released = 0;
  int32_t out = 0, poolPage = 0, pageIndex = 0, pageOffset = 0;
  uint64_t offset = 0;
  void *address = nullptr;
  kvc_metadata_t meta;
  kvc_kivi_work_t work, works[8];
  const uint64_t sequenceOne = 1;
  float key[8], value[8];
  const std::vector<Call> calls = {
      {"kvc_get_num_entries",
       [&] { return kvc_get_num_entries(f.ctx, 1, 0, 1, &out); }},
      {"kvc_get_num_slots",
       [&] { return kvc_get_num_slots(f.ctx, 1, 0, 1, &out); }},
      {"kvc_get_num_pages",
       [&] { return kvc_get_num_pages(f.ctx, 1, 0, 1, &out); }},
      {"kvc_get_page",
       [&] {
         return kvc_get_page(f.ctx, 1, 0, 0, 0, &poolPage, &offset, &address);
       }},
      {"kvc_get_page_format",
       [&] { return kvc_get_page_format(f.ctx, 1, 0, 0, 0, &out); }},
      {"kvc_get_slot_location",
       [&] {
         return kvc_get_slot_location(f.ctx, 1, 0, 0, 0, &pageIndex,
                                      &pageOffset, &poolPage);
       }},
      {"kvc_get_metadata",
       [&] { return kvc_get_metadata(f.ctx, 1, 0, 1, &meta); }},
      // Device pool and full format: these fail, after settling.
      {"kvc_read_entry",
       [&] { return kvc_read_entry(f.ctx, 1, 0, 0, 0, 8, key, value); },
       KVC_STATUS_UNSUPPORTED},
      {"kvc_kivi_pending_work",
       [&] { return kvc_kivi_pending_work(f.ctx, 1, 0, 0, &work); },
       KVC_STATUS_UNSUPPORTED},
      {"kvc_kivi_step_work",
       [&] { return kvc_kivi_step_work(f.ctx, 0, 1, &sequenceOne, works); },
       KVC_STATUS_UNSUPPORTED},
      {"kvc_append",
       [&] {
         return kvc_append(f.ctx, 1, 0, 1, 1, 8, nullptr, nullptr, &position,
                           nullptr);
       }},
      {"kvc_append_format",
       [&] {
         return kvc_append_format(f.ctx, 1, 0, 1, KVC_FORMAT_FULL, 1, 8,
                                  nullptr, nullptr, &position, nullptr);
       }},
      {"kvc_evict", [&] { return kvc_evict(f.ctx, 1, 0, 1, 1, &slot); }},
      {"kvc_compact",
       [&] {
         return kvc_compact(f.ctx, 1, 0, 1, 0.5f, moves, 8, &numMoves,
                            &released);
       }},
      {"kvc_set_budget", [&] { return kvc_set_budget(f.ctx, 1, 0, 1, 64); }},
  };
  for (const Call &call : calls) {
    log.clear();
    ASSERT_EQ(kvc_attach(f.ctx, 1, 0, &a), KVC_STATUS_OK);
    EXPECT_EQ(call.run(), call.expected) << call.what << ": "
                                         << kvc_last_error();
    EXPECT_EQ(log, settled) << call.what;
  }
}

TEST(Attachment, PoolQueriesSettleEveryRecord) {
  Fixture f(deviceConfig());
  ASSERT_EQ(kvc_sequence_add(f.ctx, 1), KVC_STATUS_OK);
  ASSERT_EQ(kvc_sequence_add(f.ctx, 2), KVC_STATUS_OK);
  appendOne(f.ctx);
  std::vector<std::string> log;
  Record r{&log};
  const kvc_attachment_t a = attachmentOf(r);
  for (int round = 0; round < 2; ++round) {
    log.clear();
    ASSERT_EQ(kvc_attach(f.ctx, 1, 1, &a), KVC_STATUS_OK);
    ASSERT_EQ(kvc_attach(f.ctx, 2, 0, &a), KVC_STATUS_OK);
    if (round == 0) {
      kvc_pool_stats_t stats;
      ASSERT_EQ(kvc_pool_stats(f.ctx, &stats), KVC_STATUS_OK)
          << kvc_last_error();
    } else {
      ASSERT_EQ(kvc_pool_check(f.ctx), KVC_STATUS_OK) << kvc_last_error();
    }
    std::vector<std::string> flushed;
    for (const std::string &line : log)
      if (line != "release")
        flushed.push_back(line);
    std::sort(flushed.begin(), flushed.end());
    EXPECT_EQ(flushed, (std::vector<std::string>{"flush 1/1", "flush 2/0"}))
        << "round " << round;
    EXPECT_EQ(log.size(), 4u) << "round " << round;
  }
}

TEST(Attachment, QueriesReportWhatTheFlushEvicted) {
  Fixture f(deviceConfig());
  ASSERT_EQ(kvc_sequence_add(f.ctx, 1), KVC_STATUS_OK);
  appendOne(f.ctx, 7);
  appendOne(f.ctx, 8);
  std::vector<std::string> log;
  Record r{&log};
  r.evictOnFlush = true;
  const kvc_attachment_t a = attachmentOf(r);
  ASSERT_EQ(kvc_attach(f.ctx, 1, 0, &a), KVC_STATUS_OK);
  // The entry at position 7 (slot 0) is gone by the time the count is read.
  int32_t entries = 0;
  ASSERT_EQ(kvc_get_num_entries(f.ctx, 1, 0, 0, &entries), KVC_STATUS_OK)
      << kvc_last_error();
  EXPECT_EQ(entries, 1);
  EXPECT_EQ(log, (std::vector<std::string>{"flush 1/0", "release"}));
  kvc_metadata_t m;
  ASSERT_EQ(kvc_get_metadata(f.ctx, 1, 0, 0, &m), KVC_STATUS_OK);
  EXPECT_EQ(m.position[0], KVC_POSITION_NONE);
  EXPECT_EQ(m.position[1], 8);
  kvc_pool_stats_t stats;
  ASSERT_EQ(kvc_pool_stats(f.ctx, &stats), KVC_STATUS_OK);
  EXPECT_EQ(stats.live_entries, 1);
}

TEST(Attachment, FailedFlushFailsTheCallAndChangesNothingElse) {
  Fixture f(deviceConfig());
  ASSERT_EQ(kvc_sequence_add(f.ctx, 1), KVC_STATUS_OK);
  appendOne(f.ctx);
  std::vector<std::string> log;
  Record r{&log};
  r.flushStatus = KVC_STATUS_INTERNAL;
  const kvc_attachment_t a = attachmentOf(r);
  const Snapshot before = snapshot(f.ctx, {1});
  ASSERT_EQ(kvc_attach(f.ctx, 1, 0, &a), KVC_STATUS_OK);
  int32_t position = 9;
  EXPECT_EQ(kvc_append(f.ctx, 1, 0, 0, 1, 8, nullptr, nullptr, &position,
                       nullptr),
            KVC_STATUS_INTERNAL);
  EXPECT_STREQ(kvc_last_error(), "record: flush failed");
  EXPECT_EQ(log, (std::vector<std::string>{"flush 1/0", "release"}));
  EXPECT_TRUE(snapshot(f.ctx, {1}) == before);
}

TEST(Attachment, AttachSettlesTheRecordBeforeIt) {
  Fixture f(deviceConfig());
  ASSERT_EQ(kvc_sequence_add(f.ctx, 1), KVC_STATUS_OK);
  std::vector<std::string> log;
  Record first{&log}, second{&log};
  const kvc_attachment_t a = attachmentOf(first), b = attachmentOf(second);
  ASSERT_EQ(kvc_attach(f.ctx, 1, 0, &a), KVC_STATUS_OK);
  ASSERT_EQ(kvc_attach(f.ctx, 1, 0, &b), KVC_STATUS_OK);
  EXPECT_EQ(log, (std::vector<std::string>{"flush 1/0", "release"}));
  kvc_attachment_t taken{};
  ASSERT_EQ(kvc_detach(f.ctx, 1, 0, &taken), KVC_STATUS_OK);
  EXPECT_EQ(taken.data, &second);
  EXPECT_EQ(taken.flush, &flushRecord);
  EXPECT_EQ(taken.release, &releaseRecord);
  // Detached: the caller owns it, the runtime no longer calls it.
  kvc_metadata_t m;
  ASSERT_EQ(kvc_get_metadata(f.ctx, 1, 0, 0, &m), KVC_STATUS_OK);
  EXPECT_EQ(log.size(), 2u);
}

TEST(Attachment, RemovalAndDestructionReleaseWithoutFlushing) {
  std::vector<std::string> log;
  Record r1{&log}, r2{&log}, r3{&log};
  {
    Fixture f(deviceConfig());
    ASSERT_EQ(kvc_sequence_add(f.ctx, 1), KVC_STATUS_OK);
    ASSERT_EQ(kvc_sequence_add(f.ctx, 2), KVC_STATUS_OK);
    const kvc_attachment_t a = attachmentOf(r1), b = attachmentOf(r2),
                           c = attachmentOf(r3);
    ASSERT_EQ(kvc_attach(f.ctx, 1, 0, &a), KVC_STATUS_OK);
    ASSERT_EQ(kvc_attach(f.ctx, 1, 1, &b), KVC_STATUS_OK);
    ASSERT_EQ(kvc_attach(f.ctx, 2, 1, &c), KVC_STATUS_OK);
    ASSERT_EQ(kvc_sequence_remove(f.ctx, 1), KVC_STATUS_OK);
    EXPECT_EQ(log, (std::vector<std::string>{"release", "release"}));
    log.clear();
  }
  EXPECT_EQ(log, (std::vector<std::string>{"release"}));
}

TEST(Attachment, ArgumentsAreChecked) {
  Fixture f(deviceConfig());
  ASSERT_EQ(kvc_sequence_add(f.ctx, 1), KVC_STATUS_OK);
  kvc_attachment_t a{};
  EXPECT_EQ(kvc_attach(f.ctx, 1, 0, nullptr), KVC_STATUS_NULL_POINTER);
  EXPECT_STREQ(kvc_last_error(), "kvc_attach: attachment is NULL");
  EXPECT_EQ(kvc_attach(f.ctx, 1, 2, &a), KVC_STATUS_OUT_OF_RANGE);
  EXPECT_STREQ(kvc_last_error(), "kvc_attach: layer 2 out of range [0, 2)");
  EXPECT_EQ(kvc_detach(f.ctx, 3, 0, &a), KVC_STATUS_OUT_OF_RANGE);
  EXPECT_STREQ(kvc_last_error(), "kvc_detach: unknown sequence 3");
  EXPECT_EQ(kvc_detach(nullptr, 1, 0, &a), KVC_STATUS_NULL_POINTER);
  EXPECT_EQ(kvc_detach(f.ctx, 1, 0, nullptr), KVC_STATUS_NULL_POINTER);
}

} // namespace
