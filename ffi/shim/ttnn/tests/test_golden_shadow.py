"""The golden-shadow mode (clef_tt_ttnn/golden/, CLEF_TT_GOLDEN=1) op by op, on the mock P150x2:
each ABI op's downloaded values (what ttnn's golden functions, and the own shadows of the ops that
have none, computed) against a numpy reference of the op as the ABI defines it. It covers the own
shadows the tiny fixture's goldens never reach (`experimental.rotary_embedding_hf`: the fixture's
rotary widths take the sliced path) and every other own shadow (paged_fill_cache through the KV
cache, nlp_concat_heads, the uploads), the rank-3 and rank-4 delta rule, and the collectives.
tests/tt_golden.rs scores the whole model.

Run (needs torch in the kit's venv; from a scratch folder, ttnn writes `generated/` there):
    source /tmp/ttmock/env.sh
    cd "$(mktemp -d)" && $CLEF_TT_PYTHON /path/to/ffi/shim/ttnn/tests/test_golden_shadow.py
"""

import os
import sys

import numpy as np

os.environ["CLEF_TT_GOLDEN"] = "1"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import clef_tt_ttnn as ct  # noqa: E402
from clef_tt_ttnn import Meta  # noqa: E402
from clef_tt_ttnn.meta import (
    ACTIVATION,
    BF16,
    BFP8_B,
    F32,
    GELU_ERF,
    GELU_TANH,
    HIFI2,
    MATRIX,
    PARTIAL,  # noqa
    REPLICATED,
    ROW_MAJOR,
    SHARDED,
    TILE,
    VECTOR,
)
from clef_tt_ttnn.transfers import host_bytes  # noqa: E402

RNG = np.random.default_rng(3)
RESULTS = []


def close(name, got, want, tol):
    """Max |got - want| relative to max |want|, within tol."""
    err = float(np.max(np.abs(got - want)) / max(1e-6, float(np.max(np.abs(want)))))
    RESULTS.append((name, err, tol))
    print("%-58s rel err %.2e (tol %.0e) %s" % (name, err, tol, "ok" if err <= tol else "FAIL"))


def bf16(a):
    """f32 values rounded to bf16 (nearest even), as f32."""
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).view(np.float32)


def silu(x):
    return x / (1 + np.exp(-x))


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


class Suite:
    def __init__(self):
        self.backend = ct.Backend()
        self.ttnn = self.backend.ttnn
        self.m = self.backend.open(
            dict(
                cols=2,
                parent_cols=0,
                submesh_offset=0,
                num_command_queues=2,
                l1_small_size=24576,
                trace_region_size=0,
                activation_dtype=F32,
            )
        )
        assert self.m.tt.shadow is not None, "CLEF_TT_GOLDEN=1 installs the shadow"

    # -- tensors ----------------------------------------------------------------------------------
    def act(self, a, placement=REPLICATED, dtype=F32):
        """An activation from host arrays (one, or one per device)."""
        arrays = a if isinstance(a, list) else [a]
        rows, cols = arrays[0].shape
        meta = Meta(rows, cols, self.m.n, dtype, TILE, ACTIVATION, placement)
        return meta, self.m.upload(meta, [x.astype(np.float32).tobytes() for x in arrays])

    def vec(self, a):
        a = a.reshape(a.shape[0], -1)
        meta = Meta(a.shape[0], a.shape[1], self.m.n, F32, ROW_MAJOR, VECTOR, REPLICATED)
        return meta, self.m.upload(meta, [a.astype(np.float32).tobytes()])

    def res(self, obj, rows, cols, placement=REPLICATED):
        return Meta(rows, cols, self.m.n, F32, TILE, ACTIVATION, placement), obj

    def down(self, pair, device=0):
        meta, obj = pair
        return np.frombuffer(self.m.download(meta, obj, device), np.float32).reshape(
            meta.rows, meta.cols
        )

    # -- checks -----------------------------------------------------------------------------------
    def uploads_and_linear(self):
        ttnn, m = self.ttnn, self.m
        w = [RNG.standard_normal((96, 80)).astype(np.float32) for _ in range(2)]
        host = [
            ttnn.Tensor(x.reshape(1, 1, 96, 80), data_type=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT)
            for x in w
        ]
        parts = [host_bytes(h) for h in host]
        decoded = [ttnn.to_torch(h).float().numpy().reshape(96, 80) for h in host]
        meta = Meta(96, 80, 2, BFP8_B, TILE, MATRIX, SHARDED)
        wt = m.upload(meta, parts)
        for d in range(2):
            assert m.read_stored(meta, wt, d) == parts[d], "read_stored keeps the tile bytes"
            close(
                "upload bfp8 matrix: download = decoded tiles (dev %d)" % d,
                np.frombuffer(m.download(meta, wt, d), np.float32).reshape(96, 80),
                decoded[d],
                0,
            )
        x = RNG.standard_normal((37, 96)).astype(np.float32)
        cfg = dict(fidelity=HIFI2, fp32_dest_acc=1, bf16_activations=0, packer_l1_acc=1)
        y = self.res(m.linear(self.act(x), (meta, wt), cfg), 37, 80, SHARDED)
        for d in range(2):
            close("linear column-parallel (dev %d)" % d, self.down(y, d), x @ decoded[d], 1e-5)
        # Row-parallel partial sums, then the all-reduce (reduce_scatter + all_gather goldens).
        xs = [RNG.standard_normal((40, 48)).astype(np.float32) for _ in range(2)]
        ws = [RNG.standard_normal((48, 64)).astype(np.float32) for _ in range(2)]
        wmeta = Meta(48, 64, 2, F32, TILE, MATRIX, SHARDED)
        wpart = [
            host_bytes(
                ttnn.Tensor(
                    a.reshape(1, 1, 48, 64), data_type=ttnn.float32, layout=ttnn.TILE_LAYOUT
                )
            )
            for a in ws
        ]
        wr = m.upload(wmeta, wpart)
        p = self.res(m.linear(self.act(xs, SHARDED), (wmeta, wr), cfg), 40, 64, PARTIAL)
        r = self.res(m.all_reduce(p), 40, 64)
        want = xs[0] @ ws[0] + xs[1] @ ws[1]
        for d in range(2):
            close("linear row-parallel + all_reduce (dev %d)" % d, self.down(r, d), want, 1e-5)

    def copies(self):
        """copy (ttnn.clone), split_cols (slices, a whole split cloned), fold_rows (reshape)."""
        m = self.m
        x = RNG.standard_normal((37, 96)).astype(np.float32)
        xa = self.act(x)
        close("copy (clone)", self.down(self.res(m.copy(*xa), 37, 96)), x, 0)
        parts = m.split_cols(xa, [96])
        close("split_cols whole (clone)", self.down(self.res(parts[0], 37, 96)), x, 0)
        a, b = m.split_cols(xa, [40, 56])
        close("split_cols", self.down(self.res(b, 37, 56)), x[:, 40:], 0)
        f = m.fold_rows(self.act(x[:36]), 4)
        close("fold_rows", self.down(self.res(f, 9, 384)), x[:36].reshape(9, 384), 0)

    def norms(self):
        m = self.m
        x = RNG.standard_normal((37, 96)).astype(np.float32) * 3
        for group in (96, 24):
            w = RNG.standard_normal(group).astype(np.float32) * 0.1
            xg = x.reshape(37, -1, group)
            base = xg / np.sqrt((xg**2).mean(-1, keepdims=True) + 1e-6)
            for one_plus in (1, 0):
                y = m.rms_norm(self.act(x), self.vec(w), group, 1e-6, one_plus)
                want = (base * ((1 + w) if one_plus else w)).reshape(37, 96)
                close(
                    "rms_norm group %d %s" % (group, "1+w" if one_plus else "w"),
                    self.down(self.res(y, 37, 96)),
                    want,
                    1e-5,
                )
        z = RNG.standard_normal((37, 96)).astype(np.float32)
        w = RNG.standard_normal(32).astype(np.float32)
        y = m.gated_rms_norm(self.act(x), self.act(z), self.vec(w), 32, 1e-6)
        xg = x.reshape(37, 3, 32)
        want = (xg / np.sqrt((xg**2).mean(-1, keepdims=True) + 1e-6) * w).reshape(37, 96)
        close(
            "gated_rms_norm (raw w) * silu(z)", self.down(self.res(y, 37, 96)), want * silu(z), 1e-5
        )
        b = RNG.standard_normal(96).astype(np.float32)
        y = m.layer_norm(self.act(x), self.vec(w.repeat(3)), self.vec(b), 1e-6)
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        close(
            "layer_norm",
            self.down(self.res(y, 37, 96)),
            (x - mu) / np.sqrt(var + 1e-6) * w.repeat(3) + b,
            1e-5,
        )
        from math import erf

        verf = np.vectorize(erf)
        for kind, want in (
            (GELU_ERF, 0.5 * x * (1 + verf(x / np.sqrt(2)))),
            (GELU_TANH, 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))),
        ):
            close(
                "gelu %s" % ("erf" if kind == GELU_ERF else "tanh"),
                self.down(self.res(m.gelu(self.act(x), kind), 37, 96)),
                want,
                1e-5,
            )

    def rope(self):
        """rope: the leading 2*half channels of each head rotated HF-style (rotate-half) with
        tables [T, half]; widths 32 and 64 go through experimental.rotary_embedding_hf (own
        shadow) and nlp_concat_heads (own shadow), others through slices."""
        m = self.m
        for rows, heads, hd, half in ((37, 2, 24, 8), (100, 2, 64, 16), (37, 3, 96, 32)):
            x = RNG.standard_normal((rows, heads * hd)).astype(np.float32)
            ang = RNG.standard_normal((rows, half)).astype(np.float32)
            c, s = np.cos(ang), np.sin(ang)
            tables = (rows, half, c.tobytes(), s.tobytes())
            y = m.rope(self.act(x), tables, heads, hd)
            xh = x.reshape(rows, heads, hd)
            x1, x2 = xh[..., :half], xh[..., half : 2 * half]
            c3, s3 = c[:, None, :], s[:, None, :]
            want = np.concatenate([x1 * c3 - x2 * s3, x2 * c3 + x1 * s3, xh[..., 2 * half :]], -1)
            path = "rotary_embedding_hf" if 2 * half in (32, 64, 128) else "slices"
            close(
                "rope %d heads x %d, rotary %d (%s)" % (heads, hd, 2 * half, path),
                self.down(self.res(y, rows, heads * hd)),
                want.reshape(rows, -1),
                1e-5,
            )
        # The vision tower's full-width rotary: cos/sin [rows, head_dim] activations.
        for heads, hd in ((2, 40), (2, 64), (3, 32)):
            x = RNG.standard_normal((50, heads * hd)).astype(np.float32)
            ang = RNG.standard_normal((50, hd)).astype(np.float32)
            y = m.rotary(self.act(x), self.act(np.cos(ang)), self.act(np.sin(ang)), heads, hd)
            xh = x.reshape(50, heads, hd)
            rot = np.concatenate([-xh[..., hd // 2 :], xh[..., : hd // 2]], -1)
            want = xh * np.cos(ang)[:, None] + rot * np.sin(ang)[:, None]
            path = "rotary_embedding_hf" if hd == 32 or hd % 64 == 0 else "slices"
            close(
                "rotary %d heads x %d (%s)" % (heads, hd, path),
                self.down(self.res(y, 50, heads * hd)),
                want.reshape(50, -1),
                1e-5,
            )

    def attention(self):
        """append_rows (paged_fill_cache, own shadow: in place and copy-on-write blocks), the KV rows
        read back, and chunked SDPA's golden against causal GQA attention."""
        m = self.m
        for t1, t2, heads, kvh, d in ((37, 37, 2, 1, 24), (100, 64, 4, 2, 64)):
            k1, v1, k2, v2 = [
                RNG.standard_normal((t, kvh * d)).astype(np.float32) for t in (t1, t1, t2, t2)
            ]
            keys = self.res(m.append_rows(None, self.act(k1), kvh), t1, kvh * d)
            vals = self.res(m.append_rows(None, self.act(v1), kvh), t1, kvh * d)
            keys2 = self.res(m.append_rows(keys, self.act(k2), kvh), t1 + t2, kvh * d)
            vals2 = self.res(m.append_rows(vals, self.act(v2), kvh), t1 + t2, kvh * d)
            k3 = RNG.standard_normal((5, kvh * d)).astype(np.float32)
            keys3 = self.res(m.append_rows(keys, self.act(k3), kvh), t1 + 5, kvh * d)
            close(
                "KV rows after an in-place append (t %d+%d)" % (t1, t2),
                self.down(keys2),
                bf16(np.concatenate([k1, k2])),
                0,
            )
            close("KV rows of the old handle after appends", self.down(keys), bf16(k1), 0)
            close(
                "KV rows appended to a non-tail handle (its own block)",
                self.down(keys3),
                bf16(np.concatenate([k1, k3])),
                0,
            )
            close(
                "KV rows of the tail after a sibling's append",
                self.down(keys2),
                bf16(np.concatenate([k1, k2])),
                0,
            )
            q = RNG.standard_normal((t2, heads * d)).astype(np.float32)
            o = m.causal_attention(self.act(q), keys2, vals2, heads, kvh, d)
            kk = bf16(np.concatenate([k1, k2])).reshape(-1, kvh, d)
            vv = bf16(np.concatenate([v1, v2])).reshape(-1, kvh, d)
            qh = bf16(q).reshape(t2, heads, d)
            want = np.zeros((t2, heads, d), np.float32)
            for h in range(heads):
                g = h // (heads // kvh)
                sc = qh[:, h] @ kk[:, g].T * d**-0.5
                pos = t1 + np.arange(t2)[:, None]
                sc = np.where(np.arange(t1 + t2)[None] <= pos, sc, -np.inf)
                p = np.exp(sc - sc.max(-1, keepdims=True))
                want[:, h] = (p / p.sum(-1, keepdims=True)) @ vv[:, g]
            close(
                "causal_attention GQA %d/%d at start %d" % (heads, kvh, t1),
                self.down(self.res(o, t2, heads * d)),
                want.reshape(t2, -1),
                2e-2,
            )
        q, k, v = [RNG.standard_normal((100, 80)).astype(np.float32) for _ in range(3)]
        o = m.segment_attention(self.act(q), self.act(k), self.act(v), 2, 40, [(0, 37), (37, 100)])
        want = np.zeros((100, 2, 40), np.float32)
        for s0, s1 in ((0, 37), (37, 100)):
            for h in range(2):
                qs, ks, vs = [bf16(a).reshape(100, 2, 40)[s0:s1, h] for a in (q, k, v)]
                sc = qs @ ks.T * 40**-0.5
                p = np.exp(sc - sc.max(-1, keepdims=True))
                want[s0:s1, h] = (p / p.sum(-1, keepdims=True)) @ vs
        close(
            "segment_attention (cu_window_seqlens)",
            self.down(self.res(o, 100, 80)),
            want.reshape(100, -1),
            2e-2,
        )

    def delta(self):
        m = self.m
        # The conv: the carry (kernel-1 rows) in front, taps [channels, kernel], SiLU.
        x1 = RNG.standard_normal((37, 96)).astype(np.float32)
        x2 = RNG.standard_normal((2, 96)).astype(np.float32)
        w = RNG.standard_normal((96, 4)).astype(np.float32)
        out, carry = m.causal_conv1d_silu(self.act(x1), self.vec(w), None, 4)
        out2, carry2 = m.causal_conv1d_silu(self.act(x2), self.vec(w), self.res(carry, 3, 96), 4)
        ext = np.concatenate([np.zeros((3, 96), np.float32), x1, x2])
        full = silu(np.stack([(ext[t : t + 4] * w.T).sum(0) for t in range(39)]))
        close("causal_conv1d_silu", self.down(self.res(out, 37, 96)), full[:37], 1e-5)
        close(
            "causal_conv1d_silu with the carry", self.down(self.res(out2, 2, 96)), full[37:], 1e-5
        )
        close("conv carry", self.down(self.res(carry2, 3, 96)), ext[-3:], 0)
        for t, nk, nv, dk, dv in ((70, 1, 3, 16, 12), (40, 2, 4, 32, 32), (300, 1, 2, 32, 48)):
            a, b = [RNG.standard_normal((t, nv)).astype(np.float32) for _ in range(2)]
            a_log = np.log(RNG.uniform(0.5, 8, nv)).astype(np.float32)
            dt_bias = RNG.standard_normal(nv).astype(np.float32)
            g, beta = m.delta_gates(self.act(a), self.act(b), self.vec(a_log), self.vec(dt_bias))
            g_want = -np.exp(a_log) * softplus(a + dt_bias)
            beta_want = 1 / (1 + np.exp(-b))
            close("delta_gates g", self.down(self.res(g, t, nv)), g_want, 1e-5)
            close("delta_gates beta", self.down(self.res(beta, t, nv)), beta_want, 1e-5)
            qkv = RNG.standard_normal((t, 2 * nk * dk + nv * dv)).astype(np.float32)
            s0 = RNG.standard_normal((nv * dk, dv)).astype(np.float32) * 0.1
            spec = dict(key_heads=nk, value_heads=nv, key_dim=dk, value_dim=dv)
            o, s = m.gated_delta_rule(
                self.act(qkv), self.res(g, t, nv), self.res(beta, t, nv), self.act(s0), spec
            )
            # The recurrence: value head hv reads key head hv // (nv / nk); q, k L2-normalised
            # (eps 1e-6), q scaled by dk^-0.5; S <- exp(g) S; S += k (beta (v - S^T k))^T;
            # o = S^T q. State rows hv*dk + i.
            q_ = qkv[:, : nk * dk].reshape(t, nk, dk)
            k_ = qkv[:, nk * dk : 2 * nk * dk].reshape(t, nk, dk)
            v_ = qkv[:, 2 * nk * dk :].reshape(t, nv, dv)
            l2 = lambda z: z / np.sqrt((z * z).sum(-1, keepdims=True) + 1e-6)  # noqa: E731
            q_, k_ = l2(q_) * dk**-0.5, l2(k_)
            S = s0.reshape(nv, dk, dv).astype(np.float64)
            o_want = np.zeros((t, nv, dv))
            for hv in range(nv):
                hk = hv // (nv // nk)
                for i in range(t):
                    S[hv] *= np.exp(g_want[i, hv])
                    u = beta_want[i, hv] * (v_[i, hv] - S[hv].T @ k_[i, hk])
                    S[hv] += np.outer(k_[i, hk], u)
                    o_want[i, hv] = S[hv].T @ q_[i, hk]
            flat = -(-dk // 32) == -(-dv // 32)
            name = "gated_delta_rule T %d, %d/%d heads, %dx%d (%s)" % (
                t,
                nk,
                nv,
                dk,
                dv,
                "rank-3 flat" if flat else "rank-4",
            )
            for d in range(2):
                close(
                    name + " out dev %d" % d,
                    self.down(self.res(o, t, nv * dv, SHARDED), d),
                    o_want.reshape(t, -1),
                    1e-3,
                )
            close(
                name + " state", self.down(self.res(s, nv * dk, dv)), S.reshape(nv * dk, dv), 1e-3
            )

    def native_conv(self):
        """causal_conv1d_silu on a bf16 mesh: ttnn's native conv (the op's own shadow) for 3 rows
        or more, chained through its ROW_MAJOR carry, into and out of the FIR (2 rows) and from
        an uploaded carry, against the f32 reference of bf16 inputs."""
        self.m = self.backend.open(
            dict(
                cols=2,
                parent_cols=0,
                submesh_offset=0,
                num_command_queues=2,
                l1_small_size=24576,
                trace_region_size=0,
                activation_dtype=BF16,
            )
        )
        m, ch = self.m, 128
        lens = (37, 40, 2, 33, 64)
        xs = [bf16(RNG.standard_normal((t, ch)).astype(np.float32)) for t in lens]
        w = bf16(RNG.standard_normal((ch, 4)).astype(np.float32))
        ext = np.concatenate([np.zeros((3, ch), np.float32)] + xs)
        full = silu(np.stack([(ext[t : t + 4] * w.T).sum(0) for t in range(ext.shape[0] - 3)]))
        carry, r0 = None, 0
        for i, x in enumerate(xs):
            path = "native" if m.native_conv(x.shape[0], ch, 4) else "FIR"
            if i == len(xs) - 1:
                # A carry uploaded as the prefix cache restores one (TILE, activation dtype).
                carry = self.act(ext[3 + r0 - 3 : 3 + r0], dtype=BF16)[1]
            out, carry = m.causal_conv1d_silu(
                self.act(x, dtype=BF16),
                self.vec(w),
                None if carry is None else self.res(carry, 3, ch),
                4,
            )
            t = x.shape[0]
            close(
                "causal_conv1d_silu bf16, %d rows (%s)" % (t, path),
                self.down(self.res(out, t, ch)),
                full[r0 : r0 + t],
                1e-2,
            )
            r0 += t
            close(
                "conv carry after %d rows (%s)" % (t, path),
                self.down(self.res(carry, 3, ch)),
                ext[3 + r0 - 3 : 3 + r0],
                0,
            )
        assert m.native_conv(37, ch, 4) and not m.native_conv(2, ch, 4)
        assert not m.native_conv(37, 80, 4) and not m.native_conv(37, ch, 3)

    def run(self):
        self.uploads_and_linear()
        self.copies()
        self.norms()
        self.rope()
        self.attention()
        self.delta()
        shadow = self.m.tt.shadow
        print(shadow.report())
        self.m.close()
        self.native_conv()
        print(self.m.tt.shadow.report())
        self.m.close()
        bad = [r for r in RESULTS if not r[1] <= r[2]]
        print("%d passed, %d failed" % (len(RESULTS) - len(bad), len(bad)))
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(Suite().run())
