"""Every ABI op of Clef 27B's layers at the real per-device shapes, on the mock P150x2, with
the program factory, circular buffers and peak L1 ttnn chose for each, beside `clef-tt plan`.

One 1,024-token chunk through one gated attention layer (from position 0, and from a cached
prefix of 15,360 rows: 15 chunks appended before it, so append_rows writes into a pool of 256
blocks and SDPA sees 16,384 keys; plus one append onto a restored prefix-cache slot, which
shares the slot's blocks), one Gated DeltaNet layer (from a zero state, and from a nonzero f32
state and conv carry), one MLP, the same as layer ops (one ABI call per sublayer, what the backbone calls on
a ttnn mesh), and one vision-tower block at 1,024 patches (one image), at TP=2 per-device
shapes (bench_layers_mock.Bench: hidden 5120, 12+2 heads of 256, DeltaNet 8/24 heads of 128,
MLP 8704; vision hidden 1152, 8 heads of 72, MLP 2152) with random weights in the selected
profile's formats (bfp8_b text matrices, bf16 MLP down and vision matrices, HiFi2, fp32
accumulation). Each ABI op runs for real (mock dispatch: ttnn validates, builds the program and
its circular buffers; the kernels compile with the stand-in compiler), then once more inside
`ttnn.graph.begin_graph_capture(RunMode.NO_DISPATCH)`, with the KV pools' block bookkeeping restored so the
captured call takes the same path. From each capture: the ttnn device operations, the program
factory of each, its circular buffers (count, bytes per core) and the op's peak L1 per core
(`extract_resource_usage_per_core`: circular + dataflow buffers + L1 buffers). Next to each row,
the `clef-tt plan --shape clef-27b --mesh 1x2 --precision selected` op it belongs to, with that
op's GFLOP and predicted ms per run (the plan's totals divided by its runs; ops that share a plan
row show it once). A matmul table says for each linear what programs.py asked for (the port's
2-D multicast config, or none when its buffer estimate exceeds the budget) and the factory ttnn
used.

Exits 1 if ttnn refused any op (the TT_FATAL is in its row; CLEF_TT_TTNN_REFUSE=linear:3 shows
one). Takes about 10 s with the kernel cache ($TT_METAL_CACHE) warm, under 2 minutes cold.

    source /tmp/ttmock/env.sh; export TT_LOGGER_LEVEL=warn TT_LOGGER_FILE=/tmp/tt-metal.log
    cd "$(mktemp -d)" && $CLEF_TT_PYTHON /work/main/ffi/shim/ttnn/tests/ops_at_scale_mock.py \\
        [--plan target/tt/debug/clef-tt] [--md report.md] [--only attention0,...]
"""

import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_layers_mock as bl  # noqa: E402
from bench_layers_mock import (
    DK,
    DV,  # noqa: E402
    HEAD_DIM,
    HIDDEN,
    KERNEL,
    KV_HEADS,
    NK,
    NV,
    SHARDED,
    V_DIM,
    V_HIDDEN,
    Bench,
)
from clef_tt_ttnn import programs  # noqa: E402
from clef_tt_ttnn.kv_cache import KV  # noqa: E402
from clef_tt_ttnn.meta import BF16, F32, tile_bytes  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
T, PREFIX, PATCHES = 1024, 15360, 1024
# ttnn 0.81.1's name of the 2-D multicast matmul factory (the one
# MatmulMultiCoreReuseMultiCastProgramConfig selects); the 1-D one is
# MatmulMultiCoreReuseMcast1DProgramFactory.
TWO_D = "MatmulMultiCoreReuseMcast2DProgramFactory"

# ABI op label -> the `clef-tt plan` op it is part of.
PLAN_OP = {
    "rms_norm (input)": "rms_norm (input)",
    "rms_norm (post)": "rms_norm (post)",
    "linear qkv|gate": "attention qkv|gate matmul",
    "rms_norm q": "q/k rms_norm (heads)",
    "rms_norm k": "q/k rms_norm (heads)",
    "rope q": "rope: rotary_embedding_hf",
    "rope k": "rope: rotary_embedding_hf",
    "append_rows K": "paged_fill_cache (K, V)",
    "append_rows V": "paged_fill_cache (K, V)",
    "append_rows K onto a prefix-slot copy": "paged_fill_cache (K, V)",
    "causal_attention": "chunked SDPA (causal, GQA)",
    "mul_sigmoid": "output gate (x · sigmoid(g))",
    "linear o_proj": "attention o_proj matmul",
    "add (residual)": "residual add",
    "linear in_proj": "deltanet in_proj matmul",
    "causal_conv1d_silu": "causal conv1d + SiLU (carry)",
    "delta_gates": "delta gates (f32)",
    "gated_delta_rule": "chunk_gated_delta_rule (f32 state)",
    "gated_rms_norm": "rms_norm per value head (f32)",
    "linear out_proj": "deltanet out_proj matmul",
    "linear gate|up": "mlp gate|up matmul",
    "swiglu": "SwiGLU",
    "linear down": "mlp down matmul",
    "layer_norm 1": "block LayerNorm x2 + bias + residual",
    "layer_norm 2": "block LayerNorm x2 + bias + residual",
    "add_bias qkv": "block LayerNorm x2 + bias + residual",
    "add_bias proj": "block LayerNorm x2 + bias + residual",
    "add_bias fc1": "block LayerNorm x2 + bias + residual",
    "add_bias fc2": "block LayerNorm x2 + bias + residual",
    "add (residual 1)": "block LayerNorm x2 + bias + residual",
    "add (residual 2)": "block LayerNorm x2 + bias + residual",
    "linear qkv": "block qkv matmul",
    "rotary q": "block 2-D rotary (q, k)",
    "rotary k": "block 2-D rotary (q, k)",
    "segment_attention": "block segment attention",
    "linear proj": "block proj matmul",
    "all_reduce proj": "all_reduce (row-parallel projections)",
    "all_reduce fc2": "all_reduce (row-parallel projections)",
    "linear fc1": "block fc1 matmul",
    "gelu (tanh)": "block GELU (tanh)",
    "linear fc2": "block fc2 matmul",
}
# all_reduce: which plan row depends on the layer kind.
ALL_REDUCE = {
    "attention": "all_reduce (o_proj, out_proj)",
    "deltanet": "all_reduce (o_proj, out_proj)",
    "mlp": "all_reduce (down_proj)",
}


class Refused(Exception):
    pass


# -- clef-tt plan ---------------------------------------------------------------------------------
def plan_tables(binary, start):
    """{section: {op: (runs, GFLOP, ms at the measured rate, ms at peak)}} of `clef-tt plan`."""
    out = subprocess.run(
        [
            binary,
            "plan",
            "--shape",
            "clef-27b",
            "--mesh",
            "1x2",
            "--precision",
            "selected",
            "--tokens",
            str(T),
            "--start",
            str(start),
            "--patches",
            str(PATCHES),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    tables, section = {}, None
    for line in out.splitlines():
        if line.startswith("## "):
            section = (
                "chunk" if "prefill chunk" in line else "vision" if "Vision tower" in line else None
            )
            continue
        cells = [c.strip() for c in line.strip()[1:-1].split(" | ")]
        if section and len(cells) == 7 and re.fullmatch(r"\d+", cells[1]):
            tables.setdefault(section, {})[cells[0]] = (
                int(cells[1]),
                float(cells[2]),
                float(cells[5]),
                float(cells[6]),
            )
    return tables


def find_binary(arg):
    for p in ([arg] if arg else []) + [
        os.environ.get("CLEF_TT_BIN", ""),
        os.path.join(REPO, "target/tt/debug/clef-tt"),
        os.path.join(REPO, "target/debug/clef-tt"),
    ]:
        if p and os.access(p, os.X_OK):
            return p
    return None


# -- graph capture --------------------------------------------------------------------------------
def short(name):
    """A program factory's name without namespaces ("X::ProgramFactory" when that is all)."""
    if not name:
        return "-"
    parts = name.split("::")
    return "::".join(parts[-2:]) if parts[-1] == "ProgramFactory" else parts[-1]


def summarize(ttnn, graph):
    """Device operations of one captured ABI op: [{name, factory, programs: [[(CB bytes, core
    ranges)] per program], l1: [bytes per bank]}] (a mesh workload has one program per device,
    each starting with circular_buffer_deallocate_all) and the op's peak usage per core."""
    devops, stack = [], []
    for node in graph:
        kind, p = node["node_type"], node.get("params") or {}
        if kind == "function_start":
            d = None
            if "program_factory_type" in p:
                d = dict(
                    name=p["name"], factory=short(p["program_factory_type"]), programs=[], l1=[]
                )
                devops.append(d)
            stack.append(d)
        elif kind == "function_end":
            if stack:
                stack.pop()
        else:
            owner = next((d for d in reversed(stack) if d is not None), None)
            if owner is None:
                continue
            if kind == "circular_buffer_deallocate_all":
                owner["programs"].append([])
            elif kind in ("circular_buffer_allocate", "dataflow_buffer_allocate"):
                if not owner["programs"]:
                    owner["programs"].append([])
                owner["programs"][-1].append((int(p["size"]), p.get("core_range_set", "")))
            elif kind == "buffer_allocate" and p.get("type") == "L1":
                owner["l1"].append(int(p.get("max_size_per_bank") or p["size"]))
    usage = ttnn._ttnn.graph.extract_resource_usage_per_core(graph)
    return devops, usage


def fatal(e):
    """The TT_FATAL line (or first line) of a ttnn error."""
    text = str(e)
    for line in text.splitlines():
        if "TT_FATAL" in line or "TT_THROW" in line:
            return line.strip()[:300]
    return (text.splitlines() or [repr(e)])[0][:300]


class Capture(Bench):
    """Bench whose op hook runs each ABI op, then captures a second call (NO_DISPATCH)."""

    def __init__(self):
        super().__init__(seed=27)
        import ttnn

        self.ttnn = ttnn
        self.graph = ttnn._ttnn.graph
        self.rows = []

    @staticmethod
    def _kv_tails(args):
        """The block bookkeeping of the KV pools among `args`, and in a list argument (a layer
        op's tensors), restored so a captured re-run takes the path the first run took."""
        flat = [e for a in args for e in (a if isinstance(a, list) else [a])]
        return [
            (a[1].pool, (list(a[1].pool.refs), list(a[1].pool.filled), list(a[1].pool.free)))
            for a in flat
            if isinstance(a, tuple) and len(a) == 2 and isinstance(a[1], KV)
        ]

    def _release(self, out, inputs):
        if isinstance(out, (tuple, list)):
            for o in out:
                self._release(o, inputs)
        elif isinstance(out, KV):
            out.release(self.ttnn)
        elif hasattr(out, "release") and not any(t is out.t for t in inputs):
            out.release(self.ttnn)

    def op(self, label, fn, *args):
        tails = self._kv_tails(args)
        row = dict(
            label=label,
            accepted=True,
            devops=[],
            usage=None,
            metas=[a[0] for a in args if isinstance(a, tuple) and len(a) == 2],
        )
        self.rows.append(row)
        try:
            out = fn(*args)
        except Exception as e:  # ttnn's refusal (TT_FATAL) or the package's ValueError
            row.update(accepted=False, error=fatal(e))
            raise Refused(label) from e
        after = self._kv_tails(args)
        for pool, (refs, filled, free) in tails:
            pool.refs, pool.filled, pool.free = refs, filled, free
        inputs = [
            t
            for a in args
            if isinstance(a, tuple) and len(a) == 2 and hasattr(a[1], "tensors")
            for t in a[1].tensors()
        ]
        g = self.graph
        g.begin_graph_capture(g.RunMode.NO_DISPATCH)
        try:
            again = fn(*args)
            self._release(again, inputs)
            del again
        except Exception as e:
            row["capture_error"] = fatal(e)
        finally:
            graph = g.end_graph_capture()
        for pool, (refs, filled, free) in after:
            pool.refs, pool.filled, pool.free = refs, filled, free
        row["devops"], row["usage"] = summarize(self.ttnn, graph)
        return out

    # -- the layers -------------------------------------------------------------------------------
    def f32_state(self):
        """A nonzero f32 DeltaNet state [value heads x key dim, value dim] per device."""
        arrays = [self.values((1, 1, NV * DK, DV), 0.1) for _ in range(self.n)]
        t = self.m.host_rows(arrays, self.ttnn.float32, self.ttnn.TILE_LAYOUT)
        return self.res(self.m.wrap(t), NV * DK, DV, SHARDED)

    def prefix(self, rows):
        """K and V caches of `rows` rows, appended chunk by chunk as a prefill leaves them."""
        keys = vals = None
        for r0 in range(0, rows, T):
            n = min(T, rows - r0)
            k = self.act(n, KV_HEADS * HEAD_DIM, SHARDED)
            v = self.act(n, KV_HEADS * HEAD_DIM, SHARDED)
            keys = self.res(
                self.m.append_rows(keys, k, KV_HEADS), r0 + n, KV_HEADS * HEAD_DIM, SHARDED
            )
            vals = self.res(
                self.m.append_rows(vals, v, KV_HEADS), r0 + n, KV_HEADS * HEAD_DIM, SHARDED
            )
        return keys, vals

    def kinds(self, only):
        w = self.weights()
        h = self.act(T, HIDDEN)
        out = {}

        def run(kind, fn):
            if only and kind not in only:
                return
            self.rows = []
            t0 = time.perf_counter()
            try:
                fn()
            except Refused:
                pass
            out[kind] = (self.rows, time.perf_counter() - t0)

        run("attention0", lambda: self.attention(w, h, T, None, self.positions(0, T)))

        def cached():
            keys, vals = self.prefix(PREFIX)
            self.attention(w, h, T, (keys, vals), self.positions(PREFIX, T))
            slot = self.res(self.m.copy(keys[0], keys[1]), PREFIX, KV_HEADS * HEAD_DIM, SHARDED)
            self.op(
                "append_rows K onto a prefix-slot copy",
                self.m.append_rows,
                slot,
                self.act(T, KV_HEADS * HEAD_DIM, SHARDED),
                KV_HEADS,
            )

        run("attention15360", cached)
        run("deltanet0", lambda: self.delta(w, h, T, None))

        def with_state():
            carry = self.act(KERNEL - 1, 2 * NK * DK + NV * DV, SHARDED)
            self.delta(w, h, T, (carry, self.f32_state()))

        run("deltanet_state", with_state)
        run("mlp", lambda: self.mlp(w, h, T))

        def layer_ops():
            # What the backbone calls on a ttnn mesh: one layer op per sublayer.
            self.attention_layer(w, h, T, None, self.positions(0, T))
            keys, vals = self.prefix(PREFIX)
            self.attention_layer(w, h, T, (keys, vals), self.positions(PREFIX, T))
            self.delta_layer(w, h, T, None)
            carry = self.act(KERNEL - 1, 2 * NK * DK + NV * DV, SHARDED)
            self.delta_layer(w, h, T, (carry, self.f32_state()))
            self.mlp_layer(w, h, T)

        run("layer_ops", layer_ops)

        def vision():
            vw = self.vision_weights()
            x = self.act(PATCHES, V_HIDDEN)
            cos, sin = self.act(PATCHES, V_DIM), self.act(PATCHES, V_DIM)
            self.vision_block(vw, x, PATCHES, cos, sin)

        run("vision", vision)
        return out


# -- the report -----------------------------------------------------------------------------------
TITLES = {
    "attention0": ("Gated attention layer, 1,024 tokens from position 0", "attention", 0),
    "attention15360": (
        "Gated attention layer, 1,024 tokens after a cached prefix of 15,360 (16,384 keys)",
        "attention",
        PREFIX,
    ),
    "deltanet0": ("Gated DeltaNet layer, 1,024 tokens from a zero state", "deltanet", 0),
    "deltanet_state": (
        "Gated DeltaNet layer, 1,024 tokens from a nonzero f32 state and conv carry",
        "deltanet",
        PREFIX,
    ),
    "mlp": ("MLP, 1,024 tokens", "mlp", 0),
    "layer_ops": (
        "Layer ops, 1,024 tokens: attention from 0 and after 15,360 cached rows, "
        "DeltaNet from a zero and a nonzero state, MLP",
        "attention",
        0,
    ),
    "vision": ("Vision block (Clef 27B tower), 1,024 patches", "vision", 0),
}


def kib(n):
    return "%.0f KiB" % (n / 1024.0) if n else "0"


def busiest(d):
    """(CB count, CB bytes per core, [CB bytes]) of a device op's program with the most CB bytes
    on one core (CBs summed per core range set)."""
    best = (0, 0, [])
    for prog in d["programs"]:
        per = {}
        for size, cores in prog:
            per[cores] = per.get(cores, 0) + size
        top = max(per.values()) if per else 0
        if top > best[1]:
            best = (len(prog), top, [c for c, _ in prog])
    return best


def md(text):
    return text.replace("|", "\\|")


def devop_text(devops):
    """Device ops grouped by (op, factory) in first-seen order: count, factory, and the CBs
    (count, bytes per core) of the group's largest."""
    groups = {}
    for d in devops:
        key = (d["name"].replace("DeviceOperation", ""), d["factory"])
        count, size, _ = busiest(d)
        n, best = groups.get(key, (0, (0, 0)))
        groups[key] = (n + 1, max(best, (size, count)))
    if not groups:
        return "(none: views / host)"
    return "<br>".join(
        "%s%s: %s [%d CB, %s]" % (n, " ×%d" % c if c > 1 else "", f, cbs[1], kib(cbs[0]))
        for (n, f), (c, cbs) in groups.items()
    )


def plan_cells(label, kind, plan, seen):
    name = PLAN_OP.get(label) or (ALL_REDUCE.get(kind) if label == "all_reduce" else None)
    if name is None:
        return "— (not in the plan: slices / views)", "", ""
    section = "vision" if kind == "vision" else "chunk"
    entry = (plan or {}).get(section, {}).get(name)
    if entry is None:
        return name, "n/a", "n/a"
    if name in seen:
        return name, "〃", "〃"
    seen.add(name)
    runs, gflop, ms, _ = entry
    return name, "%.3g" % (gflop / runs), "%.3g" % (ms / runs)


def matmul_rows(m, rows, kind):
    """(label, shape, programs.py's config, factory, CBs) of every linear in rows."""
    out = []
    for r in rows:
        if not r["label"].startswith("linear"):
            continue
        mx, mw = r["metas"][0], r["metas"][1]
        out_tile = tile_bytes(F32 if mx.placement == SHARDED else BF16)
        in1 = tile_bytes(mw.dtype)
        # As text_ops.linear asks: bf16 activations, the weight's tiles, f32 partial sums.
        b = programs.matmul_blocks(
            mx.rows, mw.rows, mw.cols, m.grid, in0_tile=2048, in1_tile=in1, out_tile=out_tile
        )
        if b["in0_block_w"] is None:
            asked = (
                "none (ttnn chooses): its 2-D blocking (%dx%d cores, per core %dx%d tiles) "
                "needs ~%s of CBs at in0_block_w 1, over the %s budget"
                % (
                    b["cols"],
                    b["rows"],
                    b["per_core_m"],
                    b["per_core_n"],
                    kib(b["cb_bytes"]),
                    kib(programs.MATMUL_CB_BUDGET),
                )
            )
        else:
            asked = "2-D %dx%d cores, per core %dx%d tiles, in0_block_w %d (~%s CBs)" % (
                b["cols"],
                b["rows"],
                b["per_core_m"],
                b["per_core_n"],
                b["in0_block_w"],
                kib(b["cb_bytes"]),
            )
        mm = [d for d in r["devops"] if d["name"].startswith("Matmul")]
        factory = ", ".join(d["factory"] for d in mm) or ("REFUSED" if not r["accepted"] else "-")
        cbs = busiest(mm[0])[2] if mm else []
        out.append(
            (
                md(r["label"]),
                "%d×%d · %d×%d %s"
                % (
                    mx.rows,
                    mx.cols,
                    mw.rows,
                    mw.cols,
                    {F32: "f32", BF16: "bf16"}.get(mw.dtype, "bfp8_b"),
                ),
                asked,
                factory,
                "%s: %s" % (kib(sum(cbs)), " + ".join(kib(c) for c in cbs)) if cbs else "-",
                factory.startswith(TWO_D),
            )
        )
    return out


def render(results, plans, mesh, l1_total):
    lines = []
    refused = []
    for key, (rows, secs) in results.items():
        title, kind, start = TITLES[key]
        plan = plans.get(start)
        lines.append("### %s\n" % title)
        lines.append(
            "| ABI op | ttnn device ops: program factory [CBs, bytes per core] "
            "| peak L1 per core | accepted | plan op | plan GFLOP | plan ms at 190 "
            "TFLOP/s |"
        )
        lines.append("|---|---|---|---|---|---|---|")
        seen = set()
        for r in rows:
            name, gf, ms = plan_cells(r["label"], kind, plan, seen)
            if not r["accepted"]:
                refused.append((title, r["label"], r["error"]))
                lines.append(
                    "| %s | — | — | **no**: %s | %s | %s | %s |"
                    % (md(r["label"]), md(r["error"]), md(name), gf, ms)
                )
                lines.append(
                    "| (the layer stops here: the ops after it were not run) | | | | | | |"
                )
                continue
            u = r["usage"]
            peak = kib(u.peak_total) + (" (L1 buffers %s)" % kib(u.peak_l1) if u.peak_l1 else "")
            acc = "yes" if "capture_error" not in r else "yes (capture: %s)" % r["capture_error"]
            lines.append(
                "| %s | %s | %s | %s | %s | %s | %s |"
                % (md(r["label"]), devop_text(r["devops"]), peak, md(acc), md(name), gf, ms)
            )
        lines.append(
            "\n%d ABI ops, %d ttnn device ops; %.1f s (run + capture)\n"
            % (len(rows), sum(len(r["devops"]) for r in rows), secs)
        )
    lines.append(
        "### Matmuls: the program config programs.py asked for and the factory ttnn used\n"
    )
    lines.append(
        "| layer | ABI op | x · W (per device) | programs.py config | ttnn factory | "
        "CBs per core | 2-D multicast |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for key, (rows, _) in results.items():
        for label, shape, asked, factory, cbs, two_d in matmul_rows(mesh, rows, key):
            lines.append(
                "| %s | %s | %s | %s | %s | %s | %s |"
                % (key, label, shape, asked, factory, cbs, "yes" if two_d else "**no**")
            )
    lines.append(
        "\nBlackhole L1: 1536 KiB per core; ttnn refuses a program whose CBs grow "
        'past it ("Statically allocated ... buffers ... beyond max L1 size"); the '
        "allocator's L1 buffer region is %s per core.\n" % kib(l1_total)
    )
    return "\n".join(lines), refused


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", help="the clef-tt binary (default: target/tt/debug/clef-tt)")
    ap.add_argument("--md", help="also write the report to this file")
    ap.add_argument("--only", default="", help="comma-separated: " + ",".join(TITLES))
    a = ap.parse_args()
    t0 = time.perf_counter()
    binary = find_binary(a.plan)
    plans = {}
    if binary:
        plans = {s: plan_tables(binary, s) for s in (0, PREFIX)}
    else:
        print("(no clef-tt binary: plan columns left out)", file=sys.stderr)
    cap = Capture()
    only = {k for k in a.only.split(",") if k}
    results = cap.kinds(only)
    ttnn = cap.ttnn
    l1 = ttnn.get_memory_view(cap.m.device, ttnn.BufferType.L1).total_bytes_per_bank
    text, refused = render(results, plans, cap.m, int(l1))
    cap.m.close()
    print(text)
    total = time.perf_counter() - t0
    print("Run time: %.0f s (mock P150x2, ttnn %s)" % (total, ct_version()))
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    if refused:
        print("\nREFUSED by ttnn:", file=sys.stderr)
        for title, label, err in refused:
            print("  %s / %s: %s" % (title, label, err), file=sys.stderr)
        return 1
    return 0


def ct_version():
    return bl.ct.TTNN_VERSION


if __name__ == "__main__":
    sys.exit(main())
