"""Host cost of clef_tt_ttnn per backbone layer, on the mock P150x2 (no chips).

Runs the ABI op sequence of src/backbone/mod.rs for one full-attention layer, one Gated DeltaNet
layer and their MLPs at Clef's TP=2 per-device shapes (hidden 5120; 12 query heads + 2 KV heads
x 256; DeltaNet 8 key heads x 128, 24 value heads x 128; MLP 8704), weights of zero bytes (valid
packed tiles) in the stage-1 profile's dtypes, and prints, per layer kind and chunk length, the
ttnn calls and the host time of a call with cached programs (fastest of 3), then a 64-layer
estimate (16 attention + 48 DeltaNet layers). Device time is not modelled (mock mode).

    source /tmp/ttmock/env.sh; cd "$(mktemp -d)" && $TT_MOCK_PY .../bench_layers_mock.py [T ...]
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import clef_tt_ttnn as ct  # noqa: E402
from clef_tt_ttnn import Meta  # noqa: E402
from clef_tt_ttnn.meta import (ACTIVATION, MATRIX, VECTOR, REPLICATED, SHARDED,  # noqa: E402
                               PARTIAL, F32, BF16, BFP8_B, TILE, ROW_MAJOR, HIFI2,
                               stored_bytes)

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, ROT = 5120, 12, 2, 256, 64
NK, NV, DK, DV, KERNEL = 8, 24, 128, 128, 4
FFN = 8704
EPS = 1e-6
CFG = dict(fidelity=HIFI2, fp32_dest_acc=1, bf16_activations=1, packer_l1_acc=0)


class Bench:
    def __init__(self):
        self.b = ct.Backend()
        self.m = self.b.open(dict(cols=2, parent_cols=0, submesh_offset=0, num_command_queues=2,
                                  l1_small_size=24576, trace_region_size=0,
                                  activation_dtype=BF16))
        self.n = self.m.n

    def matrix(self, rows, cols, dtype):
        meta = Meta(rows, cols, self.n, dtype, TILE, MATRIX, SHARDED)
        data = bytes(stored_bytes(meta))
        return meta, self.m.upload(meta, [data] * self.n)

    def vec(self, k, value=0.0):
        meta = Meta(k, 1, self.n, F32, ROW_MAJOR, VECTOR, REPLICATED)
        return meta, self.m.upload(meta, [np.full(k, value, np.float32).tobytes()])

    def act(self, rows, cols, placement=REPLICATED):
        meta = Meta(rows, cols, self.n, F32, TILE, ACTIVATION, placement)
        return meta, self.m.upload(meta, [np.zeros((rows, cols), np.float32).tobytes()])

    def res(self, obj, rows, cols, placement):
        return Meta(rows, cols, self.n, F32, TILE, ACTIVATION, placement), obj

    def weights(self):
        w = {}
        w["norm"] = self.vec(HIDDEN)
        w["qkv"] = self.matrix(HIDDEN, 2 * HEADS * HEAD_DIM + 2 * KV_HEADS * HEAD_DIM, BFP8_B)
        w["o"] = self.matrix(HEADS * HEAD_DIM, HIDDEN, BFP8_B)
        w["qn"], w["kn"] = self.vec(HEAD_DIM), self.vec(HEAD_DIM)
        w["in"] = self.matrix(HIDDEN, 2 * NK * DK + 2 * NV * DV + 2 * NV, BFP8_B)
        w["conv"] = self.vec((2 * NK * DK + NV * DV) * KERNEL)
        w["alog"], w["dt"] = self.vec(NV), self.vec(NV)
        w["gnorm"] = self.vec(DV)
        w["out"] = self.matrix(NV * DV, HIDDEN, BFP8_B)
        w["gu"] = self.matrix(HIDDEN, 2 * FFN, BFP8_B)
        w["down"] = self.matrix(FFN, HIDDEN, BF16)
        return w

    def mlp(self, w, h, t):
        m = self.m
        x = self.res(m.rms_norm(h, w["norm"], HIDDEN, EPS, 1), t, HIDDEN, REPLICATED)
        gu = self.res(m.linear(x, w["gu"], CFG), t, 2 * FFN, SHARDED)
        act = self.res(m.swiglu(gu), t, FFN, SHARDED)
        down = self.res(m.linear(act, w["down"], CFG), t, HIDDEN, PARTIAL)
        down = self.res(m.all_reduce(down), t, HIDDEN, REPLICATED)
        return self.res(m.add(h, down), t, HIDDEN, REPLICATED)

    def attention(self, w, h, t, cache, positions):
        m = self.m
        x = self.res(m.rms_norm(h, w["norm"], HIDDEN, EPS, 1), t, HIDDEN, REPLICATED)
        fused = self.res(m.linear(x, w["qkv"], CFG), t, w["qkv"][0].cols, SHARDED)
        qg, k, v = [self.res(p, t, c, SHARDED) for p, c in zip(
            m.split_cols(fused, [2 * HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM]),
            (2 * HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM))]
        q, gate = [self.res(p, t, HEADS * HEAD_DIM, SHARDED)
                   for p in m.split_query_gate(qg, HEADS, HEAD_DIM)]
        q = self.res(m.rms_norm(q, w["qn"], HEAD_DIM, EPS, 1), t, HEADS * HEAD_DIM, SHARDED)
        k = self.res(m.rms_norm(k, w["kn"], HEAD_DIM, EPS, 1), t, KV_HEADS * HEAD_DIM, SHARDED)
        q = self.res(m.rope(q, positions, HEADS, HEAD_DIM), t, HEADS * HEAD_DIM, SHARDED)
        k = self.res(m.rope(k, positions, KV_HEADS, HEAD_DIM), t, KV_HEADS * HEAD_DIM, SHARDED)
        start = 0 if cache is None else cache[0][0].rows
        keys = self.res(m.append_rows(None if cache is None else cache[0], k, KV_HEADS),
                        start + t, KV_HEADS * HEAD_DIM, SHARDED)
        vals = self.res(m.append_rows(None if cache is None else cache[1], v, KV_HEADS),
                        start + t, KV_HEADS * HEAD_DIM, SHARDED)
        o = self.res(m.causal_attention(q, keys, vals, HEADS, KV_HEADS, HEAD_DIM), t,
                     HEADS * HEAD_DIM, SHARDED)
        g = self.res(m.mul_sigmoid(o, gate), t, HEADS * HEAD_DIM, SHARDED)
        out = self.res(m.linear(g, w["o"], CFG), t, HIDDEN, PARTIAL)
        out = self.res(m.all_reduce(out), t, HIDDEN, REPLICATED)
        return self.res(m.add(h, out), t, HIDDEN, REPLICATED), (keys, vals)

    def delta(self, w, h, t, state):
        m = self.m
        kd, vd = NK * DK, NV * DV
        x = self.res(m.rms_norm(h, w["norm"], HIDDEN, EPS, 1), t, HIDDEN, REPLICATED)
        fused = self.res(m.linear(x, w["in"], CFG), t, w["in"][0].cols, SHARDED)
        widths = [2 * kd + vd, vd, NV, NV]
        qkv, z, b, a = [self.res(p, t, c, SHARDED) for p, c in zip(m.split_cols(fused, widths),
                                                                   widths)]
        conv, carry = m.causal_conv1d_silu(qkv, w["conv"], None if state is None else state[0],
                                           KERNEL)
        conv, carry = self.res(conv, t, 2 * kd + vd, SHARDED), self.res(carry, KERNEL - 1,
                                                                       2 * kd + vd, SHARDED)
        g, beta = [self.res(p, t, NV, SHARDED) for p in m.delta_gates(a, b, w["alog"], w["dt"])]
        spec = dict(key_heads=NK, value_heads=NV, key_dim=DK, value_dim=DV)
        core, s = m.gated_delta_rule(conv, g, beta, None if state is None else state[1], spec)
        core, s = self.res(core, t, vd, SHARDED), self.res(s, NV * DK, DV, SHARDED)
        normed = self.res(m.gated_rms_norm(core, z, w["gnorm"], DV, EPS), t, vd, SHARDED)
        out = self.res(m.linear(normed, w["out"], CFG), t, HIDDEN, PARTIAL)
        out = self.res(m.all_reduce(out), t, HIDDEN, REPLICATED)
        return self.res(m.add(h, out), t, HIDDEN, REPLICATED), (carry, s)

    def timed(self, fn, repeats=3):
        """The fastest of `repeats` calls after one that builds and caches the programs (the
        CPU is shared: the minimum is the least disturbed)."""
        fn()
        best = None
        for _ in range(repeats):
            self.m.reset_op_stats()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if best is None or dt < best[0]:
                stats = self.m.op_stats()
                best = (dt, sum(c for c, _ in stats.values()), stats)
        return best

    def run(self, lengths):
        w = self.weights()
        print("layer kind            T  ttnn calls  host ms (cached programs)")
        totals = {}
        for t in lengths:
            h = self.act(t, HIDDEN)
            ang = np.zeros((t, ROT // 2), np.float32)
            positions = (t, ROT // 2, np.cos(ang).tobytes(), np.sin(ang).tobytes())
            prev_kv = {}

            def attn_second_chunk():
                # A second chunk: appends to and attends over a first chunk's cache.
                if "kv" not in prev_kv:
                    prev_kv["kv"] = self.attention(w, h, t, None, positions)[1]
                return self.attention(w, h, t, prev_kv["kv"], positions)
            rows = {}
            rows["attention"] = self.timed(lambda: self.attention(w, h, t, None, positions))
            rows["attention+cache"] = self.timed(attn_second_chunk)
            rows["deltanet"] = self.timed(lambda: self.delta(w, h, t, None))
            rows["mlp"] = self.timed(lambda: self.mlp(w, h, t))
            for name, (dt, calls, _) in rows.items():
                print("%-18s %5d  %10d  %8.2f" % (name, t, calls, dt * 1e3))
            est = 16 * (rows["attention"][0] + rows["mlp"][0]) + 48 * (rows["deltanet"][0]
                                                                       + rows["mlp"][0])
            calls = 16 * (rows["attention"][1] + rows["mlp"][1]) + 48 * (rows["deltanet"][1]
                                                                         + rows["mlp"][1])
            totals[t] = (est, calls)
            print("64 layers at T=%d: ~%d ttnn calls, ~%.0f ms host" % (t, calls, est * 1e3))
            for kind in ("attention", "attention+cache", "deltanet"):
                top = sorted(rows[kind][2].items(), key=lambda kv: -kv[1][1])[:6]
                print("  %s's costliest ttnn calls: %s" % (kind, ", ".join(
                    "%s %dx %.2f ms" % (k, c, s * 1e3) for k, (c, s) in top)))
        self.m.close()
        return totals


if __name__ == "__main__":
    lengths = [int(a) for a in sys.argv[1:]] or [128, 1024]
    Bench().run(lengths)
