"""The layer ops (clef_tt_ttnn/layers.py) against the fine-op composition they replace, on the
mock P150x2 in the golden-shadow mode (CLEF_TT_GOLDEN=1: downloads return what ttnn's golden
functions, and the package's own shadows, computed).

At Clef 27B's TP=2 per-device shapes with random weights (bench_layers_mock.Bench: its fine
methods are the ABI op sequence of src/backbone, its *_layer methods the layer ops), for a
tile-aligned chunk, an unaligned one and an unaligned chunk after an unaligned cache:
- attention and MLP: the residual stream and the KV rows equal the composition's exactly (the
  same ops on the same values, in other layouts);
- DeltaNet: the conv carry and the recurrent state exactly; the residual stream within 4e-3 of
  its largest value (the layer op norms the delta rule's f32 output before rounding to bf16, the
  composition rounds first; one bf16 ulp is 3.9e-3), from the sequence start and from a carried
  state.
Then two identical chunks of 8 layers allocate their device buffers at the same addresses and
write nothing from the host (ttnn's graph capture: what trace capture on chips needs). Then the
refusals: a form a layer op does not take (a rotary width `rotary_embedding_hf`
refuses, a head dim not a multiple of 32, an FFN split off tiles) raises NotImplementedError
before any ttnn call, so the caller's fallback to the fine ops starts from a clean mesh.

Run (needs torch in the kit's venv; from a scratch folder, ttnn writes `generated/` there):
    source /tmp/ttmock/env.sh
    cd "$(mktemp -d)" && $CLEF_TT_PYTHON /path/to/ffi/shim/ttnn/tests/test_layer_ops_mock.py
"""

import os
import sys

import numpy as np

os.environ["CLEF_TT_GOLDEN"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_layers_mock as B  # noqa: E402

FAILED = []


def check(name, err, tol):
    ok = err <= tol
    print(
        "%-48s max |diff| / max |ref| %.2e (tol %.0e) %s" % (name, err, tol, "ok" if ok else "FAIL")
    )
    if not ok:
        FAILED.append(name)


def main():
    b = B.Bench(seed=3)
    m = b.m
    w = b.weights()

    def values(pair):
        meta, obj = pair
        return np.frombuffer(m.download(meta, obj, 0), np.float32).reshape(meta.rows, meta.cols)

    def compare(name, ref, got, tol=0.0):
        r, g = values(ref), values(got)
        check(name, float(np.abs(r - g).max() / max(1e-6, np.abs(r).max())), tol)

    for t, start in ((128, 0), (100, 0), (64, 100)):
        h = b.act(t, B.HIDDEN)
        cache = None
        if start:
            cache = b.attention(w, b.act(start, B.HIDDEN), start, None, b.positions(0, start))[1]
        at = "T=%d from %d" % (t, start)
        ref, (rk, rv) = b.attention(w, h, t, cache, b.positions(start, t))
        got, (gk, gv) = b.attention_layer(w, h, t, cache, b.positions(start, t))
        compare("attention %s: residual" % at, ref, got)
        compare("attention %s: keys" % at, rk, gk)
        compare("attention %s: values" % at, rv, gv)
        state = None
        for turn in ("start", "carried"):
            ref, rs = b.delta(w, h, t, state)
            got, gs = b.delta_layer(w, h, t, state)
            compare("deltanet T=%d (%s): residual" % (t, turn), ref, got, 4e-3)
            compare("deltanet T=%d (%s): conv carry" % (t, turn), rs[0], gs[0])
            compare("deltanet T=%d (%s): state" % (t, turn), rs[1], gs[1])
            state = rs
        compare("mlp T=%d: residual" % t, b.mlp(w, h, t), b.mlp_layer(w, h, t))

    batched(b, w, values)

    # Two identical chunks of 8 layers (6 DeltaNet, 2 attention, each with its MLP), after one
    # that warms up programs, constants and spare KV pools: the same device buffers at the same
    # addresses and no host write (what ttnn's trace capture needs on chips; traces themselves
    # crash in mock mode).
    h = b.act(128, B.HIDDEN)

    def chunk():
        x, states = h, []
        for i in range(8):
            x, st = (
                b.attention_layer(w, x, 128, None, b.positions(0, 128))
                if i % 4 == 3
                else b.delta_layer(w, x, 128, None)
            )
            states.append(st)
            x = b.mlp_layer(w, x, 128)
        return x, states

    chunk()
    captured = []
    for _ in range(2):
        m.command({"graph_capture": "begin"})
        out = chunk()
        captured.append(m.command({"graph_capture": "end"}))
        del out
    first, second = captured
    same = first["allocations"] == second["allocations"] and len(first["allocations"]) > 0
    writes = first["host_writes"] + second["host_writes"]
    print(
        "%-48s %d buffers, %s addresses, %d host writes %s"
        % (
            "two identical chunks",
            len(first["allocations"]),
            "the same" if same else "other",
            writes,
            "ok" if same and writes == 0 else "FAIL",
        )
    )
    if not same or writes:
        FAILED.append("two identical chunks")

    # Refusals before any ttnn call.
    h = b.act(64, B.HIDDEN)
    narrow = b.matrix(B.HIDDEN, 2 * 48, B.BFP8_B)
    refusals = {
        "attention, rotary 8": lambda: m.layer_op(
            "attention",
            [h, w["norm"], w["qkv"], w["qn"], w["kn"], w["o"], None, None],
            dict(
                heads=B.HEADS,
                kv_heads=B.KV_HEADS,
                head_dim=B.HEAD_DIM,
                eps=B.EPS,
                reduce=1,
                config=B.CFG,
            ),
            (64, 4, bytes(64 * 4 * 4), bytes(64 * 4 * 4)),
        ),
        "deltanet, key dim 100": lambda: m.layer_op(
            "delta_net",
            [
                h,
                w["norm"],
                w["in"],
                w["conv"],
                w["alog"],
                w["dt"],
                w["gnorm"],
                w["out"],
                None,
                None,
            ],
            dict(
                key_heads=B.NK,
                value_heads=B.NV,
                key_dim=100,
                value_dim=100,
                conv_kernel=4,
                eps=B.EPS,
                reduce=1,
                config=B.CFG,
            ),
            None,
        ),
        "mlp, gate|up off tiles": lambda: m.layer_op(
            "mlp", [h, w["norm"], narrow, w["down"]], dict(eps=B.EPS, reduce=1, config=B.CFG), None
        ),
        "an unknown layer op": lambda: m.layer_op("moe", [h], {}, None),
    }
    for name, call in refusals.items():
        m.reset_op_stats()
        try:
            call()
            refused = False
        except NotImplementedError:
            refused = True
        calls = m.tt.total_calls()
        ok = refused and calls == 0
        print(
            "%-48s %s after %d ttnn calls %s"
            % (
                "refused: " + name,
                "NotImplementedError" if refused else "ran",
                calls,
                "ok" if ok else "FAIL",
            )
        )
        if not ok:
            FAILED.append(name)
    m.close()
    if FAILED:
        print("FAIL: %d checks: %s" % (len(FAILED), ", ".join(FAILED)))
        sys.exit(1)
    print("layer ops: every check passed")


def batched(b, w, values):
    """A batched pass's mixers (layers.py: requests in blocks of `each` rows, random rows after
    each request, which must change nothing) against each request's layer op alone: every
    request's rows within one bf16 ulp of the largest value. The inputs are small (scale 1e-3)
    so that the residual is the sublayer's own output (the input norm makes that output the
    same at any input scale). Measured: DeltaNet up to 3.1e-3, attention up to 2.2e-3: the
    projections run over all 192 rows, a different matmul program from a request's own rows,
    as an ordinary pass of another length. Attention runs twice: with one block's text
    positions shared by every block, and with every block at positions of its own (media: the
    heads are roped over all rows, then split into blocks); with the blocks' positions swapped
    for shared ones, the second is off by up to 8.4e-2. The MLP is row-wise and the same op.
    Then blocks keeping their prefixes' state, and blocks continuing one prefix's state, at
    text positions and (attention) at positions of their own (the conv carry left out of the
    blocks after the first: off by up to 1.8e-1)."""
    lengths = (40, 61, 25)
    each = 64
    own = np.concatenate([np.arange(each) * s for s in (1, 7, 40)])
    alone = [b.values((n, B.HIDDEN), 1e-3) for n in lengths]
    blocks = [np.concatenate([a, b.values((each - len(a), B.HIDDEN))]) for a in alone]

    def upload(rows):
        meta = B.Meta(len(rows), B.HIDDEN, b.n, B.F32, B.TILE, B.ACTIVATION, B.REPLICATED)
        return meta, b.m.upload(meta, [np.ascontiguousarray(rows, np.float32).tobytes()])

    batch = {"requests": len(lengths), "lengths": list(lengths)}
    hb, t = upload(np.concatenate(blocks)), each * len(lengths)
    hs = [upload(a) for a in alone]
    runs = {
        "deltanet": (
            lambda: b.delta_layer(w, hb, t, None, batch),
            lambda h, n, i: b.delta_layer(w, h, n, None)[0],
        ),
        "attention": (
            lambda: b.attention_layer(w, hb, t, None, b.positions(0, each), batch),
            lambda h, n, i: b.attention_layer(w, h, n, None, b.positions(0, n))[0],
        ),
        # Media: every block at positions of its own (tables of all t rows): block i's rows at
        # 0, s, 2s, ... for a stride s of its own (rope is relative: only distances show).
        "attention, own positions": (
            lambda: b.attention_layer(w, hb, t, None, b.tables(own), batch),
            lambda h, n, i: b.attention_layer(
                w, h, n, None, b.tables(own[i * each : i * each + n])
            )[0],
        ),
    }

    def against_alone(runs, name):
        """Each run's batched pass against each request's rows alone, within 4e-3."""
        for kind, (together, solo) in runs.items():
            got = values(together())
            for i, (h, n) in enumerate(zip(hs, lengths)):
                ref = values(solo(h, n, i))
                diff = np.abs(ref - got[i * each : i * each + n]).max()
                err = diff / max(1e-6, np.abs(ref).max())
                check(name(kind, i, n), float(err), 4e-3)

    against_alone(runs, lambda kind, i, n: "batched %s, request %d of %d rows" % (kind, i, n))
    # Kept prefixes (a prefix-cache miss in a batched pass): each kept block's keys, values,
    # conv carry and recurrent state at its prefix's end, against a pass of that prefix alone.
    keep = [32, 32, 0]
    kept_batch = dict(batch, keep=keep)
    kept = {
        "attention": b.attention_layer(w, hb, t, None, b.positions(0, each), kept_batch)[1],
        "deltanet": b.delta_layer(w, hb, t, None, kept_batch)[1],
    }
    parts = {"attention": ("keys", "values"), "deltanet": ("conv carry", "state")}
    for kind, pairs in kept.items():
        blocks_kept = [i for i, n in enumerate(keep) if n]
        for i, pair in zip(blocks_kept, pairs, strict=True):
            prefix = upload(alone[i][: keep[i]])
            if kind == "attention":
                ref = b.attention_layer(w, prefix, keep[i], None, b.positions(0, keep[i]))[1]
            else:
                ref = b.delta_layer(w, prefix, keep[i], None)[1]
            for name, r, g in zip(parts[kind], ref, pair):
                scale = np.abs(values(r)).max()
                # A reference of zeros would pass any copy of zeros: the state must be real.
                err = np.abs(values(r) - values(g)).max() / scale if scale > 0 else np.inf
                check(
                    "batched %s, block %d kept %d: %s" % (kind, i, keep[i], name), float(err), 4e-3
                )
    # Continuations (prefix-cache hits of one slot in a batched pass): every block continues
    # the keys, values, conv carry and state a 64-row prefix left, against each request's rows
    # continuing that state alone.
    p = 64
    prefix = upload(b.values((p, B.HIDDEN), 1e-3))
    cache = b.attention_layer(w, prefix, p, None, b.positions(0, p))[1]
    state = b.delta_layer(w, prefix, p, None)[1]
    continued = {
        "deltanet": (
            lambda: b.delta_layer(w, hb, t, state, batch),
            lambda h, n, i: b.delta_layer(w, h, n, state)[0],
        ),
        "attention": (
            lambda: b.attention_layer(w, hb, t, cache, b.positions(p, each), batch),
            lambda h, n, i: b.attention_layer(w, h, n, cache, b.positions(p, n))[0],
        ),
        # Media: every block at positions of its own after the prefix's.
        "attention, own positions,": (
            lambda: b.attention_layer(w, hb, t, cache, b.tables(p + own), batch),
            lambda h, n, i: b.attention_layer(
                w, h, n, cache, b.tables(p + own[i * each : i * each + n])
            )[0],
        ),
    }
    against_alone(
        continued, lambda kind, i, n: "batched %s from a %d-row state, request %d" % (kind, p, i)
    )
    # Forms a batched pass does not take, refused before any ttnn call.
    for name, bad in (
        ("blocks of 40 rows", {"requests": 3, "lengths": [30, 30, 30]}),
        ("no pad rows", {"requests": 3, "lengths": [64, 10, 10]}),
        ("a prefix off tiles", {"requests": 3, "lengths": [40, 61, 25], "keep": [20, 0, 0]}),
        ("a prefix past its request", {"requests": 3, "lengths": [40, 61, 25], "keep": [0, 0, 32]}),
    ):
        rows = 120 if name.startswith("blocks") else t
        h = upload(np.zeros((rows, B.HIDDEN), np.float32))
        b.m.reset_op_stats()
        try:
            b.delta_layer(w, h, rows, None, bad)
            refused = False
        except NotImplementedError:
            refused = True
        ok = refused and b.m.tt.total_calls() == 0
        print("%-48s %s" % ("batched refused: " + name, "ok" if ok else "FAIL"))
        if not ok:
            FAILED.append("batched refused: " + name)


if __name__ == "__main__":
    main()
