#!/usr/bin/env python3
"""clef-tt's prefill next to PyTorch + transformers on the same Qwen3.5 shape, interleaved.

Builds the text trunk of a `clef-tt make-random` checkpoint's config in transformers (random
weights: only the shape matters for speed), times its forward pass (embedding to final norm, no
LM head, as `clef-tt bench prefill` times its prefill) at each length and dtype, and runs
`clef-tt bench prefill` for the same length and weight format right after, on the same
threads: PyTorch's best of `--repeat`, clef-tt's median of as many (what its bench
reports), each in a process of its own. bfloat16 is set against clef-tt's `bf16` precision profile (bf16 weights and
activations, f32 accumulation), float32 against `f32`. Prints a markdown table with the ratio
and the CPU's vector features.

Needs `torch` and `transformers` (pip install torch transformers); CI does not run it.

    clef-tt make-random --shape 0.8b --out /tmp/bench-0.8b
    python benches/peer_torch.py --model /tmp/bench-0.8b --clef target/release/clef-tt
"""

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time


def torch_tokens_per_s(model_dir, tokens, dtype, repeat, threads):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(threads)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    text = cfg.get("text_config", cfg)
    config = AutoConfig.for_model(
        text.get("model_type", "qwen3_5_text"),
        **{k: v for k, v in text.items() if k != "model_type"},
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=getattr(torch, dtype))
    trunk = model.model.eval()
    ids = torch.randint(100, 200_000, (1, tokens))
    with torch.no_grad():
        trunk(input_ids=ids)  # warm-up
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            trunk(input_ids=ids)
            best = min(best, time.perf_counter() - t0)
    return tokens / best


def clef_tokens_per_s(clef, model_dir, tokens, profile, repeat):
    out = subprocess.run(
        [
            clef,
            "bench",
            "prefill",
            "--model",
            model_dir,
            "--tokens",
            str(tokens),
            "--precision",
            profile,
            "--mesh",
            "1x1",
            "--repeat",
            str(repeat),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) >= 5 and cells[0] == profile and re.match(r"^\d", cells[4]):
            return float(cells[4])
    raise RuntimeError(f"no result row in clef-tt's output:\n{out}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a clef-tt make-random directory")
    p.add_argument("--clef", default="target/release/clef-tt")
    p.add_argument("--tokens", default="512,2048")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    a = p.parse_args()
    # clef-tt's precision profile of the same numerics: bf16 weights and activations under bf16.
    profiles = {"float32": "f32", "bfloat16": "bf16"}
    rows = []
    for dtype in a.dtypes.split(","):
        for tokens in map(int, a.tokens.split(",")):
            # In a process of its own, so no PyTorch thread is still spinning while clef-tt runs
            # (its OpenMP workers busy-wait after a parallel region: clef-tt's 512-token run lost
            # ~20% beside them).
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                peer = pool.apply(torch_tokens_per_s, (a.model, tokens, dtype, a.repeat, a.threads))
            ours = clef_tokens_per_s(a.clef, a.model, tokens, profiles[dtype], a.repeat)
            rows.append((dtype, tokens, ours, peer))
            print(
                f"{dtype} {tokens}: clef-tt {ours:.1f} tokens/s, PyTorch {peer:.1f}",
                file=sys.stderr,
            )
    import torch
    import transformers

    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next(ln for ln in f if ln.startswith("flags")).split(":")[1].split())
    except (OSError, StopIteration):
        pass
    isa = [x for x in ("avx512_bf16", "avx512f", "avx2", "fma") if x in flags]
    print(
        f"PyTorch {torch.__version__}, transformers {transformers.__version__}, {a.threads} threads, CPU: {' '.join(isa) or 'unknown'}"
    )
    print("| dtype | tokens | clef-tt tokens/s | PyTorch tokens/s | ratio |\n|---|---|---|---|---|")
    for dtype, tokens, ours, peer in rows:
        print(f"| {dtype} | {tokens} | {ours:.1f} | {peer:.1f} | {ours / peer:.2f}x |")


if __name__ == "__main__":
    main()
