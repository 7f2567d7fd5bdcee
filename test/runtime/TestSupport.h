//===- TestSupport.h - Shared helpers of the runtime tests ------*- C++ -*-===//
//
// An aligned pool buffer that owns the engine-side memory, a context
// wrapper, and a snapshot of everything observable about a context so that
// tests can assert that a failed call changed nothing.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TEST_RUNTIME_TESTSUPPORT_H
#define KVC_TEST_RUNTIME_TESTSUPPORT_H

#include "runtime/kvc_runtime.h"

#include "gtest/gtest.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

namespace kvc::test {

/// Engine-owned pool memory, aligned as the runtime requires.
struct PoolBuffer {
  void *data = nullptr;
  uint64_t bytes = 0;

  explicit PoolBuffer(uint64_t bytes) : bytes(bytes) {
    uint64_t rounded = (bytes + KVC_POOL_ALIGNMENT - 1) / KVC_POOL_ALIGNMENT *
                       KVC_POOL_ALIGNMENT;
    data = std::aligned_alloc(KVC_POOL_ALIGNMENT, rounded ? rounded : 256);
    // Poison so that reading never-written bytes shows up as garbage.
    std::memset(data, 0xA5, rounded ? rounded : 256);
  }
  ~PoolBuffer() { std::free(data); }
  PoolBuffer(const PoolBuffer &) = delete;
  PoolBuffer &operator=(const PoolBuffer &) = delete;
};

/// A small default geometry; tests override fields.
inline kvc_config_t smallConfig(kvc_format_t format = KVC_FORMAT_FULL) {
  kvc_config_t c{};
  c.num_layers = 2;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.dtype = KVC_DTYPE_F32;
  c.format = format;
  c.page_size = 4;
  c.group_size = 4;
  c.residual_length = 8;
  c.num_pages = 32;
  c.max_sequences = 4;
  c.memory = KVC_MEMORY_HOST;
  if (format == KVC_FORMAT_KIVI_INT2 || format == KVC_FORMAT_KIVI_INT4)
    c.page_size = 8;
  return c;
}

/// A context together with the pool it lives in.
struct Fixture {
  kvc_config_t config;
  std::unique_ptr<PoolBuffer> pool;
  kvc_context_t *ctx = nullptr;

  explicit Fixture(const kvc_config_t &config) : config(config) {
    uint64_t bytes = 0;
    EXPECT_EQ(kvc_pool_bytes_required(&config, &bytes), KVC_STATUS_OK)
        << kvc_last_error();
    pool = std::make_unique<PoolBuffer>(bytes);
    EXPECT_EQ(kvc_context_create(&config, pool->data, bytes, &ctx),
              KVC_STATUS_OK)
        << kvc_last_error();
  }
  ~Fixture() { kvc_context_destroy(ctx); }
  Fixture(const Fixture &) = delete;
  Fixture &operator=(const Fixture &) = delete;
};

/// Everything observable about one head.
struct HeadSnapshot {
  int32_t entries = 0;
  std::vector<int32_t> pages;
  std::vector<uint64_t> pageOffsets;
  std::vector<int32_t> position;
  std::vector<float> score, weight;
  std::vector<uint8_t> keyFormat, valueFormat;
  std::vector<float> data; // keys then values of live slots (host pools)

  bool operator==(const HeadSnapshot &o) const {
    return entries == o.entries && pages == o.pages &&
           pageOffsets == o.pageOffsets && position == o.position &&
           score == o.score && weight == o.weight && keyFormat == o.keyFormat &&
           valueFormat == o.valueFormat && data == o.data;
  }
};

/// Everything observable about a context for the given sequences.
struct Snapshot {
  kvc_pool_stats_t stats{};
  std::vector<HeadSnapshot> heads;

  bool operator==(const Snapshot &o) const {
    return std::memcmp(&stats, &o.stats, sizeof(stats)) == 0 &&
           heads == o.heads;
  }
};

inline Snapshot snapshot(kvc_context_t *ctx,
                         const std::vector<uint64_t> &sequences) {
  Snapshot s;
  kvc_config_t c;
  EXPECT_EQ(kvc_context_config(ctx, &c), KVC_STATUS_OK);
  EXPECT_EQ(kvc_pool_stats(ctx, &s.stats), KVC_STATUS_OK);
  for (uint64_t seq : sequences)
    for (int32_t layer = 0; layer < c.num_layers; ++layer)
      for (int32_t head = 0; head < c.num_kv_heads; ++head) {
        HeadSnapshot h;
        EXPECT_EQ(kvc_get_num_entries(ctx, seq, layer, head, &h.entries),
                  KVC_STATUS_OK);
        int32_t pages = 0;
        EXPECT_EQ(kvc_get_num_pages(ctx, seq, layer, head, &pages),
                  KVC_STATUS_OK);
        for (int32_t p = 0; p < pages; ++p) {
          int32_t id = -2;
          uint64_t offset = 0;
          EXPECT_EQ(
              kvc_get_page(ctx, seq, layer, head, p, &id, &offset, nullptr),
              KVC_STATUS_OK);
          h.pages.push_back(id);
          h.pageOffsets.push_back(offset);
        }
        kvc_metadata_t m;
        EXPECT_EQ(kvc_get_metadata(ctx, seq, layer, head, &m), KVC_STATUS_OK);
        h.position.assign(m.position, m.position + m.num_slots);
        h.score.assign(m.score, m.score + m.num_slots);
        h.weight.assign(m.weight, m.weight + m.num_slots);
        h.keyFormat.assign(m.key_format, m.key_format + m.num_slots);
        h.valueFormat.assign(m.value_format, m.value_format + m.num_slots);
        if (c.memory == KVC_MEMORY_HOST)
          for (int32_t slot = 0; slot < m.num_slots; ++slot) {
            if (m.position[slot] == KVC_POSITION_NONE)
              continue;
            std::vector<float> k(c.head_dim), v(c.head_dim);
            EXPECT_EQ(kvc_read_entry(ctx, seq, layer, head, slot, c.head_dim,
                                     k.data(), v.data()),
                      KVC_STATUS_OK);
            h.data.insert(h.data.end(), k.begin(), k.end());
            h.data.insert(h.data.end(), v.begin(), v.end());
          }
        s.heads.push_back(std::move(h));
      }
  return s;
}

/// n floats drawn from N(0, 1).
inline std::vector<float> gaussian(std::mt19937 &rng, size_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> out(n);
  for (float &x : out)
    x = dist(rng);
  return out;
}

} // namespace kvc::test

#endif // KVC_TEST_RUNTIME_TESTSUPPORT_H
