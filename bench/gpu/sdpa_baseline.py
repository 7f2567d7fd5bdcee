#!/usr/bin/env python3
"""Outside baseline for kvc-bench-gpu: PyTorch's scaled_dot_product_attention
decode over a full f16 cache, same geometries as the kvc table.

One decode step of one layer: q of one token per query head against the
whole cache (batch x kv_heads x context x head_dim keys and values). GQA is
folded into the query length (q: batch x kv_heads x group x head_dim), so
each key and value is read once per kv-head, as the kvc kernels do; no mask
is needed for a single new token. Times are CUDA-event time per call, and
bandwidth counts the keys and values only:
    bytes/step = batch * context * kv_heads * 2 * head_dim * 2 B.
The copy bandwidth is measured in the same run (a device-to-device
tensor copy, read + written bytes per second), as kvc-bench-gpu does.

Exits 77 with a message when torch or a CUDA device is missing. Accepts the
sweep options of kvc-bench-gpu (--batch, --context, --dim, --group,
--min-ms, --quick) and ignores the others.
"""

import argparse
import sys


def parse_list(text):
    if text == "none":
        return []
    values = []
    for part in text.split(","):
        part = part.strip()
        scale = 1
        if part[-1:] in ("k", "K"):
            scale, part = 1024, part[:-1]
        values.append(int(part) * scale)
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,8,32")
    parser.add_argument("--context", default="1k,4k,16k,32k")
    parser.add_argument("--dim", default="64,128")
    parser.add_argument("--group", default="1,4,8")
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--min-ms", type=float, default=100.0)
    parser.add_argument("--quick", action="store_true")
    args, _ignored = parser.parse_known_args()
    if args.quick:
        args.batch, args.context, args.min_ms = "1", "1k", 20.0

    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"sdpa_baseline: SKIP: PyTorch is not installed ({e}); "
              "the outside baseline needs torch with CUDA.")
        return 77
    if not torch.cuda.is_available():
        print("sdpa_baseline: SKIP: torch.cuda.is_available() is False "
              f"(torch {torch.__version__}); no baseline without a GPU.")
        return 77

    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on "
          f"{props.name}")

    def time_ms(fn, min_ms):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        total, calls, reps = 0.0, 0, 10
        while total < min_ms or calls < 20:
            start.record()
            for _ in range(reps):
                fn()
            stop.record()
            stop.synchronize()
            total += start.elapsed_time(stop)
            calls += reps
        return total / calls

    # Copy bandwidth: 1 GiB (at most a quarter of free memory).
    free, _total = torch.cuda.mem_get_info()
    nbytes = min(1 << 30, free // 4) & ~0xFFFF
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).uniform_()
    dst = torch.empty_like(src)
    copy_ms = min(time_ms(lambda: dst.copy_(src), 1.0) for _ in range(5))
    copy_gbs = 2 * nbytes / (copy_ms * 1e-3) / 1e9
    del src, dst
    print(f"copy bandwidth (tensor copy, read + written, {nbytes >> 20} MiB): "
          f"{copy_gbs:.0f} GB/s")
    print("bytes/step = batch * context * kv_heads * 2 * head_dim * 2 B "
          "(f16 keys and values)\n")
    print(f"{'dim':>4} {'G':>3} {'qh':>4} {'B':>3} {'context':>7} "
          f"{'MB/step':>9} | {'sdpa us':>9} {'GB/s':>7} {'%copy':>6}")

    kvh = args.kv_heads
    torch.manual_seed(0)
    for dim in parse_list(args.dim):
        for group in parse_list(args.group):
            for batch in parse_list(args.batch):
                for n in parse_list(args.context):
                    try:
                        k = torch.randn(batch, kvh, n, dim, dtype=torch.float16,
                                        device=device)
                        v = torch.randn_like(k)
                        q = torch.randn(batch, kvh, group, dim,
                                        dtype=torch.float16, device=device)
                        with torch.no_grad():
                            ms = time_ms(
                                lambda: F.scaled_dot_product_attention(q, k, v),
                                args.min_ms)
                    except RuntimeError as e:  # out of memory and the like
                        print(f"{dim:4d} {group:3d} {kvh * group:4d} "
                              f"{batch:3d} {n:7d}  error: {e}")
                        torch.cuda.empty_cache()
                        continue
                    nbytes = batch * n * kvh * 2 * dim * 2
                    gbs = nbytes / (ms * 1e-3) / 1e9
                    print(f"{dim:4d} {group:3d} {kvh * group:4d} {batch:3d} "
                          f"{n:7d} {nbytes / 1e6:9.2f} | {ms * 1e3:9.1f} "
                          f"{gbs:7.0f} {100 * gbs / copy_gbs:5.1f}%",
                          flush=True)
                    del k, v, q
                    torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
