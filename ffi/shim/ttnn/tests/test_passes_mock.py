"""The layer op "pass" (clef_tt_ttnn/passes.py) and its traces, on the mock P150x2 in the
golden-shadow mode (CLEF_TT_GOLDEN=1: downloads return what ttnn's golden functions computed, a
replayed trace included).

At Clef 27B's TP=2 per-device shapes with random weights (bench_layers_mock.Bench), a model of
2 layers (a DeltaNet and an attention layer, each with its MLP) runs prompts in two chunks:
128 rows from the start, then 70 rows continuing it (a bucket of 128 with 58 pad rows). Prompt
A runs eagerly (the first pass of each form), prompt B is captured and replayed, prompt A again
only replayed. Checked:
- every pass's final rows equal the layer ops run one by one (the backbone's per-layer path)
  on the same rows within 1e-2 of the largest (the same ops; at 70 rows torch's f32 matmuls in
  the goldens round some rows differently than at the bucket's 128, a bf16 ulp or two after
  the layers), and every state it leaves (keys, values, conv carry, recurrent state) within
  1e-6: the pad rows change nothing;
- a replayed pass equals the same pass run eagerly, bit for bit (prompt A both ways);
- a replay launches no device op (ttnn's graph capture around it counts none);
- a continuing pass from states that are not the live ones (a prefix-cache slot's copies)
  equals the one continuing in place, and a state the caller kept (not consumed) is still
  readable after later passes (materialized before they overwrite the live buffers);
- batched passes (packing): 3 requests in blocks keeping 2 prefixes' states, then 2 tails
  continuing one kept prefix, each eagerly and replayed, equal the batched layer ops one by
  one (rows and kept states) bit for bit;
- the planted missing copy (CLEF_TT_GOLDEN_MUTATE=stale_input: the rows not written before a
  replay) makes a replayed pass differ: run in a child process, it must fail.

Run (needs the kit with torch; from a scratch folder):
    source /tmp/ttmock/env.sh
    cd "$(mktemp -d)" && $CLEF_TT_PYTHON /path/to/ffi/shim/ttnn/tests/test_passes_mock.py
"""

import os
import subprocess
import sys

import numpy as np

os.environ["CLEF_TT_GOLDEN"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_layers_mock as B  # noqa: E402
from clef_tt_ttnn.meta import ACTIVATION, F32, REPLICATED, SHARDED, TILE, Meta  # noqa: E402

FAILED = []
KINDS = "DA"


def check(name, ok, detail=""):
    print("%-60s %s %s" % (name, detail, "ok" if ok else "FAIL"))
    if not ok:
        FAILED.append(name)


class Model:
    def __init__(self, b):
        self.b, self.m, self.w = b, b.m, b.weights()

    def meta(self, rows, cols):
        return Meta(rows, cols, self.m.n, F32, TILE, ACTIVATION, SHARDED)

    def values(self, pair):
        meta, obj = pair
        a = np.frombuffer(self.m.download(meta, obj, 0), np.float32)
        return a.reshape(meta.rows, meta.cols)

    def layers(self, h, t, start, states, batch=None, each=None):
        """The per-layer path: (final rows, states; a batch: each kept prefix's states)."""
        b, w, m = self.b, self.w, self.m
        out = []
        positions = b.positions(start, each or t)
        for kind, st in zip(KINDS, states):
            if kind == "A":
                res = b.attention_layer(w, h, t, st, positions, batch)
            else:
                res = b.delta_layer(w, h, t, st, batch)
            h, st = (res, []) if batch and not batch.get("keep") else res
            out.append(st)
            h = b.mlp_layer(w, h, t)
        y = m.rms_norm(h, w["norm"], B.HIDDEN, B.EPS, 1)
        if batch:
            # Per kept prefix, its layers' states.
            out = [list(s) for s in zip(*out)] if any(batch.get("keep") or []) else []
        return (self.meta(t, B.HIDDEN), y), out

    def run_pass(self, rows, t, start, states, consume, batch=None, each=None):
        """The pass op: (final rows, states; a batch: each kept prefix's states)."""
        w = self.w
        tensors, specs = [rows, w["norm"]], []
        for kind, st in zip(KINDS, states):
            if kind == "A":
                tensors += [w["norm"], w["qkv"], w["qn"], w["kn"], w["o"]]
                mixer = dict(heads=B.HEADS, kv_heads=B.KV_HEADS, head_dim=B.HEAD_DIM)
            else:
                tensors += [w["norm"], w["in"], w["conv"], w["alog"], w["dt"], w["gnorm"], w["out"]]
                mixer = dict(
                    key_heads=B.NK,
                    value_heads=B.NV,
                    key_dim=B.DK,
                    value_dim=B.DV,
                    conv_kernel=B.KERNEL,
                )
            mixer.update(eps=B.EPS, reduce=1)
            tensors += [w["norm"], w["gu"], w["down"]]
            tensors += list(st) if st else [None, None]
            specs.append(
                dict(
                    kind="attention" if kind == "A" else "delta_net",
                    mixer=mixer,
                    mlp=dict(eps=B.EPS, reduce=1),
                )
            )
        p = dict(layers=specs, eps=B.EPS, config=B.CFG, start=start, consume=consume)
        if batch:
            p["batch"] = batch
        results = self.m.layer_op("pass", tensors, p, self.b.positions(start, each or t))
        out, it = (self.meta(t, B.HIDDEN), results[0]), iter(results[1:])
        kv_cols, ch = B.KV_HEADS * B.HEAD_DIM, 2 * B.NK * B.DK + B.NV * B.DV
        kept = [n for n in batch.get("keep") or []] if batch else [start + t]
        kept = [n for n in kept if n]
        per = [[] for _ in kept]
        for kind in KINDS:
            for i, n in enumerate(kept):
                a, c = next(it), next(it)
                if kind == "A":
                    per[i].append(((self.meta(n, kv_cols), a), (self.meta(n, kv_cols), c)))
                else:
                    per[i].append(((self.meta(3, ch), a), (self.meta(B.NV * B.DK, B.DV), c)))
        return out, (per if batch else per[0])

    def state_values(self, states):
        return [self.values(s) for st in states for s in st]


def batched(model):
    """Batched passes (packing): fresh requests keeping prefixes' states, then tails of one
    kept prefix continuing it; each form run eagerly, then captured and replayed, against the
    batched layer ops one by one."""
    b, m = model.b, model.m
    none = [None] * len(KINDS)

    def rows(lengths, each):
        v = np.zeros((len(lengths) * each, B.HIDDEN), np.float32)
        for i, n in enumerate(lengths):
            v[i * each : i * each + n] = b.values((n, B.HIDDEN))
        return v

    def upload(v):
        meta = Meta(v.shape[0], B.HIDDEN, m.n, F32, TILE, ACTIVATION, REPLICATED)
        return meta, m.upload(meta, [v.tobytes()])

    fresh = {"requests": 3, "lengths": [100, 70, 64], "keep": [64, 0, 64]}
    v = rows(fresh["lengths"], 128)
    ref, ref_kept = model.layers(upload(v), 384, 0, none, fresh, 128)
    want = [model.values(ref)] + [x for st in ref_kept for x in model.state_values(st)]
    got_kept = None
    for turn in ("eager", "replayed"):
        got, got_kept = model.run_pass(upload(v), 384, 0, none, False, fresh, 128)
        have = [model.values(got)] + [x for st in got_kept for x in model.state_values(st)]
        check(
            "batch of 3 keeping 2 prefixes (%s) = the batched layer ops" % turn,
            same(have, want),
            "max %.2e" % worst(have, want),
        )
    # Two tails of 40 and 50 rows continuing the first kept prefix (64 rows).
    tails = {"requests": 2, "lengths": [40, 50]}
    v = rows(tails["lengths"], 64)
    ref, _ = model.layers(upload(v), 128, 64, ref_kept[0], tails, 64)
    want = model.values(ref)
    for turn in ("eager", "replayed"):
        got, _ = model.run_pass(upload(v), 128, 64, got_kept[0], False, tails, 64)
        have = model.values(got)
        check(
            "batch of 2 tails continuing a kept prefix (%s) = the batched layer ops" % turn,
            same([have], [want]),
            "max %.2e" % worst([have], [want]),
        )


def same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def worst(a, b):
    return max(float(np.abs(x - y).max() / max(1e-6, np.abs(y).max())) for x, y in zip(a, b))


def main():
    b = B.Bench(seed=3)
    model = Model(b)
    m = model.m
    none = [None] * len(KINDS)
    # Two prompts' chunks: A (eager, then replayed), B (captured). Each use uploads its rows
    # anew, as the backbone does per chunk (a pass writes an upload no op has read yet straight
    # into its input).
    values = [[b.values((n, B.HIDDEN)) for n in (128, 70)] for _ in range(2)]

    def upload(v):
        meta = Meta(v.shape[0], B.HIDDEN, m.n, F32, TILE, ACTIVATION, REPLICATED)
        return meta, m.upload(meta, [v.tobytes()])

    class Rows:
        def __getitem__(self, which):
            return [upload(v) for v in values[which]]

    prompts = Rows()

    def prompt(rows, launches=None):
        """Both chunks as passes: (rows of each, states after the second). `launches`: a list
        that gets the device ops the passes launched (ttnn's graph capture around them)."""
        first, second = rows
        if launches is not None:
            m.command({"graph_capture": "begin"})
        got1, gs1 = model.run_pass(first, 128, 0, none, False)
        out1 = model.values(got1)
        got2, gs2 = model.run_pass(second, 70, 128, gs1, True)
        out2 = model.values(got2)
        if launches is not None:
            launches.append(m.command({"graph_capture": "end"}))
        return [out1, out2], model.state_values(gs2)

    results = {}
    for turn, which in enumerate((0, 1, 0)):
        rows = prompts[which]
        ref1, rs1 = model.layers(prompts[which][0], 128, 0, none)
        ref2, rs2 = model.layers(prompts[which][1], 70, 128, rs1)
        want = [model.values(ref1), model.values(ref2)]
        want_states = model.state_values(rs2)
        traced = m.pass_counts["traced"]
        launches = [] if turn == 2 else None
        got, states = prompt(rows, launches)
        if launches:
            graph = launches[0]
            check(
                "a replayed pass launches no device op",
                graph["device_ops"] == 0,
                "%d device ops %s, %d host writes"
                % (graph["device_ops"], graph["programs"], graph["host_writes"]),
            )
        mode = "traced" if m.pass_counts["traced"] > traced else "eager"
        check(
            "prompt %s turn %d (%s): final rows = the layers one by one"
            % ("AB"[which], turn, mode),
            worst(got, want) <= 1e-2,
            "max |diff| / max |ref| %.2e" % worst(got, want),
        )
        check(
            "prompt %s turn %d (%s): states = the layers one by one" % ("AB"[which], turn, mode),
            worst(states, want_states) <= 1e-6,
            "max %.2e" % worst(states, want_states),
        )
        if which in results:
            check(
                "prompt A replayed = prompt A eager, bit for bit",
                same(got, results[which][0]) and same(states, results[which][1]),
                "max %.2e" % worst(got + states, results[which][0] + results[which][1]),
            )
        results.setdefault(which, (got, states))
    check("the first pass of each form ran eagerly, then replays", m.pass_counts["traced"] == 4)
    if os.environ.get("CLEF_TT_GOLDEN_MUTATE"):
        return 1 if FAILED else 0

    # A state the caller keeps (a prefix-cache slot): prompt A's first chunk, kept; then
    # prompt B runs (the live buffers overwritten: the kept state was copied first); then A's
    # second chunk continues the kept copy (restored into the live buffers).
    got1, kept = model.run_pass(prompts[0][0], 128, 0, none, False)
    out1 = model.values(got1)
    prompt(prompts[1])
    got2, gs2 = model.run_pass(prompts[0][1], 70, 128, kept, False)
    got = [out1, model.values(got2)]
    check(
        "a kept state, continued after another prompt = in place",
        same(got, results[0][0]) and same(model.state_values(gs2), results[0][1]),
        "max %.2e" % worst(got, results[0][0]),
    )
    batched(model)
    # A tensor allocated while traces exist lands outside every range their replays write (the
    # arena's placeholders hold them).
    ttnn = m.ttnn
    late = ttnn.allocate_tensor_on_device(
        ttnn.Shape([1, 1, 2048, 2048]), ttnn.bfloat16, ttnn.TILE_LAYOUT, m.device, m.dram
    )
    a = int(late.buffer_address())
    b = a + m.footprint(late) // m.dram_banks
    hit = [r for t in m.traces.values() for r in t.ranges if r[0] < b and a < r[1]]
    check("a tensor allocated after captures lands outside their arena", not hit, str(hit[:2]))
    print("pass counts:", m.pass_counts, "traces:", m.trace_facts())

    # The planted missing copy: the same checks with the rows not written before a replay.
    child = subprocess.run(
        [sys.executable, os.path.abspath(__file__)],
        env=dict(os.environ, CLEF_TT_GOLDEN_MUTATE="stale_input"),
        capture_output=True,
        text=True,
    )
    caught = [ln for ln in child.stdout.splitlines() if "bit for bit" in ln and "FAIL" in ln]
    check(
        "stale_input (rows not written before a replay) is caught",
        child.returncode == 1 and bool(caught),
        (caught or ["exit %d" % child.returncode])[0].split("  ")[-1].strip(),
    )
    return 1 if FAILED else 0


if __name__ == "__main__":
    code = main()
    print("%d checks failed" % len(FAILED) if FAILED else "all checks passed")
    sys.exit(code)
