//===- ErrorTest.cpp - Bad inputs: status, message, unchanged state -------===//
//
// Each bad input is sent to a populated context; the test checks the status
// code, that kvc_last_error() names the problem, and that a snapshot of all
// observable state (page tables, metadata, entry data, pool accounting) is
// unchanged.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_runtime.h"
#include "test/runtime/TestSupport.h"

#include "gtest/gtest.h"

#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

extern "C" int kvcCApiSmoke(void);

namespace {

using namespace kvc::test;

/// Asserts status and message; message fragments are matched loosely.
#define EXPECT_FAILS(call, code, fragment)                                     \
  do {                                                                         \
    kvc_status_t status = (call);                                              \
    EXPECT_EQ(status, code) << #call << ": " << kvc_last_error();              \
    EXPECT_NE(std::string(kvc_last_error()).find(fragment), std::string::npos) \
        << #call << " said: " << kvc_last_error();                             \
  } while (false)

class Populated : public ::testing::Test {
protected:
  Populated() : f(smallConfig(KVC_FORMAT_INT8)) {}

  void SetUp() override {
    ASSERT_EQ(kvc_sequence_add(f.ctx, 1), KVC_STATUS_OK);
    ASSERT_EQ(kvc_sequence_add(f.ctx, 2), KVC_STATUS_OK);
    std::vector<float> kv(6 * 8);
    for (size_t i = 0; i < kv.size(); ++i)
      kv[i] = static_cast<float>(i % 7) - 3.0f;
    int32_t pos[6] = {0, 1, 2, 3, 4, 5};
    ASSERT_EQ(
        kvc_append(f.ctx, 1, 0, 0, 6, 8, kv.data(), kv.data(), pos, nullptr),
        KVC_STATUS_OK);
    ASSERT_EQ(
        kvc_append(f.ctx, 2, 1, 1, 3, 8, kv.data(), kv.data(), pos, nullptr),
        KVC_STATUS_OK);
    int32_t two = 2;
    ASSERT_EQ(kvc_evict(f.ctx, 1, 0, 0, 1, &two), KVC_STATUS_OK);
    before = snapshot(f.ctx, {1, 2});
  }

  void TearDown() override {
    EXPECT_TRUE(snapshot(f.ctx, {1, 2}) == before)
        << "a failed call changed the context";
    EXPECT_EQ(kvc_pool_check(f.ctx), KVC_STATUS_OK);
  }

  Fixture f;
  Snapshot before;
  float key[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  float value[8] = {8, 7, 6, 5, 4, 3, 2, 1};
};

TEST_F(Populated, NullPointers) {
  int32_t n, pos = 9;
  EXPECT_FAILS(kvc_get_num_entries(nullptr, 1, 0, 0, &n),
               KVC_STATUS_NULL_POINTER, "context is NULL");
  EXPECT_FAILS(kvc_get_num_entries(f.ctx, 1, 0, 0, nullptr),
               KVC_STATUS_NULL_POINTER, "num_entries is NULL");
  EXPECT_FAILS(kvc_get_num_slots(f.ctx, 1, 0, 0, nullptr),
               KVC_STATUS_NULL_POINTER, "kvc_get_num_slots: num_slots is NULL");
  EXPECT_FAILS(kvc_get_num_pages(f.ctx, 1, 0, 0, nullptr),
               KVC_STATUS_NULL_POINTER, "kvc_get_num_pages: num_pages is NULL");
  EXPECT_FAILS(kvc_get_num_pages(f.ctx, 1, 0, 99, &n), KVC_STATUS_OUT_OF_RANGE,
               "kvc_get_num_pages: kv head 99 out of range");
  EXPECT_FAILS(kvc_append(f.ctx, 1, 0, 0, 1, 8, nullptr, value, &pos, nullptr),
               KVC_STATUS_NULL_POINTER, "keys is NULL");
  EXPECT_FAILS(kvc_append(f.ctx, 1, 0, 0, 1, 8, key, value, nullptr, nullptr),
               KVC_STATUS_NULL_POINTER, "positions is NULL");
  EXPECT_FAILS(kvc_evict(f.ctx, 1, 0, 0, 1, nullptr), KVC_STATUS_NULL_POINTER,
               "slots is NULL");
  EXPECT_FAILS(kvc_read_entry(f.ctx, 1, 0, 0, 0, 8, nullptr, value),
               KVC_STATUS_NULL_POINTER, "key is NULL");
  EXPECT_FAILS(kvc_write_entry(f.ctx, 1, 0, 0, 0, 8, nullptr, nullptr),
               KVC_STATUS_NULL_POINTER, "both NULL");
  EXPECT_FAILS(kvc_get_metadata(f.ctx, 1, 0, 0, nullptr),
               KVC_STATUS_NULL_POINTER, "metadata is NULL");
  EXPECT_FAILS(kvc_pool_stats(f.ctx, nullptr), KVC_STATUS_NULL_POINTER,
               "stats is NULL");
  int32_t moves = 0;
  EXPECT_FAILS(kvc_compact(f.ctx, 1, 0, 0, 0.5f, nullptr, 0, &moves, nullptr),
               KVC_STATUS_NULL_POINTER, "pages_released");
  EXPECT_FAILS(kvc_sequence_add(nullptr, 3), KVC_STATUS_NULL_POINTER,
               "context is NULL");
  EXPECT_FAILS(kvc_clear_layer(nullptr, 1, 0), KVC_STATUS_NULL_POINTER,
               "kvc_clear_layer: context is NULL");
  EXPECT_FAILS(kvc_pack_bits(nullptr, 4, 4, nullptr), KVC_STATUS_NULL_POINTER,
               "codes is NULL");
}

TEST_F(Populated, OutOfRange) {
  int32_t n = 0, pos = 9;
  EXPECT_FAILS(kvc_get_num_entries(f.ctx, 77, 0, 0, &n),
               KVC_STATUS_OUT_OF_RANGE, "unknown sequence 77");
  EXPECT_FAILS(kvc_get_num_entries(f.ctx, 1, 2, 0, &n), KVC_STATUS_OUT_OF_RANGE,
               "layer 2 out of range [0, 2)");
  EXPECT_FAILS(kvc_get_num_entries(f.ctx, 1, -1, 0, &n),
               KVC_STATUS_OUT_OF_RANGE, "layer -1");
  EXPECT_FAILS(kvc_append(f.ctx, 1, 0, 2, 1, 8, key, value, &pos, nullptr),
               KVC_STATUS_OUT_OF_RANGE, "kv head 2 out of range [0, 2)");
  int32_t slot = 8;
  EXPECT_FAILS(kvc_evict(f.ctx, 1, 0, 0, 1, &slot), KVC_STATUS_OUT_OF_RANGE,
               "slot 8 out of range [0, 8)");
  slot = 2; // evicted in SetUp
  EXPECT_FAILS(kvc_evict(f.ctx, 1, 0, 0, 1, &slot), KVC_STATUS_OUT_OF_RANGE,
               "slot 2 is free");
  // One bad slot in a batch: nothing of the batch is evicted.
  int32_t batch[3] = {0, 1, 40};
  EXPECT_FAILS(kvc_evict(f.ctx, 1, 0, 0, 3, batch), KVC_STATUS_OUT_OF_RANGE,
               "slot 40");
  EXPECT_FAILS(kvc_read_entry(f.ctx, 1, 0, 0, 7, 8, key, value),
               KVC_STATUS_OUT_OF_RANGE, "slot 7 is free");
  EXPECT_FAILS(kvc_write_entry(f.ctx, 1, 0, 0, -1, 8, key, value),
               KVC_STATUS_OUT_OF_RANGE, "slot -1");
  EXPECT_FAILS(kvc_get_page(f.ctx, 1, 0, 0, 2, nullptr, nullptr, nullptr),
               KVC_STATUS_OUT_OF_RANGE, "page 2 out of range [0, 2)");
  EXPECT_FAILS(
      kvc_get_slot_location(f.ctx, 1, 0, 0, 8, nullptr, nullptr, nullptr),
      KVC_STATUS_OUT_OF_RANGE, "slot 8");
  EXPECT_FAILS(kvc_sequence_remove(f.ctx, 3), KVC_STATUS_OUT_OF_RANGE,
               "unknown sequence 3");
  EXPECT_FAILS(kvc_clear_layer(f.ctx, 3, 0), KVC_STATUS_OUT_OF_RANGE,
               "kvc_clear_layer: unknown sequence 3");
  EXPECT_FAILS(kvc_clear_layer(f.ctx, 1, 2), KVC_STATUS_OUT_OF_RANGE,
               "kvc_clear_layer: layer 2 out of range [0, 2)");
  EXPECT_FAILS(kvc_clear_layer(f.ctx, 1, -1), KVC_STATUS_OUT_OF_RANGE,
               "kvc_clear_layer: layer -1 out of range [0, 2)");
}

TEST_F(Populated, GeometryMismatch) {
  int32_t pos = 9;
  EXPECT_FAILS(kvc_append(f.ctx, 1, 0, 0, 1, 16, key, value, &pos, nullptr),
               KVC_STATUS_GEOMETRY_MISMATCH,
               "dim 16 does not match head_dim 8");
  EXPECT_FAILS(kvc_read_entry(f.ctx, 1, 0, 0, 0, 4, key, value),
               KVC_STATUS_GEOMETRY_MISMATCH, "dim 4");
  EXPECT_FAILS(kvc_write_entry(f.ctx, 1, 0, 0, 0, 7, key, value),
               KVC_STATUS_GEOMETRY_MISMATCH, "dim 7");
}

TEST_F(Populated, InvalidArguments) {
  int32_t pos = -4;
  EXPECT_FAILS(kvc_append(f.ctx, 1, 0, 0, 1, 8, key, value, &pos, nullptr),
               KVC_STATUS_INVALID_ARGUMENT, "positions[0] = -4 is negative");
  pos = 9;
  EXPECT_FAILS(kvc_append(f.ctx, 1, 0, 0, 0, 8, key, value, &pos, nullptr),
               KVC_STATUS_INVALID_ARGUMENT, "count must be > 0");
  float bad[8] = {1, 2, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_FAILS(kvc_append(f.ctx, 1, 0, 0, 1, 8, bad, value, &pos, nullptr),
               KVC_STATUS_INVALID_ARGUMENT, "keys[2] is not finite");
  int32_t dup[2] = {1, 1};
  EXPECT_FAILS(kvc_evict(f.ctx, 1, 0, 0, 2, dup), KVC_STATUS_INVALID_ARGUMENT,
               "duplicates");
  int32_t moves = 0, released = 0;
  EXPECT_FAILS(kvc_compact(f.ctx, 1, 0, 0, 1.5f, nullptr, 0, &moves, &released),
               KVC_STATUS_INVALID_ARGUMENT, "max_occupancy");
  EXPECT_FAILS(kvc_set_budget(f.ctx, 1, 0, 0, -3), KVC_STATUS_INVALID_ARGUMENT,
               "budget must be");
  EXPECT_FAILS(kvc_set_budget(f.ctx, 1, 0, 0, 2), KVC_STATUS_INVALID_ARGUMENT,
               "below the 5 live entries");
  EXPECT_FAILS(kvc_sequence_add(f.ctx, 1), KVC_STATUS_ALREADY_EXISTS,
               "sequence 1 exists");
}

TEST_F(Populated, Misaligned) {
  alignas(8) unsigned char raw[64] = {};
  const float *shifted = reinterpret_cast<const float *>(raw + 1);
  int32_t pos = 9;
  EXPECT_FAILS(kvc_append(f.ctx, 1, 0, 0, 1, 8, shifted, value, &pos, nullptr),
               KVC_STATUS_MISALIGNED, "keys is not 4-byte aligned");
  alignas(8) unsigned char slotBytes[8] = {};
  EXPECT_FAILS(kvc_evict(f.ctx, 1, 0, 0, 1,
                         reinterpret_cast<const int32_t *>(slotBytes + 2)),
               KVC_STATUS_MISALIGNED, "not 4-byte aligned");
}

TEST_F(Populated, BudgetAndPool) {
  EXPECT_FAILS(kvc_set_budget(f.ctx, 2, 0, 0, 1000),
               KVC_STATUS_BUDGET_OVER_CAPACITY,
               "budget 1000 exceeds the pool's 128 slots");
  // 32 pages of 4 slots; 3 pages are mapped. 120 more entries need 30 pages
  // but only 29 are free: nothing may be allocated.
  std::vector<float> kv(120 * 8, 0.25f);
  std::vector<int32_t> pos(120, 3);
  EXPECT_FAILS(kvc_append(f.ctx, 2, 0, 1, 120, 8, kv.data(), kv.data(),
                          pos.data(), nullptr),
               KVC_STATUS_POOL_EXHAUSTED, "30 new pages needed, 29 free");
}

TEST_F(Populated, DevicePoolOperationsOnHost) {
  // Data-less appends are for device pools only.
  int32_t pos = 1;
  EXPECT_FAILS(
      kvc_append(f.ctx, 2, 0, 0, 1, 8, nullptr, nullptr, &pos, nullptr),
      KVC_STATUS_NULL_POINTER, "keys is NULL");
}

TEST(Errors, ContextCreation) {
  kvc_config_t c = smallConfig();
  uint64_t bytes = 0;
  ASSERT_EQ(kvc_pool_bytes_required(&c, &bytes), KVC_STATUS_OK);
  PoolBuffer pool(bytes + 512);
  kvc_context_t *ctx = reinterpret_cast<kvc_context_t *>(0x1);
  EXPECT_FAILS(kvc_context_create(nullptr, pool.data, bytes, &ctx),
               KVC_STATUS_NULL_POINTER, "config is NULL");
  EXPECT_FAILS(kvc_context_create(&c, nullptr, bytes, &ctx),
               KVC_STATUS_NULL_POINTER, "pool is NULL");
  EXPECT_FAILS(
      kvc_context_create(&c, static_cast<char *>(pool.data) + 64, bytes, &ctx),
      KVC_STATUS_MISALIGNED, "not aligned to 256");
  EXPECT_FAILS(kvc_context_create(&c, pool.data, bytes - 1, &ctx),
               KVC_STATUS_BUFFER_TOO_SMALL, "the configuration needs");
  EXPECT_EQ(ctx, reinterpret_cast<kvc_context_t *>(0x1)) << "out written";

  kvc_config_t bad = c;
  bad.num_q_heads = 5;
  EXPECT_FAILS(kvc_context_create(&bad, pool.data, bytes, &ctx),
               KVC_STATUS_GEOMETRY_MISMATCH, "num_q_heads 5");
  bad = c;
  bad.head_dim = 0;
  EXPECT_FAILS(kvc_pool_bytes_required(&bad, &bytes),
               KVC_STATUS_INVALID_ARGUMENT, "head_dim must be > 0");
  bad = c;
  bad.dtype = 9; // any int may arrive from C
  EXPECT_FAILS(kvc_pool_bytes_required(&bad, &bytes),
               KVC_STATUS_INVALID_ARGUMENT, "unknown dtype 9");
  bad = smallConfig(KVC_FORMAT_KIVI_INT4);
  bad.group_size = 3;
  EXPECT_FAILS(kvc_pool_bytes_required(&bad, &bytes),
               KVC_STATUS_GEOMETRY_MISMATCH, "group 3 does not divide");
  bad = smallConfig(KVC_FORMAT_KIVI_INT4);
  bad.page_size = 6;
  EXPECT_FAILS(kvc_pool_bytes_required(&bad, &bytes),
               KVC_STATUS_GEOMETRY_MISMATCH, "page_size 6");
  bad = smallConfig(KVC_FORMAT_KIVI_INT4);
  bad.residual_length = 6;
  EXPECT_FAILS(kvc_pool_bytes_required(&bad, &bytes),
               KVC_STATUS_GEOMETRY_MISMATCH, "residual 6");
  bad = c;
  bad.format = -2;
  EXPECT_FAILS(kvc_pool_bytes_required(&bad, &bytes),
               KVC_STATUS_INVALID_ARGUMENT, "unknown format -2");
  bad = c;
  bad.memory = 7;
  EXPECT_FAILS(kvc_pool_bytes_required(&bad, &bytes),
               KVC_STATUS_INVALID_ARGUMENT, "unknown memory kind 7");
  bad = c;
  bad.num_pages = 1 << 30;
  EXPECT_FAILS(kvc_pool_bytes_required(&bad, &bytes),
               KVC_STATUS_INVALID_ARGUMENT, "2^31-1");
}

TEST(Errors, SequenceCapacity) {
  kvc_config_t c = smallConfig();
  c.max_sequences = 2;
  Fixture f(c);
  ASSERT_EQ(kvc_sequence_add(f.ctx, 100), KVC_STATUS_OK);
  ASSERT_EQ(kvc_sequence_add(f.ctx, 200), KVC_STATUS_OK);
  EXPECT_FAILS(kvc_sequence_add(f.ctx, 300), KVC_STATUS_POOL_EXHAUSTED,
               "all 2 sequences");
  ASSERT_EQ(kvc_sequence_remove(f.ctx, 100), KVC_STATUS_OK);
  EXPECT_EQ(kvc_sequence_add(f.ctx, 300), KVC_STATUS_OK);
}

TEST(Errors, Quantizers) {
  float x[4] = {1, 2, 3, 4}, scale, min;
  uint8_t codes[4] = {0, 1, 2, 3}, packed[4];
  EXPECT_FAILS(kvc_pack_bits(codes, 4, 3, packed), KVC_STATUS_INVALID_ARGUMENT,
               "bits must be 2, 4 or 8 (got 3)");
  codes[2] = 4;
  EXPECT_FAILS(kvc_pack_bits(codes, 4, 2, packed), KVC_STATUS_INVALID_ARGUMENT,
               "code 4 at index 2 does not fit in 2 bits");
  EXPECT_FAILS(kvc_quantize_asym(x, 0, 4, codes, &scale, &min),
               KVC_STATUS_INVALID_ARGUMENT, "count must be > 0");
  float s[2], m[2];
  EXPECT_FAILS(kvc_kivi_quantize_value(x, 4, 3, 4, packed, s, m),
               KVC_STATUS_GEOMETRY_MISMATCH, "group 3 does not divide dim 4");
  EXPECT_FAILS(kvc_kivi_quantize_keys(x, 1, 3, 2, packed, s, m),
               KVC_STATUS_GEOMETRY_MISMATCH, "whole number of bytes");
  alignas(8) unsigned char raw[32] = {};
  EXPECT_FAILS(kvc_quantize_int8(reinterpret_cast<float *>(raw + 2), 2,
                                 reinterpret_cast<int8_t *>(packed), &scale),
               KVC_STATUS_MISALIGNED, "x is not 4-byte aligned");
  float inf[2] = {1, std::numeric_limits<float>::infinity()};
  EXPECT_FAILS(kvc_quantize_fp8_e4m3(inf, 2, packed, &scale),
               KVC_STATUS_INVALID_ARGUMENT, "x[1] is not finite");
}

TEST(Errors, CallableFromC) { EXPECT_EQ(kvcCApiSmoke(), 0); }

TEST(Errors, GeneratedCodeReportsThroughTheRuntime) {
  EXPECT_EQ(kvc_report_error(KVC_STATUS_OUT_OF_RANGE, "policy: head 9"),
            KVC_STATUS_OUT_OF_RANGE);
  EXPECT_STREQ(kvc_last_error(), "policy: head 9");
  EXPECT_EQ(kvc_report_error(KVC_STATUS_INTERNAL, nullptr),
            KVC_STATUS_INTERNAL);
  EXPECT_STREQ(kvc_last_error(), "");
}

TEST(Errors, BatchChecks) {
  const uint64_t small[] = {4, 9, 4, 9};
  EXPECT_EQ(kvc_check_batch("entry", 4, small), KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(kvc_last_error(),
               "entry: sequence 4 appears twice in the batch (index 2)");
  EXPECT_EQ(kvc_check_batch("entry", 0, small), KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(kvc_last_error(), "entry: the batch is empty");
  EXPECT_EQ(kvc_check_batch("entry", 2, nullptr), KVC_STATUS_NULL_POINTER);
  EXPECT_STREQ(kvc_last_error(), "entry: sequences is NULL");
  EXPECT_EQ(kvc_check_batch(nullptr, -1, small), KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(kvc_last_error(), "kvc_check_batch: the batch is empty");
  EXPECT_EQ(kvc_check_batch("entry", 2, small), KVC_STATUS_OK);
  EXPECT_STREQ(kvc_last_error(), "");

  // Past 16 sequences the check sorts a copy; it names the same first
  // repeat as the side-by-side comparison would, and leaves the list as it
  // was.
  std::vector<uint64_t> ids(300);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = 1000003 * (i + 1) % 7919; // distinct (i + 1 < 7919), unsorted
  const std::vector<uint64_t> copy = ids;
  EXPECT_EQ(kvc_check_batch("entry", 300, ids.data()), KVC_STATUS_OK);
  EXPECT_EQ(ids, copy);
  ids[250] = ids[3];   // repeats ids[3] at 250
  ids[299] = ids[180]; // repeats ids[180] at 299
  ids[200] = ids[41];  // the first repeat: index 200
  EXPECT_EQ(kvc_check_batch("entry", 300, ids.data()),
            KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(kvc_last_error()),
            "entry: sequence " + std::to_string(ids[41]) +
                " appears twice in the batch (index 200)");
  // A sequence three times: its second listing is the repeat.
  ids[10] = ids[5];
  ids[7] = ids[5];
  EXPECT_EQ(kvc_check_batch("entry", 300, ids.data()),
            KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(kvc_last_error()),
            "entry: sequence " + std::to_string(ids[5]) +
                " appears twice in the batch (index 7)");
  for (int32_t batch : {16, 17, 1000}) {
    std::vector<uint64_t> same(batch, 77);
    same[0] = 5;
    EXPECT_EQ(kvc_check_batch("entry", batch, same.data()),
              KVC_STATUS_INVALID_ARGUMENT);
    EXPECT_STREQ(kvc_last_error(),
                 "entry: sequence 77 appears twice in the batch (index 2)");
  }
}

TEST(Errors, LastErrorIsPerThread) {
  // Two threads fail differently at the same time; each reads its own
  // message, and the main thread's message is untouched.
  kvc_config_t c = smallConfig();
  c.head_dim = 0;
  uint64_t bytes;
  ASSERT_EQ(kvc_pool_bytes_required(&c, &bytes), KVC_STATUS_INVALID_ARGUMENT);
  std::string mainMessage = kvc_last_error();
  std::string first, second;
  std::thread a([&] {
    kvc_config_t bad = smallConfig();
    bad.num_layers = -1;
    for (int i = 0; i < 1000; ++i)
      kvc_pool_bytes_required(&bad, &bytes);
    first = kvc_last_error();
  });
  std::thread b([&] {
    int32_t n;
    for (int i = 0; i < 1000; ++i)
      kvc_get_num_entries(nullptr, 0, 0, 0, &n);
    second = kvc_last_error();
  });
  a.join();
  b.join();
  EXPECT_NE(first.find("num_layers must be > 0 (got -1)"), std::string::npos);
  EXPECT_NE(second.find("context is NULL"), std::string::npos);
  EXPECT_EQ(mainMessage, kvc_last_error());
  EXPECT_NE(mainMessage.find("head_dim must be > 0"), std::string::npos);
}

TEST(Errors, StatusStringsAndLastError) {
  for (int code = KVC_STATUS_OK; code <= KVC_STATUS_INTERNAL; ++code) {
    std::string name = kvc_status_string(code);
    EXPECT_EQ(name.rfind("KVC_STATUS_", 0), 0u);
    EXPECT_NE(name, "KVC_STATUS_UNKNOWN") << code;
  }
  EXPECT_STREQ(kvc_status_string(KVC_STATUS_POOL_EXHAUSTED),
               "KVC_STATUS_POOL_EXHAUSTED");
  EXPECT_STREQ(kvc_status_string(99), "KVC_STATUS_UNKNOWN");
  EXPECT_STREQ(kvc_status_string(-1), "KVC_STATUS_UNKNOWN");
  uint64_t bytes;
  EXPECT_NE(kvc_pool_bytes_required(nullptr, &bytes), KVC_STATUS_OK);
  EXPECT_STRNE(kvc_last_error(), "");
  kvc_config_t c = smallConfig();
  EXPECT_EQ(kvc_pool_bytes_required(&c, &bytes), KVC_STATUS_OK);
  EXPECT_STREQ(kvc_last_error(), ""); // success clears the message
  EXPECT_EQ(kvc_context_destroy(nullptr), KVC_STATUS_OK);
}

} // namespace
