//===- policy_report.cpp - error and memory of every bundled policy -------===//
//
// For every bundled policy (compiled for 3 query heads = 3 kv-heads, head
// dim 64, f16 cache) and prompts of 2048, 4096 and 10240 structured tokens
// (attention sinks, planted heavy hitters and a shared query direction, as
// in test/codegen): prefill of layer 0, then 8 decode steps. Prints one
// JSON line per (policy, prompt): entries kept, bytes kept against a full
// f16 cache, and the relative L2 error of the decode attention outputs
// against full attention over every token (double precision). With the
// budgets of the bundled files (1024 entries for most), the three prompts
// put them near 50%, 25% and 10% of the context; each line reports the
// fraction actually kept. scripts/policy_report.py turns this into
// docs/policies.md.
//
//===----------------------------------------------------------------------===//

#include "runtime/kvc_policy_api.h"
#include "runtime/kvc_runtime.h"
#include "test/reference/Reference.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

struct ReportPolicy {
  const char *name;
  kvc_configure_fn configure;
  kvc_workspace_bytes_fn prefillBytes;
  kvc_cpu_prefill_fn prefill;
  kvc_workspace_bytes_fn decodeBytes;
  kvc_cpu_decode_fn decode;
  /// A global budget's selection, run after the prefill (null otherwise).
  kvc_workspace_bytes_fn selectBytes = nullptr;
  kvc_select_fn select = nullptr;
};

#define KVC_REPORT_POLICY(p)                                                   \
  ReportPolicy {                                                               \
    #p, kvc_##p##_cpu_configure, kvc_##p##_cpu_prefill_workspace_bytes,        \
        kvc_##p##_cpu_prefill, kvc_##p##_cpu_decode_workspace_bytes,           \
        kvc_##p##_cpu_decode                                                   \
  }

#define KVC_REPORT_GLOBAL_POLICY(p)                                            \
  ReportPolicy {                                                               \
    #p, kvc_##p##_cpu_configure, kvc_##p##_cpu_prefill_workspace_bytes,        \
        kvc_##p##_cpu_prefill, kvc_##p##_cpu_decode_workspace_bytes,           \
        kvc_##p##_cpu_decode, kvc_##p##_cpu_select_workspace_bytes,            \
        kvc_##p##_cpu_select                                                   \
  }

#include "report_policies.h"

constexpr int kHeads = 3, kDim = 64, kPageSize = 64, kSteps = 8;

void check(kvc_status_t s, const char *what) {
  if (s != KVC_STATUS_OK) {
    std::fprintf(stderr, "kvc-policy-report: %s: %s: %s\n", what,
                 kvc_status_string(s), kvc_last_error());
    std::exit(1);
  }
}

/// q, k, v rows of `tokens` tokens from `first` on: random (queries twice
/// the spread of keys, so that attention is peaked), plus sinks and heavy
/// hitters along a direction every query shares.
void makeTokens(std::mt19937 &rng, int first, int tokens,
                std::vector<float> &q, std::vector<float> &k,
                std::vector<float> &v) {
  std::normal_distribution<float> normal;
  q.assign(static_cast<size_t>(tokens) * kHeads * kDim, 0.0f);
  k.assign(q.size(), 0.0f);
  v.assign(q.size(), 0.0f);
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = 2.0f * normal(rng);
    k[i] = normal(rng);
    v[i] = normal(rng);
  }
  for (int t = 0; t < tokens; ++t) {
    int pos = first + t;
    for (int h = 0; h < kHeads; ++h) {
      q[(static_cast<size_t>(t) * kHeads + h) * kDim] += 4.0f;
      if (pos < 4 || pos % 97 == 13)
        k[(static_cast<size_t>(t) * kHeads + h) * kDim] += 6.0f;
    }
  }
}

} // namespace

int main(int argc, char **argv) {
  std::vector<int> prompts = {2048, 4096, 10240};
  if (argc > 1)
    prompts = {std::atoi(argv[1])};
  for (const ReportPolicy &policy : kReportPolicies) {
    for (int n : prompts) {
      std::mt19937 rng(2024 + n);
      kvc_config_t config{};
      policy.configure(&config);
      config.page_size = kPageSize;
      config.num_pages = kHeads * ((n + kSteps) / kPageSize + 4);
      config.max_sequences = 1;
      config.memory = KVC_MEMORY_HOST;
      uint64_t bytes = 0;
      check(kvc_pool_bytes_required(&config, &bytes), "pool size");
      std::vector<char> pool(bytes + KVC_POOL_ALIGNMENT);
      void *base = pool.data() + (KVC_POOL_ALIGNMENT -
                                  reinterpret_cast<uintptr_t>(pool.data()) %
                                      KVC_POOL_ALIGNMENT);
      kvc_context_t *context = nullptr;
      check(kvc_context_create(&config, base, bytes, &context), "context");
      check(kvc_sequence_add(context, 0), "sequence");

      // Every token's key and value, for the full-attention reference.
      std::vector<float> allK, allV, q, k, v;
      makeTokens(rng, 0, n, q, k, v);
      allK = k;
      allV = v;
      std::vector<int32_t> positions(n);
      for (int i = 0; i < n; ++i)
        positions[i] = i;
      std::vector<float> out(q.size());
      std::vector<char> ws(policy.prefillBytes(n));
      check(policy.prefill(context, 0, 0, n, q.data(), k.data(), v.data(),
                           positions.data(), out.data(), ws.data(), ws.size()),
            "prefill");
      if (policy.select) {
        std::vector<char> sws(policy.selectBytes(n));
        check(policy.select(context, 0, n, sws.data(), sws.size()), "select");
      }

      double errorSum = 0.0;
      for (int step = 0; step < kSteps; ++step) {
        makeTokens(rng, n + step, 1, q, k, v);
        allK.insert(allK.end(), k.begin(), k.end());
        allV.insert(allV.end(), v.begin(), v.end());
        int32_t slots = 0;
        for (int h = 0; h < kHeads; ++h) {
          int32_t s = 0;
          check(kvc_get_num_slots(context, 0, 0, h, &s), "slots");
          slots = std::max(slots, s);
        }
        std::vector<char> dws(policy.decodeBytes(slots + 2 * kPageSize));
        std::vector<float> o(q.size());
        check(policy.decode(context, 0, 0, q.data(), k.data(), v.data(),
                            n + step, o.data(), dws.data(), dws.size()),
              "decode");
        // Full attention of this step's queries over every token.
        const int total = n + step + 1;
        double num = 0.0, den = 0.0;
        for (int h = 0; h < kHeads; ++h) {
          kvc::ref::Matrix keys(total, kDim), values(total, kDim);
          for (int t = 0; t < total; ++t)
            for (int c = 0; c < kDim; ++c) {
              keys.at(t, c) = allK[(static_cast<size_t>(t) * kHeads + h) * kDim + c];
              values.at(t, c) = allV[(static_cast<size_t>(t) * kHeads + h) * kDim + c];
            }
          kvc::ref::Matrix query(1, kDim);
          for (int c = 0; c < kDim; ++c)
            query.at(0, c) = q[h * kDim + c];
          kvc::ref::AttentionResult full =
              kvc::ref::attention({query}, {keys}, {values});
          for (int c = 0; c < kDim; ++c) {
            double d = o[h * kDim + c] - full.output[0].at(0, c);
            num += d * d;
            den += full.output[0].at(0, c) * full.output[0].at(0, c);
          }
        }
        errorSum += std::sqrt(num / den);
      }

      kvc_page_layout_t layout{};
      check(kvc_page_layout(&config, &layout), "layout");
      int64_t entries = 0;
      for (int h = 0; h < kHeads; ++h) {
        int32_t e = 0;
        check(kvc_get_num_entries(context, 0, 0, h, &e), "entries");
        entries += e;
      }
      // Bytes per entry: rows plus per-token parameters; KIVI key
      // parameters are shared by a block of G entries.
      double perEntry = double(layout.key_stride + layout.value_stride +
                               layout.value_param_stride);
      if (config.group_size > 0 && layout.key_param_stride > 0 &&
          (config.format == KVC_FORMAT_KIVI_INT2 ||
           config.format == KVC_FORMAT_KIVI_INT4))
        perEntry += double(layout.key_param_stride) / config.group_size;
      else
        perEntry += double(layout.key_param_stride);
      // Mixed precision: entries of the low page class take its bytes; the
      // figure is the mean over the entries kept.
      if (config.low_format != KVC_FORMAT_FULL && entries > 0) {
        kvc_page_layout_t low{};
        check(kvc_low_page_layout(&config, &low, nullptr), "low layout");
        const double lowEntry =
            double(low.key_stride + low.value_stride + low.key_param_stride +
                   low.value_param_stride);
        double total = 0.0;
        for (int h = 0; h < kHeads; ++h) {
          kvc_metadata_t meta{};
          check(kvc_get_metadata(context, 0, 0, h, &meta), "metadata");
          for (int32_t slot = 0; slot < meta.num_slots; ++slot)
            if (meta.position[slot] != KVC_POSITION_NONE)
              total += meta.key_format[slot] == config.low_format ? lowEntry
                                                                  : perEntry;
        }
        perEntry = total / double(entries);
      }
      const double fullBytes = double(n + kSteps) * kHeads * 2 * kDim * 2;
      std::printf("{\"policy\": \"%s\", \"prompt\": %d, \"kept\": %.4f, "
                  "\"bytes_per_entry\": %.1f, \"memory\": %.4f, "
                  "\"error\": %.5f}\n",
                  policy.name, n,
                  double(entries) / (double(n + kSteps) * kHeads), perEntry,
                  double(entries) * perEntry / fullBytes, errorSum / kSteps);
      std::fflush(stdout);
      kvc_context_destroy(context);
    }
  }
  return 0;
}
