#!/usr/bin/env python3
"""Check kvc-run against an independent NumPy implementation of the model.

Two checks, run against SmolLM2-135M-Instruct (scripts/fetch-model.sh):

1. Tokenizer: kvc-run --print-tokens must give token ids that were derived
   by hand for a few strings (pre-token boundaries worked out from the
   pre-tokenizer rules, each piece looked up in the GGUF vocabulary, and BPE
   splits confirmed from the merge ranks; see TOKENIZER_CASES).

2. Logits: for fixed prompts, the logits kvc-run computes at the last prompt
   position (--dump-logits) must match a float64 NumPy forward pass written
   from the llama definition. The reference reads the GGUF with the `gguf`
   package but dequantizes Q4_1/Q8_0 itself, and it undoes the GGUF Q/K row
   permutation and applies rotary embeddings to half-split pairs as the
   original checkpoints do, so it shares no layout assumption with kvc-run.

   Tolerance: max |kvc - ref| <= 1e-4 * max |ref| over the vocabulary, and
   the same argmax. Both sides use the same quantized weights, so the only
   difference is float32 rounding in kvc-run.

Exit status: 0 pass, 1 fail, 77 skipped (model file, numpy or gguf missing).
"""

import argparse
import os
import subprocess
import sys
import tempfile

SKIP = 77
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
REL_TOLERANCE = 1e-4

# (text, expected ids). Derivations:
#  - "The capital of France is": The=504, Ġcapital=3575, Ġof=282,
#    ĠFrance=4649, Ġis=314.
#  - digits are isolated; "I'm" splits before the contraction; a whitespace
#    run before a word leaves its last space to the word ("\n\n  Hello" ->
#    "\n\n " + " Hello"); "   world" -> "  " + " world"; é is two bytes
#    (Ã©): I=57 'm=5248 Ġ=216 2=34 5=37 Ġyears=929 Ġold=1573 .=30
#    ĊĊĠ=8866 ĠHello=38699 ,=28 ĠĠ=256 Ġworld=905 !=17 ĠcafÃ©=37366
#    0=32 4=36.
#  - contractions are lowercase only, so "'T" is "'" + "T"; "DON" is not in
#    the vocabulary and the merge "O N" (rank 1902) precedes "D O" (14642):
#    D=52 ON=2154 '=23 T=68 Ġdon=1326 't=982.
#  - control tokens are matched in the text: <|im_start|>=1 user=4093
#    Ċ=198 Hello=19556 <|im_end|>=2.
TOKENIZER_CASES = [
    ("The capital of France is", [504, 3575, 282, 4649, 314]),
    (
        "I'm 25 years old.\n\n  Hello,   world! café 2024",
        [57, 5248, 216, 34, 37, 929, 1573, 30, 8866, 38699, 28, 256, 905, 17,
         37366, 216, 34, 32, 34, 36],
    ),
    ("DON'T don't", [52, 2154, 23, 68, 1326, 982]),
    ("<|im_start|>user\nHello<|im_end|>\n", [1, 4093, 198, 19556, 2, 198]),
]

LONG_TEXT = (
    "The river rises in the hills to the north and runs south through "
    "farmland for nearly two hundred kilometres before it reaches the sea. "
    "Along its banks lie small towns, each with a market square, a church "
    "and a bridge that was rebuilt after the great flood. Fishermen work "
    "the lower reaches, where the water is wide and slow, while the upper "
    "valley is known for its orchards and its cold, clear springs. "
)


def default_model_path():
    d = os.environ.get("KVC_MODEL_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "kvc", "models")
    return os.path.join(d, MODEL_NAME)


# --- Reference model ---------------------------------------------------------


def dequantize(tensor, np):
    """Returns the tensor as float64 [rows, cols] (GGUF dims reversed)."""
    from gguf import GGMLQuantizationType as T

    cols = int(tensor.shape[0])
    rows = int(np.prod(tensor.shape[1:])) if len(tensor.shape) > 1 else 1
    raw = np.ascontiguousarray(tensor.data).view(np.uint8).reshape(-1)
    kind = tensor.tensor_type
    if kind == T.F32:
        return raw.view(np.float32).astype(np.float64).reshape(rows, cols)
    if kind == T.F16:
        return raw.view(np.float16).astype(np.float64).reshape(rows, cols)
    if kind == T.Q4_1:
        # Block: f16 scale d, f16 minimum m, 16 bytes; byte j holds element j
        # (low nibble) and element j + 16 (high nibble); x = q * d + m.
        b = raw.reshape(-1, 20)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        m = b[:, 2:4].copy().view(np.float16).astype(np.float64)
        q = np.concatenate([b[:, 4:] & 0x0F, b[:, 4:] >> 4], axis=1)
        return (q * d + m).reshape(rows, cols)
    if kind == T.Q8_0:
        # Block: f16 scale d, 32 signed bytes; x = q * d.
        b = raw.reshape(-1, 34)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        q = b[:, 2:].copy().view(np.int8).astype(np.float64)
        return (q * d).reshape(rows, cols)
    if kind == T.Q4_0:
        b = raw.reshape(-1, 18)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        q = np.concatenate([b[:, 2:] & 0x0F, b[:, 2:] >> 4], axis=1)
        return ((q.astype(np.float64) - 8.0) * d).reshape(rows, cols)
    raise RuntimeError(f"reference: unsupported tensor type {kind.name}")


def unpermute_rope_rows(w, n_heads, np):
    """Undo the GGUF conversion's Q/K row order (pairs (2i, 2i+1) adjacent)
    back to the checkpoint order (pairs (i, i + head_dim/2))."""
    rows, cols = w.shape
    hd = rows // n_heads
    return (w.reshape(n_heads, hd // 2, 2, cols).swapaxes(1, 2)
            .reshape(rows, cols))


class Reference:
    def __init__(self, path, np):
        from gguf import GGUFReader

        self.np = np
        r = GGUFReader(path)

        def field(key):
            return r.fields[key].contents()

        self.n_layers = int(field("llama.block_count"))
        self.dim = int(field("llama.embedding_length"))
        self.n_heads = int(field("llama.attention.head_count"))
        self.n_kv = int(field("llama.attention.head_count_kv"))
        self.hd = self.dim // self.n_heads
        self.base = float(field("llama.rope.freq_base"))
        self.eps = float(field("llama.attention.layer_norm_rms_epsilon"))
        t = {x.name: x for x in r.tensors}
        self.w = {}
        for name, x in t.items():
            self.w[name] = dequantize(x, np)
        for l in range(self.n_layers):
            q, k = f"blk.{l}.attn_q.weight", f"blk.{l}.attn_k.weight"
            self.w[q] = unpermute_rope_rows(self.w[q], self.n_heads, np)
            self.w[k] = unpermute_rope_rows(self.w[k], self.n_kv, np)
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])

    def rms(self, x, w):
        np = self.np
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) +
                           self.eps) * w.reshape(-1)

    def rope(self, x, pos):
        # x: [T, heads, hd]; half-split rotation as in the checkpoints.
        np = self.np
        half = self.hd // 2
        inv = self.base ** (-np.arange(0, half, dtype=np.float64) * 2 /
                            self.hd)
        ang = pos[:, None] * inv[None, :]
        cos = np.cos(ang)[:, None, :]
        sin = np.sin(ang)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin],
                              axis=-1)

    def logits(self, ids):
        np = self.np
        n = len(ids)
        pos = np.arange(n, dtype=np.float64)
        x = self.w["token_embd.weight"][ids]
        mask = np.triu(np.full((n, n), -np.inf), k=1)
        group = self.n_heads // self.n_kv
        for l in range(self.n_layers):
            p = f"blk.{l}."
            h = self.rms(x, self.w[p + "attn_norm.weight"])
            q = (h @ self.w[p + "attn_q.weight"].T).reshape(n, self.n_heads,
                                                           self.hd)
            k = (h @ self.w[p + "attn_k.weight"].T).reshape(n, self.n_kv,
                                                           self.hd)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(n, self.n_kv,
                                                           self.hd)
            q, k = self.rope(q, pos), self.rope(k, pos)
            k = np.repeat(k, group, axis=1)
            v = np.repeat(v, group, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(self.hd) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            a = np.einsum("hqk,khd->qhd", s, v).reshape(n, self.dim)
            x = x + a @ self.w[p + "attn_output.weight"].T
            h = self.rms(x, self.w[p + "ffn_norm.weight"])
            g = h @ self.w[p + "ffn_gate.weight"].T
            u = h @ self.w[p + "ffn_up.weight"].T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ \
                self.w[p + "ffn_down.weight"].T
        h = self.rms(x[-1:], self.w["output_norm.weight"])
        return (h @ self.out.T).reshape(-1)


# --- kvc-run -----------------------------------------------------------------


def run_kvc(kvc, model, args, threads):
    cmd = [kvc, "--model", model, "--threads", str(threads)] + args
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n"
                           f"{res.stderr}")
    return res.stdout


def kvc_tokens(kvc, model, text, threads):
    out = run_kvc(kvc, model, ["--prompt", text, "--print-tokens"], threads)
    return [int(t) for t in out.split()]


def kvc_logits(kvc, model, ids, threads, batch, np):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "logits.bin")
        run_kvc(kvc, model, [
            "--prompt-tokens", " ".join(map(str, ids)), "--n-predict", "0",
            "--prefill-batch", str(batch), "--dump-logits", path
        ], threads)
        return np.fromfile(path, dtype="<f4").astype(np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvc-run", required=True, help="path to kvc-run")
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    if not os.path.exists(args.model):
        print(f"SKIP: model file {args.model} not found; run "
              "scripts/fetch-model.sh")
        return SKIP
    try:
        import numpy as np
        import gguf  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e.name} is not installed "
              "(pip install -r scripts/requirements.txt)")
        return SKIP

    ok = True
    print("tokenizer:")
    for text, want in TOKENIZER_CASES:
        got = kvc_tokens(args.kvc_run, args.model, text, args.threads)
        good = got == want
        ok &= good
        print(f"  {'ok  ' if good else 'FAIL'} {text!r}" +
              ("" if good else f"\n       got  {got}\n       want {want}"))

    ref = Reference(args.model, np)
    long_ids = kvc_tokens(args.kvc_run, args.model, LONG_TEXT * 4,
                          args.threads)
    cases = [
        ("fixed ids", [1, 504, 3575, 282, 4649, 314], 64),
        ("3 tokens (per-token path)", [504, 3575, 282], 64),
        ("chat", kvc_tokens(args.kvc_run, args.model,
                            "<|im_start|>user\nWhat is the capital of "
                            "France?<|im_end|>\n<|im_start|>assistant\n",
                            args.threads), 64),
        (f"long, batch 64", long_ids, 64),
        (f"long, batch 1 (decode path)", long_ids, 1),
    ]
    print(f"logits (tolerance: max abs diff <= {REL_TOLERANCE:g} * "
          "max |ref|, same argmax):")
    for name, ids, batch in cases:
        want = ref.logits(np.array(ids))
        got = kvc_logits(args.kvc_run, args.model, ids, args.threads, batch,
                         np)
        diff = float(np.max(np.abs(got - want)))
        scale = float(np.max(np.abs(want)))
        same = int(np.argmax(got)) == int(np.argmax(want))
        good = got.shape == want.shape and diff <= REL_TOLERANCE * scale \
            and same
        ok &= good
        print(f"  {'ok  ' if good else 'FAIL'} {name:<28} {len(ids):4d} "
              f"tokens  max|diff| {diff:.2e}  max|ref| {scale:6.2f}  "
              f"argmax {int(np.argmax(got))}/{int(np.argmax(want))}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
