//===- KiviDeviceTest.cpp - KIVI work recorded for device pools -----------===//
//
// A KIVI context over a device pool keeps the host pool's bookkeeping but
// only records the data work (kvc_kivi_pending_work). These tests drive the
// same appends, evictions and compactions on a host pool and on a device
// pool, check that both record the same work, and run the device pool's
// work with an executor written here from the public quantizers on a host
// buffer standing in for device memory (the runtime never touches it): its
// bytes must equal what the host pool's runtime wrote.
//
//===----------------------------------------------------------------------===//

#include "TestSupport.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using kvc::test::PoolBuffer;
using kvc::test::smallConfig;

int bitsOf(const kvc_config_t &c) {
  return c.format == KVC_FORMAT_KIVI_INT2 ? 2 : 4;
}

uint64_t elementBytes(const kvc_config_t &c) {
  return c.dtype == KVC_DTYPE_F32 ? 4 : 2;
}

/// A float as the context's dtype stores it.
float roundToDtype(int32_t dtype, float x) {
  if (dtype == KVC_DTYPE_F16)
    return kvc_f16_to_f32(kvc_f32_to_f16(x));
  if (dtype == KVC_DTYPE_BF16)
    return kvc_bf16_to_f32(kvc_f32_to_bf16(x));
  return x;
}

void storeRow(int32_t dtype, const float *x, int32_t n, uint8_t *out) {
  for (int32_t i = 0; i < n; ++i) {
    if (dtype == KVC_DTYPE_F32) {
      std::memcpy(out + 4 * i, &x[i], 4);
    } else {
      uint16_t b = dtype == KVC_DTYPE_F16 ? kvc_f32_to_f16(x[i])
                                          : kvc_f32_to_bf16(x[i]);
      std::memcpy(out + 2 * i, &b, 2);
    }
  }
}

void loadRow(int32_t dtype, const uint8_t *in, int32_t n, float *x) {
  for (int32_t i = 0; i < n; ++i) {
    if (dtype == KVC_DTYPE_F32) {
      std::memcpy(&x[i], in + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, in + 2 * i, 2);
      x[i] = dtype == KVC_DTYPE_F16 ? kvc_f16_to_f32(b) : kvc_bf16_to_f32(b);
    }
  }
}

/// One side of the comparison: a context and the buffer its pool is in.
struct Side {
  kvc_config_t config;
  kvc_page_layout_t layout{};
  std::unique_ptr<PoolBuffer> pool;
  kvc_context_t *ctx = nullptr;

  Side(kvc_config_t c, int32_t memory) : config(c) {
    config.memory = memory;
    uint64_t bytes = 0;
    EXPECT_EQ(kvc_pool_bytes_required(&config, &bytes), KVC_STATUS_OK);
    EXPECT_EQ(kvc_page_layout(&config, &layout), KVC_STATUS_OK);
    pool = std::make_unique<PoolBuffer>(bytes);
    EXPECT_EQ(kvc_context_create(&config, pool->data, bytes, &ctx),
              KVC_STATUS_OK)
        << kvc_last_error();
    EXPECT_EQ(kvc_sequence_add(ctx, 1), KVC_STATUS_OK);
  }
  ~Side() { kvc_context_destroy(ctx); }

  uint8_t *page(int32_t head, int32_t slot) const {
    int32_t poolPage = -1;
    EXPECT_EQ(kvc_get_slot_location(ctx, 1, 0, head, slot, nullptr, nullptr,
                                    &poolPage),
              KVC_STATUS_OK);
    return static_cast<uint8_t *>(pool->data) + layout.pages_offset +
           static_cast<uint64_t>(poolPage) * layout.page_bytes;
  }
  uint8_t *keyRow(int32_t head, int32_t slot) const {
    return page(head, slot) + layout.key_offset +
           static_cast<uint64_t>(slot % config.page_size) * layout.key_stride;
  }
  uint8_t *valueRow(int32_t head, int32_t slot) const {
    return page(head, slot) + layout.value_offset +
           static_cast<uint64_t>(slot % config.page_size) *
               layout.value_stride;
  }
  uint8_t *keyRecord(int32_t head, int32_t slot) const {
    return page(head, slot) + layout.key_param_offset +
           static_cast<uint64_t>(slot % config.page_size / config.group_size) *
               layout.key_param_stride;
  }
  uint8_t *valueRecord(int32_t head, int32_t slot) const {
    return page(head, slot) + layout.value_param_offset +
           static_cast<uint64_t>(slot % config.page_size) *
               layout.value_param_stride;
  }
};

/// Does the recorded work of the device side's latest append, as a kernel
/// would: values and key blocks from their sources, then the stages.
void runWork(const Side &d, int32_t head, const std::vector<float> &keys,
             const std::vector<float> &values) {
  const kvc_config_t &c = d.config;
  const int32_t dim = c.head_dim, g = c.group_size, bits = bitsOf(c);
  kvc_kivi_work_t w{};
  ASSERT_EQ(kvc_kivi_pending_work(d.ctx, 1, 0, head, &w), KVC_STATUS_OK);
  const uint64_t rowBytes = static_cast<uint64_t>(dim) * elementBytes(c);
  auto *residual = static_cast<uint8_t *>(w.residual);
  auto source = [&](const kvc_kivi_row_t &r, bool key, float *out) {
    if (r.input >= 0) {
      const float *x = (key ? keys : values).data() +
                       static_cast<size_t>(r.input) * dim;
      for (int32_t i = 0; i < dim; ++i)
        out[i] = roundToDtype(c.dtype, x[i]);
      return;
    }
    const uint64_t row = static_cast<uint64_t>(r.residual_row) +
                         (key ? 0 : static_cast<uint64_t>(w.residual_length));
    loadRow(c.dtype, residual + row * rowBytes, dim, out);
  };
  std::vector<float> x(static_cast<size_t>(dim) * g), scales(dim), mins(dim);
  std::vector<uint8_t> packed(static_cast<size_t>(dim) * g);
  for (int32_t i = 0; i < w.num_values; ++i) {
    const kvc_kivi_row_t &r = w.values[i];
    source(r, false, x.data());
    ASSERT_EQ(kvc_kivi_quantize_value(x.data(), dim, g, bits, packed.data(),
                                      scales.data(), mins.data()),
              KVC_STATUS_OK);
    std::memcpy(d.valueRow(head, r.slot), packed.data(), d.layout.value_stride);
    // A page's {scale, min}: two f16 (the quantizer's values are).
    auto *record = reinterpret_cast<uint16_t *>(d.valueRecord(head, r.slot));
    for (int32_t k = 0; k < dim / g; ++k) {
      record[2 * k] = kvc_f32_to_f16(scales[k]);
      record[2 * k + 1] = kvc_f32_to_f16(mins[k]);
    }
  }
  for (int32_t b = 0; b < w.num_key_blocks; ++b) {
    const int32_t first = w.key_block_begin[b];
    const int32_t count = w.key_block_begin[b + 1] - first;
    ASSERT_GT(count, 0);
    ASSERT_LE(count, g);
    for (int32_t t = 0; t < count; ++t)
      source(w.key_members[first + t], true, &x[static_cast<size_t>(t) * dim]);
    ASSERT_EQ(kvc_kivi_quantize_keys(x.data(), count, dim, bits, packed.data(),
                                     scales.data(), mins.data()),
              KVC_STATUS_OK);
    const int32_t block = w.key_members[first].slot / g;
    for (int32_t t = 0; t < count; ++t) {
      const int32_t slot = w.key_members[first + t].slot;
      ASSERT_EQ(slot / g, block) << "a key block spans two blocks of slots";
      std::memcpy(d.keyRow(head, slot),
                  packed.data() + static_cast<size_t>(t) * d.layout.key_stride,
                  d.layout.key_stride);
    }
    auto *record = reinterpret_cast<uint16_t *>(
        d.keyRecord(head, w.key_members[first].slot));
    for (int32_t k = 0; k < dim; ++k) {
      record[2 * k] = kvc_f32_to_f16(scales[k]);
      record[2 * k + 1] = kvc_f32_to_f16(mins[k]);
    }
  }
  for (int32_t i = 0; i < w.num_stages; ++i) {
    const kvc_kivi_row_t &r = w.stages[i];
    ASSERT_GE(r.input, 0);
    const size_t at = static_cast<size_t>(r.input) * dim;
    storeRow(c.dtype, keys.data() + at, dim,
             residual + static_cast<uint64_t>(r.residual_row) * rowBytes);
    storeRow(c.dtype, values.data() + at, dim,
             residual + static_cast<uint64_t>(w.residual_length +
                                              r.residual_row) *
                            rowBytes);
  }
}

/// Copies what a device-pool move with copy_data asks for.
void runMove(const Side &d, const kvc_move_t &m) {
  if (!m.copy_data)
    return;
  const kvc_page_layout_t &l = d.layout;
  auto *base = static_cast<uint8_t *>(d.pool->data) + l.pages_offset;
  uint8_t *from = base + static_cast<uint64_t>(m.from_page) * l.page_bytes;
  uint8_t *to = base + static_cast<uint64_t>(m.to_page) * l.page_bytes;
  const uint64_t fo = static_cast<uint64_t>(m.from_offset);
  const uint64_t to_ = static_cast<uint64_t>(m.to_offset);
  const uint64_t g = static_cast<uint64_t>(d.config.group_size);
  std::memcpy(to + l.key_offset + to_ * l.key_stride,
              from + l.key_offset + fo * l.key_stride, l.key_stride);
  std::memcpy(to + l.value_offset + to_ * l.value_stride,
              from + l.value_offset + fo * l.value_stride, l.value_stride);
  std::memcpy(to + l.value_param_offset + to_ * l.value_param_stride,
              from + l.value_param_offset + fo * l.value_param_stride,
              l.value_param_stride);
  std::memcpy(to + l.key_param_offset + to_ / g * l.key_param_stride,
              from + l.key_param_offset + fo / g * l.key_param_stride,
              l.key_param_stride);
}

bool sameRow(const kvc_kivi_row_t &a, const kvc_kivi_row_t &b) {
  return a.slot == b.slot && a.residual_row == b.residual_row &&
         a.input == b.input;
}

void expectSameWork(const Side &host, const Side &device, int32_t head) {
  kvc_kivi_work_t a{}, b{};
  ASSERT_EQ(kvc_kivi_pending_work(host.ctx, 1, 0, head, &a), KVC_STATUS_OK);
  ASSERT_EQ(kvc_kivi_pending_work(device.ctx, 1, 0, head, &b), KVC_STATUS_OK);
  ASSERT_EQ(a.num_values, b.num_values);
  ASSERT_EQ(a.num_key_blocks, b.num_key_blocks);
  ASSERT_EQ(a.num_stages, b.num_stages);
  for (int32_t i = 0; i < a.num_values; ++i)
    EXPECT_TRUE(sameRow(a.values[i], b.values[i]));
  for (int32_t i = 0; i <= a.num_key_blocks; ++i)
    EXPECT_EQ(a.key_block_begin[i], b.key_block_begin[i]);
  for (int32_t i = 0; i < a.key_block_begin[a.num_key_blocks]; ++i)
    EXPECT_TRUE(sameRow(a.key_members[i], b.key_members[i]));
  for (int32_t i = 0; i < a.num_stages; ++i)
    EXPECT_TRUE(sameRow(a.stages[i], b.stages[i]));
  for (int32_t r = 0; r < a.residual_length; ++r)
    EXPECT_EQ(a.residual_slot[r], b.residual_slot[r]);
  EXPECT_EQ(a.residual_offset, b.residual_offset);
}

/// The device buffer holds what the host pool holds: every residual row
/// and, for every live entry, its quantized key (row and block record) and
/// value (row and record).
void expectSameBytes(const Side &host, const Side &device, int32_t head) {
  kvc_kivi_work_t w{};
  ASSERT_EQ(kvc_kivi_pending_work(host.ctx, 1, 0, head, &w), KVC_STATUS_OK);
  const uint64_t residualBytes = host.layout.residual_bytes;
  EXPECT_EQ(std::memcmp(static_cast<uint8_t *>(host.pool->data) +
                            w.residual_offset,
                        static_cast<uint8_t *>(device.pool->data) +
                            w.residual_offset,
                        residualBytes),
            0)
      << "residual window of head " << head;
  kvc_metadata_t m{}, md{};
  ASSERT_EQ(kvc_get_metadata(host.ctx, 1, 0, head, &m), KVC_STATUS_OK);
  ASSERT_EQ(kvc_get_metadata(device.ctx, 1, 0, head, &md), KVC_STATUS_OK);
  ASSERT_EQ(m.num_slots, md.num_slots);
  const kvc_page_layout_t &l = host.layout;
  for (int32_t s = 0; s < m.num_slots; ++s) {
    ASSERT_EQ(m.position[s], md.position[s]);
    ASSERT_EQ(m.key_format[s], md.key_format[s]);
    ASSERT_EQ(m.value_format[s], md.value_format[s]);
    if (m.position[s] == KVC_POSITION_NONE)
      continue;
    if (m.key_format[s] != KVC_FORMAT_FULL) {
      EXPECT_EQ(std::memcmp(host.keyRow(head, s), device.keyRow(head, s),
                            l.key_stride),
                0)
          << "key row of slot " << s << " head " << head;
      EXPECT_EQ(std::memcmp(host.keyRecord(head, s), device.keyRecord(head, s),
                            l.key_param_stride),
                0)
          << "key record of slot " << s;
    }
    if (m.value_format[s] != KVC_FORMAT_FULL) {
      EXPECT_EQ(std::memcmp(host.valueRow(head, s), device.valueRow(head, s),
                            l.value_stride),
                0)
          << "value row of slot " << s;
      EXPECT_EQ(std::memcmp(host.valueRecord(head, s),
                            device.valueRecord(head, s), l.value_param_stride),
                0)
          << "value record of slot " << s;
    }
  }
}

struct Case {
  kvc_format_t format;
  int32_t dtype;
  int32_t headDim, group, residual, pageSize;
};

class KiviDevice : public ::testing::TestWithParam<Case> {};

TEST_P(KiviDevice, RecordedWorkReproducesHostBytes) {
  const Case k = GetParam();
  kvc_config_t c = smallConfig(k.format);
  c.dtype = k.dtype;
  c.head_dim = k.headDim;
  c.group_size = k.group;
  c.residual_length = k.residual;
  c.page_size = k.pageSize;
  c.num_pages = 64;
  Side host(c, KVC_MEMORY_HOST), device(c, KVC_MEMORY_DEVICE);
  std::mt19937 rng(1234 + k.format * 7 + k.dtype);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int32_t position = 0;
  int64_t flushedValues = 0, flushedKeyBlocks = 0, copies = 0;
  for (int step = 0; step < 400; ++step) {
    const int32_t head = static_cast<int32_t>(rng() % 2);
    kvc_metadata_t m{};
    ASSERT_EQ(kvc_get_metadata(host.ctx, 1, 0, head, &m), KVC_STATUS_OK);
    std::vector<int32_t> live;
    for (int32_t s = 0; s < m.num_slots; ++s)
      if (m.position[s] != KVC_POSITION_NONE)
        live.push_back(s);
    const int action = static_cast<int>(rng() % 10);
    if (action < 5 || live.size() < 8) {
      // A prefill-sized append now and then, decode-sized ones mostly.
      const int32_t count =
          step % 23 == 0 ? 2 * k.residual + 5 : 1 + static_cast<int32_t>(rng() % 3);
      std::vector<float> keys(static_cast<size_t>(count) * c.head_dim),
          values(keys.size());
      for (float &x : keys)
        x = normal(rng);
      for (float &x : values)
        x = normal(rng);
      std::vector<int32_t> pos(count), slotsHost(count), slotsDevice(count);
      for (int32_t &p : pos)
        p = position++;
      ASSERT_EQ(kvc_append(host.ctx, 1, 0, head, count, c.head_dim,
                           keys.data(), values.data(), pos.data(),
                           slotsHost.data()),
                KVC_STATUS_OK)
          << kvc_last_error();
      ASSERT_EQ(kvc_append(device.ctx, 1, 0, head, count, c.head_dim, nullptr,
                           nullptr, pos.data(), slotsDevice.data()),
                KVC_STATUS_OK)
          << kvc_last_error();
      EXPECT_EQ(slotsHost, slotsDevice);
      expectSameWork(host, device, head);
      kvc_kivi_work_t w{};
      ASSERT_EQ(kvc_kivi_pending_work(device.ctx, 1, 0, head, &w),
                KVC_STATUS_OK);
      flushedValues += w.num_values;
      flushedKeyBlocks += w.num_key_blocks;
      runWork(device, head, keys, values);
    } else if (action < 8) {
      std::shuffle(live.begin(), live.end(), rng);
      const int32_t count = 1 + static_cast<int32_t>(rng() % 6);
      ASSERT_EQ(kvc_evict(host.ctx, 1, 0, head, count, live.data()),
                KVC_STATUS_OK)
          << kvc_last_error();
      ASSERT_EQ(kvc_evict(device.ctx, 1, 0, head, count, live.data()),
                KVC_STATUS_OK);
      kvc_kivi_work_t w{};
      ASSERT_EQ(kvc_kivi_pending_work(device.ctx, 1, 0, head, &w),
                KVC_STATUS_OK);
      EXPECT_EQ(w.num_values + w.num_key_blocks + w.num_stages, 0)
          << "eviction clears the recorded work";
    } else {
      std::vector<kvc_move_t> movesHost(512), movesDevice(512);
      int32_t nh = 0, nd = 0, rh = 0, rd = 0;
      ASSERT_EQ(kvc_compact(host.ctx, 1, 0, head, 0.75f, movesHost.data(), 512,
                            &nh, &rh),
                KVC_STATUS_OK)
          << kvc_last_error();
      ASSERT_EQ(kvc_compact(device.ctx, 1, 0, head, 0.75f, movesDevice.data(),
                            512, &nd, &rd),
                KVC_STATUS_OK);
      ASSERT_EQ(nh, nd);
      EXPECT_EQ(rh, rd);
      for (int32_t i = 0; i < nd; ++i) {
        EXPECT_EQ(movesHost[i].from_slot, movesDevice[i].from_slot);
        EXPECT_EQ(movesHost[i].to_slot, movesDevice[i].to_slot);
        copies += movesDevice[i].copy_data;
        runMove(device, movesDevice[i]);
      }
    }
    ASSERT_EQ(kvc_pool_check(device.ctx), KVC_STATUS_OK) << kvc_last_error();
    for (int32_t h = 0; h < 2; ++h)
      expectSameBytes(host, device, h);
    if (HasFailure())
      FAIL() << "diverged at step " << step;
  }
  // The walk exercised every kind of work.
  EXPECT_GT(flushedValues, 0);
  EXPECT_GT(flushedKeyBlocks, 0);
  EXPECT_GT(copies, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, KiviDevice,
    ::testing::Values(Case{KVC_FORMAT_KIVI_INT2, KVC_DTYPE_F32, 8, 4, 8, 8},
                      Case{KVC_FORMAT_KIVI_INT4, KVC_DTYPE_F16, 16, 4, 8, 8},
                      Case{KVC_FORMAT_KIVI_INT2, KVC_DTYPE_BF16, 32, 8, 16, 16},
                      Case{KVC_FORMAT_KIVI_INT4, KVC_DTYPE_F32, 16, 2, 4, 4}));

/// A KIVI int2 configuration over a device pool (R = 8, G = 4).
kvc_config_t deviceKiviConfig() {
  kvc_config_t c = smallConfig(KVC_FORMAT_KIVI_INT2);
  c.memory = KVC_MEMORY_DEVICE;
  return c;
}

/// An address no host code may touch: any dereference would crash.
void *const kUntouchable = reinterpret_cast<void *>(uintptr_t{1} << 44);

/// A context over the device pool of `c`, which lives at kUntouchable.
void createDeviceContext(const kvc_config_t &c, kvc_context_t **ctx) {
  uint64_t bytes = 0;
  ASSERT_EQ(kvc_pool_bytes_required(&c, &bytes), KVC_STATUS_OK);
  ASSERT_EQ(kvc_context_create(&c, kUntouchable, bytes, ctx), KVC_STATUS_OK)
      << kvc_last_error();
}

/// The first appends of a head, written out: R = 8, G = 4.
TEST(KiviDevice, WorkOfAPrefillAndADecodeStep) {
  const kvc_config_t c = deviceKiviConfig();
  kvc_context_t *ctx = nullptr;
  ASSERT_NO_FATAL_FAILURE(createDeviceContext(c, &ctx));
  ASSERT_EQ(kvc_sequence_add(ctx, 3), KVC_STATUS_OK);
  // 10 entries: keys of entries 0..7 are flushed as two blocks, no value
  // is (the first value leaves when the 8th newer entry arrives), and the
  // window ends up with entries 2..9 (entries 0 and 1 lost their rows to
  // 8 and 9 in the same call, so they are not staged).
  std::vector<int32_t> pos = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, slots(10);
  ASSERT_EQ(kvc_append(ctx, 3, 1, 1, 10, 8, nullptr, nullptr, pos.data(),
                       slots.data()),
            KVC_STATUS_OK)
      << kvc_last_error();
  kvc_kivi_work_t w{};
  ASSERT_EQ(kvc_kivi_pending_work(ctx, 3, 1, 1, &w), KVC_STATUS_OK);
  // The serial counts the record's changes: one append so far.
  EXPECT_EQ(w.serial, 1u);
  EXPECT_EQ(w.residual_length, 8);
  EXPECT_EQ(static_cast<uint8_t *>(w.residual),
            static_cast<uint8_t *>(kUntouchable) + w.residual_offset);
  EXPECT_EQ(w.num_values, 2);
  EXPECT_EQ(w.values[0].slot, 0);
  EXPECT_EQ(w.values[0].input, 0);
  EXPECT_EQ(w.values[1].slot, 1);
  ASSERT_EQ(w.num_key_blocks, 2);
  EXPECT_EQ(w.key_block_begin[1], 4);
  EXPECT_EQ(w.key_block_begin[2], 8);
  for (int32_t t = 0; t < 8; ++t) {
    EXPECT_EQ(w.key_members[t].slot, t);
    EXPECT_EQ(w.key_members[t].residual_row, t);
    EXPECT_EQ(w.key_members[t].input, t);
  }
  ASSERT_EQ(w.num_stages, 8);
  EXPECT_EQ(w.stages[0].input, 2);
  EXPECT_EQ(w.stages[7].input, 9);
  EXPECT_EQ(w.stages[7].residual_row, 1);
  EXPECT_EQ(w.residual_slot[1], 9);
  kvc_metadata_t m{};
  ASSERT_EQ(kvc_get_metadata(ctx, 3, 1, 1, &m), KVC_STATUS_OK);
  EXPECT_EQ(m.key_format[7], KVC_FORMAT_KIVI_INT2);
  EXPECT_EQ(m.key_format[8], KVC_FORMAT_FULL);
  EXPECT_EQ(m.value_format[1], KVC_FORMAT_KIVI_INT2);
  EXPECT_EQ(m.value_format[2], KVC_FORMAT_FULL);
  // The record carries the formats and the page table.
  EXPECT_EQ(w.num_slots, m.num_slots);
  EXPECT_EQ(w.key_format, m.key_format);
  EXPECT_EQ(w.value_format, m.value_format);
  int32_t numPages = 0;
  ASSERT_EQ(kvc_get_num_pages(ctx, 3, 1, 1, &numPages), KVC_STATUS_OK);
  ASSERT_EQ(w.num_pages, numPages);
  ASSERT_EQ(numPages, 2);
  kvc_page_layout_t layout{};
  ASSERT_EQ(kvc_page_layout(&c, &layout), KVC_STATUS_OK);
  for (int32_t p = 0; p < numPages; ++p) {
    int32_t poolPage = -1;
    void *address = nullptr;
    ASSERT_EQ(kvc_get_page(ctx, 3, 1, 1, p, &poolPage, nullptr, &address),
              KVC_STATUS_OK);
    EXPECT_EQ(w.pages[p], poolPage) << "page " << p;
    // The address the record's documentation derives.
    EXPECT_EQ(static_cast<uint8_t *>(w.residual) - w.residual_offset +
                  layout.pages_offset +
                  static_cast<uint64_t>(w.pages[p]) * layout.page_bytes,
              static_cast<uint8_t *>(address))
        << "page " << p;
  }

  // Evict entry 3 (its key is quantized, its value in the window), then one
  // decode step: entry 10 pushes entry 2's value out of the window, read
  // from its residual row.
  int32_t victim = 3;
  // Evicting nothing changes nothing; an eviction clears the record.
  ASSERT_EQ(kvc_evict(ctx, 3, 1, 1, 0, &victim), KVC_STATUS_OK);
  ASSERT_EQ(kvc_kivi_pending_work(ctx, 3, 1, 1, &w), KVC_STATUS_OK);
  EXPECT_EQ(w.serial, 1u);
  EXPECT_EQ(w.num_stages, 8);
  ASSERT_EQ(kvc_evict(ctx, 3, 1, 1, 1, &victim), KVC_STATUS_OK);
  ASSERT_EQ(kvc_kivi_pending_work(ctx, 3, 1, 1, &w), KVC_STATUS_OK);
  EXPECT_EQ(w.serial, 2u);
  EXPECT_EQ(w.num_stages, 0);
  // Another head's calls leave this head's serial alone.
  ASSERT_EQ(kvc_append(ctx, 3, 1, 0, 1, 8, nullptr, nullptr, &victim,
                       nullptr),
            KVC_STATUS_OK);
  ASSERT_EQ(kvc_kivi_pending_work(ctx, 3, 1, 1, &w), KVC_STATUS_OK);
  EXPECT_EQ(w.serial, 2u);
  int32_t p = 10, slot = -1;
  ASSERT_EQ(kvc_append(ctx, 3, 1, 1, 1, 8, nullptr, nullptr, &p, &slot),
            KVC_STATUS_OK);
  ASSERT_EQ(kvc_kivi_pending_work(ctx, 3, 1, 1, &w), KVC_STATUS_OK);
  EXPECT_EQ(w.serial, 3u);
  ASSERT_EQ(w.num_values, 1);
  EXPECT_EQ(w.values[0].slot, 2);
  EXPECT_EQ(w.values[0].residual_row, 2);
  EXPECT_EQ(w.values[0].input, -1);
  EXPECT_EQ(w.num_key_blocks, 0);
  ASSERT_EQ(w.num_stages, 1);
  EXPECT_EQ(w.stages[0].slot, slot);
  EXPECT_EQ(w.stages[0].residual_row, 2);
  EXPECT_EQ(w.stages[0].input, 0);
  EXPECT_EQ(kvc_pool_check(ctx), KVC_STATUS_OK) << kvc_last_error();

  // Six more: the window's keys (entries 8..15) flush; entry 3's row is
  // gone, and entries of earlier calls are read from their rows.
  std::vector<int32_t> more = {11, 12, 13, 14, 15};
  ASSERT_EQ(kvc_append(ctx, 3, 1, 1, 5, 8, nullptr, nullptr, more.data(),
                       nullptr),
            KVC_STATUS_OK);
  ASSERT_EQ(kvc_kivi_pending_work(ctx, 3, 1, 1, &w), KVC_STATUS_OK);
  ASSERT_EQ(w.num_key_blocks, 2);
  EXPECT_EQ(w.key_block_begin[2], 8);
  EXPECT_EQ(w.key_members[0].input, -1); // entry 8, from residual row 0
  EXPECT_EQ(w.key_members[0].residual_row, 0);
  EXPECT_EQ(w.key_members[3].input, 0); // entry 11, the call's first
  EXPECT_EQ(w.serial, 4u);
  // A compaction clears the record.
  std::vector<kvc_move_t> moves(64);
  int32_t moved = 0, released = 0;
  ASSERT_EQ(kvc_compact(ctx, 3, 1, 1, 1.0f, moves.data(), 64, &moved,
                        &released),
            KVC_STATUS_OK)
      << kvc_last_error();
  ASSERT_EQ(kvc_kivi_pending_work(ctx, 3, 1, 1, &w), KVC_STATUS_OK);
  EXPECT_EQ(w.serial, 5u);
  EXPECT_EQ(w.num_stages, 0);
  EXPECT_EQ(w.num_values, 0);
  kvc_context_destroy(ctx);

  kvc_kivi_work_t none{};
  kvc_config_t full = smallConfig(KVC_FORMAT_INT8);
  PoolBuffer buffer(1 << 16);
  ASSERT_EQ(kvc_context_create(&full, buffer.data, buffer.bytes, &ctx),
            KVC_STATUS_OK);
  ASSERT_EQ(kvc_sequence_add(ctx, 0), KVC_STATUS_OK);
  EXPECT_EQ(kvc_kivi_pending_work(ctx, 0, 0, 0, &none), KVC_STATUS_UNSUPPORTED);
  EXPECT_EQ(kvc_kivi_pending_work(ctx, 0, 0, 0, nullptr),
            KVC_STATUS_NULL_POINTER);
  EXPECT_EQ(kvc_kivi_pending_work(ctx, 9, 0, 0, &none), KVC_STATUS_OUT_OF_RANGE);
  kvc_context_destroy(ctx);
}

/// kvc_kivi_step_work gives, in one call, the record kvc_kivi_pending_work
/// gives for each kv-head of each sequence of a decode step's batch.
TEST(KiviDevice, StepWorkIsEachHeadsRecord) {
  const kvc_config_t c = deviceKiviConfig();
  kvc_context_t *ctx = nullptr;
  ASSERT_NO_FATAL_FAILURE(createDeviceContext(c, &ctx));
  const uint64_t batch[] = {7, 2, 5};
  for (uint64_t s : batch)
    ASSERT_EQ(kvc_sequence_add(ctx, s), KVC_STATUS_OK);
  // Different histories per sequence: 11, 3 and 17 entries in layer 1,
  // then three decode steps of the batch, the last after an eviction.
  const int32_t prompt[] = {11, 3, 17};
  for (int32_t b = 0; b < 3; ++b)
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      std::vector<int32_t> pos(static_cast<size_t>(prompt[b]));
      for (int32_t i = 0; i < prompt[b]; ++i)
        pos[i] = i;
      ASSERT_EQ(kvc_append(ctx, batch[b], 1, h, prompt[b], 8, nullptr,
                           nullptr, pos.data(), nullptr),
                KVC_STATUS_OK)
          << kvc_last_error();
    }
  const int32_t heads = 3 * c.num_kv_heads;
  std::vector<kvc_kivi_work_t> works(static_cast<size_t>(heads));
  auto compare = [&](const char *when) {
    for (int32_t i = 0; i < heads; ++i) {
      kvc_kivi_work_t one{};
      ASSERT_EQ(kvc_kivi_pending_work(ctx, batch[i / c.num_kv_heads], 1,
                                      i % c.num_kv_heads, &one),
                KVC_STATUS_OK);
      const kvc_kivi_work_t &w = works[i];
      SCOPED_TRACE(std::string(when) + ", head " + std::to_string(i));
      EXPECT_EQ(w.residual, one.residual);
      EXPECT_EQ(w.residual_offset, one.residual_offset);
      EXPECT_EQ(w.residual_length, one.residual_length);
      EXPECT_EQ(w.residual_slot, one.residual_slot);
      EXPECT_EQ(w.num_values, one.num_values);
      EXPECT_EQ(w.values, one.values);
      EXPECT_EQ(w.num_key_blocks, one.num_key_blocks);
      EXPECT_EQ(w.key_block_begin, one.key_block_begin);
      EXPECT_EQ(w.key_members, one.key_members);
      EXPECT_EQ(w.num_stages, one.num_stages);
      EXPECT_EQ(w.stages, one.stages);
      EXPECT_EQ(w.serial, one.serial);
      EXPECT_EQ(w.num_slots, one.num_slots);
      EXPECT_EQ(w.key_format, one.key_format);
      EXPECT_EQ(w.value_format, one.value_format);
      EXPECT_EQ(w.num_pages, one.num_pages);
      EXPECT_EQ(w.pages, one.pages);
    }
  };
  std::vector<int32_t> slots(static_cast<size_t>(heads));
  for (int32_t step = 0; step < 3; ++step) {
    if (step == 2) {
      int32_t victim = 1;
      ASSERT_EQ(kvc_evict(ctx, 2, 1, 1, 1, &victim), KVC_STATUS_OK);
    }
    const int32_t positions[] = {100 + step, 200 + step, 300 + step};
    ASSERT_EQ(kvc_append_step(ctx, 1, 3, batch, 8, nullptr, nullptr,
                              positions, slots.data(), nullptr),
              KVC_STATUS_OK)
        << kvc_last_error();
    ASSERT_EQ(kvc_kivi_step_work(ctx, 1, 3, batch, works.data()),
              KVC_STATUS_OK)
        << kvc_last_error();
    compare(("step " + std::to_string(step)).c_str());
    // A decode step's record: its entry staged at the slot it was given.
    for (int32_t i = 0; i < heads; ++i) {
      ASSERT_EQ(works[i].num_stages, 1) << "head " << i;
      EXPECT_EQ(works[i].stages[0].slot, slots[i]) << "head " << i;
    }
  }
  // A batch in another order, and of one sequence.
  const uint64_t reversed[] = {5, 2, 7};
  ASSERT_EQ(kvc_kivi_step_work(ctx, 1, 3, reversed, works.data()),
            KVC_STATUS_OK);
  kvc_kivi_work_t one{};
  ASSERT_EQ(kvc_kivi_pending_work(ctx, 5, 1, 1, &one), KVC_STATUS_OK);
  EXPECT_EQ(works[1].stages, one.stages);
  EXPECT_EQ(works[1].serial, one.serial);
  ASSERT_EQ(kvc_kivi_step_work(ctx, 0, 1, &batch[1], works.data()),
            KVC_STATUS_OK);
  ASSERT_EQ(kvc_kivi_pending_work(ctx, 2, 0, 0, &one), KVC_STATUS_OK);
  // Layer 0 of sequence 2 holds nothing.
  EXPECT_EQ(works[0].serial, one.serial);
  EXPECT_EQ(works[0].serial, 0u);
  EXPECT_EQ(works[0].num_pages, 0);

  // Wrong arguments: a located error, and nothing written.
  kvc_kivi_work_t sentinel{};
  sentinel.num_values = -7;
  std::fill(works.begin(), works.end(), sentinel);
  const uint64_t unknown[] = {7, 9, 5};
  EXPECT_EQ(kvc_kivi_step_work(ctx, 1, 3, unknown, works.data()),
            KVC_STATUS_OUT_OF_RANGE);
  EXPECT_NE(std::string(kvc_last_error()).find("unknown sequence 9 (batch "
                                               "index 1)"),
            std::string::npos)
      << kvc_last_error();
  for (const kvc_kivi_work_t &w : works)
    EXPECT_EQ(w.num_values, -7);
  EXPECT_EQ(kvc_kivi_step_work(ctx, 2, 3, batch, works.data()),
            KVC_STATUS_OUT_OF_RANGE);
  EXPECT_EQ(kvc_kivi_step_work(ctx, 1, 0, batch, works.data()),
            KVC_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kvc_kivi_step_work(ctx, 1, 3, nullptr, works.data()),
            KVC_STATUS_NULL_POINTER);
  EXPECT_EQ(kvc_kivi_step_work(ctx, 1, 3, batch, nullptr),
            KVC_STATUS_NULL_POINTER);
  EXPECT_EQ(kvc_kivi_step_work(nullptr, 1, 3, batch, works.data()),
            KVC_STATUS_NULL_POINTER);
  for (const kvc_kivi_work_t &w : works)
    EXPECT_EQ(w.num_values, -7);
  kvc_context_destroy(ctx);

  kvc_config_t full = smallConfig(KVC_FORMAT_INT8);
  PoolBuffer buffer(1 << 16);
  ASSERT_EQ(kvc_context_create(&full, buffer.data, buffer.bytes, &ctx),
            KVC_STATUS_OK);
  ASSERT_EQ(kvc_sequence_add(ctx, 0), KVC_STATUS_OK);
  const uint64_t zero = 0;
  EXPECT_EQ(kvc_kivi_step_work(ctx, 0, 1, &zero, works.data()),
            KVC_STATUS_UNSUPPORTED);
  kvc_context_destroy(ctx);
}

} // namespace
