"""clef_tt_ttnn on the real ttnn 0.81.1 runtime in tt-metal's mock mode (no chips).

Run (plain Python, nothing else needed; ttnn writes `generated/` into the working directory, so
run it from a scratch folder):
    source /tmp/ttmock/env.sh            # ffi/ttnn-mock/setup.sh writes it
    cd "$(mktemp -d)" && $TT_MOCK_PY /path/to/ffi/shim/ttnn/tests/test_ops_mock.py
Without arguments it runs itself three times, in separate processes (the mock cluster is chosen
once per process): 1x1 on a mock P150 and 1x2 on a mock P150x2 (FABRIC_1D, l1_small_size 24576,
two command queues) with bf16 activations, and 1x1 with f32 activations; the 1x2 run also opens
a 1x1 submesh of a 1x2 parent. `--cols N [--act f32]` runs one mesh in this process (the cluster
descriptor comes from TT_METAL_MOCK_CLUSTER_DESC_PATH); `--descriptors DIR` names the folder of
the descriptors (default: $CLEF_TT_MOCK_DESCRIPTORS, else the project's ffi/ttnn-mock).

What it checks: uploads of every role and dtype (f32, bf16, bfp8_b, bfp4_b matrices, sharded
and replicated) keep the host's bytes exactly; every op at odd shapes (37 and 100 rows, widths
that are not multiples of 32) passes ttnn's validation and dispatch (TT_MOCK_GXX=stub) and gives
the per-device shapes, dtypes and placements the core expects; the KV cache's in-place / copy
rule; memory per device back to zero after freeing, and the allocator back to where it was; a
shape ttnn refuses raises ttnn's TT_FATAL text. Device data are not backed in mock mode (reads
give zeros), so values are not checked here. Prints the host time of each ABI op (cached
programs) and its ttnn calls.
"""

import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import clef_tt_ttnn as ct  # noqa: E402
from clef_tt_ttnn import Meta  # noqa: E402
from clef_tt_ttnn.kv_cache import KV, SparePools  # noqa: E402
from clef_tt_ttnn.meta import (
    ACTIVATION,
    BF16,
    BFP4_B,
    BFP8_B,
    EXACT,
    F32,
    GELU_ERF,
    GELU_TANH,
    HIFI2,
    LOFI,
    MATRIX,
    PARTIAL,
    REPLICATED,
    ROW_MAJOR,
    SHARDED,  # noqa: E402
    TILE,
    VECTOR,
    stored_bytes,
)
from clef_tt_ttnn.transfers import host_bytes, host_matrix, tt_dtype  # noqa: E402

RNG = np.random.default_rng(7)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


class Suite:
    def __init__(self, cols, act=BF16):
        self.version_check()
        self.backend = ct.Backend()
        self.ttnn = self.backend.ttnn
        self.cols = cols
        self.act_dtype = act
        self.timings = {}
        self.per_call = {}

    @staticmethod
    def version_check():
        """Backend() refuses another ttnn version, naming it and the pip command."""
        import ttnn

        had = hasattr(ttnn, "__version__")
        old = getattr(ttnn, "__version__", None)
        ttnn.__version__ = "0.80.0"
        try:
            ct.Backend()
        except RuntimeError as e:
            check("0.80.0" in str(e) and "pip install ttnn==0.81.1" in str(e), str(e))
        else:
            raise AssertionError("ttnn 0.80.0 was accepted")
        finally:
            if had:
                ttnn.__version__ = old
            else:
                del ttnn.__version__

    # -- helpers ----------------------------------------------------------------------------------
    def act(self, rows, cols, placement=REPLICATED):
        n = self.mesh.n
        meta = Meta(rows, cols, n, F32, TILE, ACTIVATION, placement)
        k = 1 if placement == REPLICATED else n
        parts = [RNG.standard_normal((rows, cols)).astype(np.float32).tobytes() for _ in range(k)]
        return meta, self.mesh.upload(meta, parts)

    def vec(self, rows, cols, placement=REPLICATED, values=None):
        n = self.mesh.n
        meta = Meta(rows, cols, n, F32, ROW_MAJOR, VECTOR, placement)
        k = 1 if placement == REPLICATED else n
        parts = [
            (values if values is not None else RNG.standard_normal((rows, cols)))
            .astype(np.float32)
            .tobytes()
            for _ in range(k)
        ]
        return meta, self.mesh.upload(meta, parts)

    def packed(self, rows, cols, dtype):
        """Tile bytes as ttnn's own host conversion writes them (what clef's packer matches)."""
        t = self.ttnn.Tensor(
            RNG.standard_normal((1, 1, rows, cols)).astype(np.float32),
            data_type=tt_dtype(self.ttnn, dtype),
            layout=self.ttnn.TILE_LAYOUT,
        )
        return host_bytes(t)

    def matrix(self, rows, cols, dtype, placement=SHARDED):
        n = self.mesh.n
        meta = Meta(rows, cols, n, dtype, TILE, MATRIX, placement)
        k = 1 if placement == REPLICATED else n
        parts = [self.packed(rows, cols, dtype) for _ in range(k)]
        return meta, self.mesh.upload(meta, parts), parts

    def expect(self, pair, rows, cols, placement, dtype=None, what="", layout=None):
        """Check a result against the Meta the core computed: per-device shape, dtype."""
        meta, obj = pair
        check(
            meta.rows == rows and meta.cols == cols and meta.placement == placement,
            "%s: meta %s" % (what, meta),
        )
        self.mesh.check(meta, obj)  # what the bridge's Storage::bind runs
        if isinstance(obj, KV):
            check(obj.rows == rows and obj.pool.heads * obj.pool.d == cols, "%s: KV rows" % what)
            return
        shape = tuple(int(d) for d in obj.t.shape)
        check(
            shape == (1, 1, rows, cols),
            "%s: device shape %s, expected [1, 1, %d, %d]" % (what, shape, rows, cols),
        )
        want = dtype if dtype is not None else self.mesh.act_dtype
        check(obj.t.dtype == want, "%s: dtype %s, expected %s" % (what, obj.t.dtype, want))
        want_layout = layout if layout is not None else self.ttnn.TILE_LAYOUT
        check(obj.t.layout == want_layout, "%s: layout %s" % (what, obj.t.layout))

    def res(self, obj, rows, cols, placement):
        return Meta(rows, cols, self.mesh.n, F32, TILE, ACTIVATION, placement), obj

    def op(self, name, fn, *args):
        """Run an ABI op twice (the second time with cached programs) and time the second."""
        fn(*args)
        self.mesh.reset_op_stats()
        t0 = time.perf_counter()
        out = fn(*args)
        dt = time.perf_counter() - t0
        stats = self.mesh.op_stats()
        calls = sum(c for c, _ in stats.values())
        frees = stats.get("deallocate", (0, 0.0))[0]
        self.timings.setdefault(name, []).append((dt, calls, frees))
        for k, (c, sec) in stats.items():
            c0, s0 = self.per_call.get(k, (0, 0.0))
            self.per_call[k] = (c0 + c, s0 + sec)
        return out

    # -- the suite --------------------------------------------------------------------------------
    def run(self):
        b = self.backend
        check(b.hardware() == "mock", "hardware() %s" % b.hardware())
        check(b.visible_devices() >= self.cols, "visible devices %d" % b.visible_devices())
        config = dict(
            cols=self.cols,
            parent_cols=0,
            submesh_offset=0,
            num_command_queues=2,
            l1_small_size=24576,
            trace_region_size=0,
            activation_dtype=self.act_dtype,
        )
        self.mesh = b.open(config)
        m = self.mesh
        print("allocator at open:", m.allocator_bytes())
        info = b.describe()
        print("describe:", info, m.describe())
        check(
            info
            == {
                "backend": "ttnn",
                "hardware": "mock",
                "runtime": "ttnn 0.81.1",
                "devices": b.visible_devices(),
            },
            "describe %s" % info,
        )
        check(m.describe()["compute_grid"] == [11, 10], "mesh describe")
        check(m.device_ids() == list(range(self.cols)), "device ids %s" % m.device_ids())
        check(m.memory() == [0] * m.n, "memory at open %s" % m.memory())
        self.uploads()
        # Round 1 warms up (programs, constants, spare KV pools); rounds 2 and 3 must leave the
        # allocator exactly as they found it.
        first = None
        for round_ in range(3):
            self.ops()
            check(m.memory() == [0] * m.n, "memory after freeing: %s" % m.memory())
            alloc = m.allocator_bytes()
            print(
                "after op round %d: memory() %s, allocator %s per device, of which this mesh's "
                "internal tensors %d, ttnn's own the rest"
                % (round_ + 1, m.memory(), alloc, m.internal_bytes())
            )
            if round_ == 1:
                first = alloc
            elif first is not None:
                check(alloc == first, "allocator after round 3 %s vs round 2 %s" % (alloc, first))
        self.refusals()
        check(m.memory() == [0] * m.n, "memory at the end %s" % m.memory())
        m.close()
        if self.cols == 2:
            self.submesh(config)
        self.report()

    def submesh(self, config):
        """A 1x1 submesh at column 1 of a 1x2 parent (the 1x4-parent path, scaled to the two
        chips the mock knows): opens, runs ops, closes before its parent."""
        b = self.backend
        parent = b.open_parent(dict(config, parent_cols=2))
        sub = b.open_submesh(parent, dict(config, cols=1, submesh_offset=1))
        self.mesh = sub
        check(sub.n == 1 and sub.device_ids() == [1], "submesh ids %s" % sub.device_ids())
        x = self.act(37, 96)
        w = self.matrix(96, 48, BFP8_B, REPLICATED)[:2]
        y = sub.linear(
            x, w, dict(fidelity=HIFI2, fp32_dest_acc=1, bf16_activations=1, packer_l1_acc=0)
        )
        check(tuple(y.t.shape) == (1, 1, 37, 48), "submesh linear")
        for pair in (x, w, (None, y)):
            sub.free(*pair)
        check(sub.memory() == [0], "submesh memory")
        sub.close()
        parent.close()
        print("submesh 1x1 at column 1 of a 1x2 parent: ok")

    def uploads(self):
        m, ttnn = self.mesh, self.ttnn
        # The byte-exact constructor, on the host tensor itself.
        for dtype in (F32, BF16, BFP8_B, BFP4_B):
            for rows, cols in ((37, 48), (96, 100), (64, 64)):
                data = self.packed(rows, cols, dtype)
                check(
                    len(data) == stored_bytes(Meta(rows, cols, 1, dtype, TILE, MATRIX, 0)),
                    "packed size",
                )
                t = host_matrix(ttnn, rows, cols, dtype, data)
                check(host_bytes(t) == data, "host bytes differ for %s %dx%d" % (dtype, rows, cols))
                check(
                    tuple(t.shape) == (1, 1, rows, cols) and t.dtype == tt_dtype(ttnn, dtype),
                    "host spec",
                )
                junk = RNG.integers(0, 256, len(data), dtype=np.uint8).tobytes()
                check(
                    host_bytes(host_matrix(ttnn, rows, cols, dtype, junk)) == junk,
                    "arbitrary bytes kept",
                )
        # Every role and dtype to the device, sharded and replicated.
        held = []
        for dtype in (F32, BF16, BFP8_B, BFP4_B):
            for placement in (SHARDED, REPLICATED):
                before = m.allocator_bytes()["DRAM"]
                meta, obj, parts = self.matrix(37, 100, dtype, placement)
                grew = m.allocator_bytes()["DRAM"] - before
                check(
                    grew * m.n == m.device_bytes(meta, obj),
                    "allocator grew %d per device, device_bytes %d"
                    % (grew, m.device_bytes(meta, obj)),
                )
                check(
                    obj.t.dtype == tt_dtype(ttnn, dtype) and tuple(obj.t.shape) == (1, 1, 37, 100),
                    "matrix on device",
                )
                check(m.device_bytes(meta, obj) > 0, "device bytes")
                for d in range(m.n):
                    stored = m.read_stored(meta, obj, d)
                    check(len(stored) == stored_bytes(meta), "read_stored length")
                    down = m.download(meta, obj, d)
                    check(len(down) == 37 * 100 * 4, "download length")
                held.append((meta, obj))
        for placement in (REPLICATED, SHARDED):
            a = self.act(37, 48, placement)
            v = self.vec(3, 7, placement)
            for meta, obj in (a, v):
                for d in range(m.n):
                    check(len(m.download(meta, obj, d)) == meta.rows * meta.cols * 4, "download")
                    check(len(m.read_stored(meta, obj, d)) == stored_bytes(meta), "read_stored")
            c = (a[0], m.copy(*a))
            check(c[1].t.buffer_address() != a[1].t.buffer_address(), "copy has its own buffer")
            held += [a, v, c]
        check(m.memory()[0] > 0, "memory with tensors")
        total = sum(m.device_bytes(*p) for p in held)
        check(total == m.memory()[0] * m.n, "device_bytes %d vs memory %s" % (total, m.memory()))
        for p in held:
            m.free(*p)
        del held
        check(m.memory() == [0] * m.n, "memory after freeing uploads %s" % m.memory())

    def ops(self):
        m = self.mesh
        n = m.n
        split = SHARDED if n > 1 else REPLICATED
        keep = []

        def k(*pairs):
            keep.extend(pairs)
            return pairs[0] if len(pairs) == 1 else pairs

        x = k(self.act(37, 96))
        wcol = self.matrix(96, 160, BFP8_B)[:2]
        for bf16_act in (0, 1):
            y0 = m.linear(
                x,
                wcol,
                dict(fidelity=HIFI2, fp32_dest_acc=1, bf16_activations=bf16_act, packer_l1_acc=1),
            )
            m.free(None, y0)
        cfg = dict(fidelity=HIFI2, fp32_dest_acc=1, bf16_activations=1, packer_l1_acc=1)
        y = k(self.res(self.op("linear", m.linear, x, wcol, cfg), 37, 160, split))
        self.expect(y, 37, 160, split, what="linear column-parallel")
        xs = k(self.act(100, 80, SHARDED if n > 1 else REPLICATED))
        wrow = self.matrix(80, 96, BF16)[:2]
        for fid in (EXACT, LOFI):
            part = m.linear(
                xs, wrow, dict(fidelity=fid, fp32_dest_acc=0, bf16_activations=0, packer_l1_acc=0)
            )
            m.free(None, part)
        p_place = PARTIAL if n > 1 else REPLICATED
        p = k(self.res(self.op("linear", m.linear, xs, wrow, cfg), 100, 96, p_place))
        if n > 1:
            # Partial sums in the activation dtype (bf16 collectives under bf16, as the port).
            self.expect(p, 100, 96, PARTIAL, what="linear row-parallel")
            r = k(self.res(self.op("all_reduce", m.all_reduce, p), 100, 96, REPLICATED))
            self.expect(r, 100, 96, REPLICATED, what="all_reduce")
        w4 = self.matrix(96, 48, BFP4_B, REPLICATED)[:2]
        self.expect(k(self.res(m.linear(x, w4, cfg), 37, 48, split)), 37, 48, split, what="bfp4")
        wf = self.matrix(96, 48, F32, REPLICATED)[:2]
        self.expect(k(self.res(m.linear(x, wf, cfg), 37, 48, split)), 37, 48, split, what="f32 w")
        parts = self.op("split_cols", m.split_cols, y, [48, 80, 32])
        for w, obj in zip((48, 80, 32), parts):
            self.expect(k(self.res(obj, 37, w, split)), 37, w, split, what="split_cols")
        x2 = k(self.act(37, 96))
        self.expect(
            k(self.res(self.op("add", m.add, x, x2), 37, 96, REPLICATED)),
            37,
            96,
            REPLICATED,
            what="add",
        )
        for group in (96, 48, 24):
            w = k(self.vec(group, 1))
            out = self.op("rms_norm", m.rms_norm, x, w, group, 1e-6, 1)
            self.expect(
                k(self.res(out, 37, 96, REPLICATED)), 37, 96, REPLICATED, what="rms_norm %d" % group
            )
        self.expect(
            k(self.res(self.op("swiglu", m.swiglu, y), 37, 80, split)), 37, 80, split, what="swiglu"
        )
        q, g = self.op("split_query_gate", m.split_query_gate, x, 2, 24)
        q, g = k(self.res(q, 37, 48, REPLICATED)), k(self.res(g, 37, 48, REPLICATED))
        self.expect(q, 37, 48, REPLICATED, what="query")
        self.expect(g, 37, 48, REPLICATED, what="gate")
        self.expect(
            k(self.res(self.op("mul_sigmoid", m.mul_sigmoid, q, g), 37, 48, REPLICATED)),
            37,
            48,
            REPLICATED,
            what="mul_sigmoid",
        )
        for rows, heads, hd, half in ((37, 2, 24, 8), (100, 2, 64, 16), (37, 3, 96, 32)):
            xr = k(self.act(rows, heads * hd))
            ang = RNG.standard_normal((rows, half)).astype(np.float32)
            tables = (rows, half, np.cos(ang).tobytes(), np.sin(ang).tobytes())
            self.expect(
                k(
                    self.res(
                        self.op("rope", m.rope, xr, tables, heads, hd), rows, heads * hd, REPLICATED
                    )
                ),
                rows,
                heads * hd,
                REPLICATED,
                what="rope",
            )
        self.attention(k)
        self.delta(k, split)
        self.vision(k)
        for pair in keep:
            m.free(*pair)
        keep.clear()

    def attention(self, k):
        m = self.mesh
        cases = ((37, 37, 2, 1, 24), (100, 64, 4, 2, 64), (64, 128, 2, 2, 32))
        for t1, t2, heads, kvh, d in cases:
            k1, v1 = k(self.act(t1, kvh * d)), k(self.act(t1, kvh * d))
            keys = k(
                self.res(
                    self.op("append_rows", m.append_rows, None, k1, kvh), t1, kvh * d, REPLICATED
                )
            )
            vals = k(self.res(m.append_rows(None, v1, kvh), t1, kvh * d, REPLICATED))
            q1 = k(self.act(t1, heads * d))
            o = self.op("causal_attention", m.causal_attention, q1, keys, vals, heads, kvh, d)
            self.expect(
                k(self.res(o, t1, heads * d, REPLICATED)),
                t1,
                heads * d,
                REPLICATED,
                what="attention first chunk",
            )
            k2, v2 = k(self.act(t2, kvh * d)), k(self.act(t2, kvh * d))
            keys2 = k(self.res(m.append_rows(keys, k2, kvh), t1 + t2, kvh * d, REPLICATED))
            vals2 = k(self.res(m.append_rows(vals, v2, kvh), t1 + t2, kvh * d, REPLICATED))
            pool = keys[1].pool
            check(
                keys2[1].pool is pool and keys2[1].blocks[: t1 // 64] == keys[1].blocks[: t1 // 64],
                "an append shares the old handle's whole blocks",
            )
            q2 = k(self.act(t2, heads * d))
            o2 = m.causal_attention(q2, keys2, vals2, heads, kvh, d)
            self.expect(
                k(self.res(o2, t2, heads * d, REPLICATED)),
                t2,
                heads * d,
                REPLICATED,
                what="attention at start %d" % t1,
            )
            # A second append to the old handle (a prefix-cache slot): the same pool, its own
            # copy of the partial block only; the old handle stays valid.
            k3 = k(self.act(5, kvh * d))
            keys3 = k(self.res(m.append_rows(keys, k3, kvh), t1 + 5, kvh * d, REPLICATED))
            check(keys3[1].pool is pool, "an append to a non-tail handle copies no pool")
            if t1 % 64:
                check(
                    keys3[1].blocks[-1] not in keys2[1].blocks,
                    "the shared partial block is copied on write",
                )
            keys4 = k(self.res(m.append_rows(keys2, k3, kvh), t1 + t2 + 5, kvh * d, REPLICATED))
            check(keys4[1].pool is pool, "an append to the tail owner stays in the pool")
            check(keys[1].rows == t1 and keys2[1].rows == t1 + t2, "old handles unchanged")
            slot = k(self.res(self.op("copy", m.copy, keys[0], keys[1]), t1, kvh * d, REPLICATED))
            check(
                slot[1].pool is pool and slot[1].blocks == keys[1].blocks,
                "a slot shares its blocks",
            )
            # Prefix-cache hits: each appends its own tail to the slot and is released after;
            # the pool neither grows nor copies, and the mesh's memory stays flat.
            flat = None
            for hit in range(20):
                tail = m.append_rows(slot, self.act(t2, kvh * d), kvh)
                if flat is None:
                    flat = (pool.cap, m.memory())
                check((pool.cap, m.memory()) == flat, "KV memory flat at prefix-cache hit %d" % hit)
                m.free(None, tail)
            down = m.download(keys2[0], keys2[1], 0)
            check(len(down) == (t1 + t2) * kvh * d * 4, "KV download")
        # Plain activations as keys/values (paged on the way).
        kk, vv, qq = k(self.act(37, 64)), k(self.act(37, 64)), k(self.act(37, 128))
        o = m.causal_attention(qq, kk, vv, 2, 1, 64)
        self.expect(k(self.res(o, 37, 128, REPLICATED)), 37, 128, REPLICATED, what="attn plain")

    def delta(self, k, split):
        m = self.mesh
        x = k(self.act(37, 96))
        taps = k(self.vec(96, 4))
        out, carry = self.op("causal_conv1d_silu", m.causal_conv1d_silu, x, taps, None, 4)
        self.expect(k(self.res(out, 37, 96, split)), 37, 96, split, what="conv out")
        # ttnn's native conv (bf16) leaves its carry ROW_MAJOR bf16, the FIR a TILE one.
        native = m.native_conv(37, 96, 4)
        self.expect(
            k(self.res(carry, 3, 96, split)),
            3,
            96,
            split,
            self.ttnn.bfloat16 if native else None,
            "conv carry",
            self.ttnn.ROW_MAJOR_LAYOUT if native else None,
        )
        x2 = k(self.act(2, 96))
        out2, carry2 = m.causal_conv1d_silu(x2, taps, self.res(carry, 3, 96, split), 4)
        self.expect(k(self.res(out2, 2, 96, split)), 2, 96, split, what="conv 2 rows")
        self.expect(k(self.res(carry2, 3, 96, split)), 3, 96, split, what="conv carry 2")
        f32 = self.ttnn.float32
        for t, nk, nv, dk, dv in (
            (37, 1, 2, 32, 32),
            (100, 1, 2, 32, 48),
            (300, 2, 4, 64, 64),
            (37, 1, 2, 24, 24),
        ):
            a, bb = k(self.act(t, nv)), k(self.act(t, nv))
            a_log, dt_bias = k(self.vec(nv, 1)), k(self.vec(nv, 1))
            g, beta = self.op("delta_gates", m.delta_gates, a, bb, a_log, dt_bias)
            g, beta = k(self.res(g, t, nv, REPLICATED)), k(self.res(beta, t, nv, REPLICATED))
            self.expect(g, t, nv, REPLICATED, f32, "g")
            self.expect(beta, t, nv, REPLICATED, f32, "beta")
            qkv = k(self.act(t, 2 * nk * dk + nv * dv))
            spec = dict(key_heads=nk, value_heads=nv, key_dim=dk, value_dim=dv)
            o, s = self.op("gated_delta_rule", m.gated_delta_rule, qkv, g, beta, None, spec)
            o, s = k(self.res(o, t, nv * dv, split)), k(self.res(s, nv * dk, dv, split))
            self.expect(o, t, nv * dv, split, what="delta out")
            self.expect(s, nv * dk, dv, split, f32, "delta state")
            o2, s2 = m.gated_delta_rule(qkv, g, beta, s, spec)
            self.expect(k(self.res(o2, t, nv * dv, split)), t, nv * dv, split, what="delta out 2")
            self.expect(k(self.res(s2, nv * dk, dv, split)), nv * dk, dv, split, f32, "state 2")
        xz, z = k(self.act(37, 64)), k(self.act(37, 64))
        w = k(self.vec(32, 1))
        self.expect(
            k(
                self.res(
                    self.op("gated_rms_norm", m.gated_rms_norm, xz, z, w, 32, 1e-6),
                    37,
                    64,
                    REPLICATED,
                )
            ),
            37,
            64,
            REPLICATED,
            what="gated_rms_norm",
        )

    def vision(self, k):
        m = self.mesh
        x = k(self.act(100, 80))
        w, bvec = k(self.vec(80, 1)), k(self.vec(80, 1))
        self.expect(
            k(self.res(self.op("layer_norm", m.layer_norm, x, w, bvec, 1e-6), 100, 80, REPLICATED)),
            100,
            80,
            REPLICATED,
            what="layer_norm",
        )
        self.expect(
            k(self.res(self.op("add_bias", m.add_bias, x, bvec), 100, 80, REPLICATED)),
            100,
            80,
            REPLICATED,
            what="add_bias",
        )
        for kind in (GELU_TANH, GELU_ERF):
            self.expect(
                k(self.res(self.op("gelu", m.gelu, x, kind), 100, 80, REPLICATED)),
                100,
                80,
                REPLICATED,
                what="gelu",
            )
        for heads, hd in ((2, 40), (2, 64)):
            xr = k(self.act(100, heads * hd))
            cos, sin = k(self.act(100, hd)), k(self.act(100, hd))
            self.expect(
                k(
                    self.res(
                        self.op("rotary", m.rotary, xr, cos, sin, heads, hd),
                        100,
                        heads * hd,
                        REPLICATED,
                    )
                ),
                100,
                heads * hd,
                REPLICATED,
                what="rotary",
            )
        q, kk, v = k(self.act(100, 80)), k(self.act(100, 80)), k(self.act(100, 80))
        o = self.op("segment_attention", m.segment_attention, q, kk, v, 2, 40, [(0, 37), (37, 100)])
        self.expect(
            k(self.res(o, 100, 80, REPLICATED)), 100, 80, REPLICATED, what="segment_attention"
        )
        f = k(self.act(100, 48))
        self.expect(
            k(self.res(self.op("fold_rows", m.fold_rows, f, 4), 25, 192, REPLICATED)),
            25,
            192,
            REPLICATED,
            what="fold_rows",
        )

    def refusals(self):
        """A shape ttnn refuses (validated before any kernel is built) raises ttnn's own
        TT_FATAL text; a refusal only this package can make raises ValueError naming the op."""
        m = self.mesh
        x, w = self.act(37, 96), self.vec(48, 1)
        try:
            # The core would refuse this (w has 48 values, group 96); the package does not
            # check it, so ttnn's validation of the gamma does.
            m.rms_norm(x, w, 96, 1e-6, 1)
        except ValueError as e:
            raise AssertionError("rms_norm with a 48-value gamma: expected ttnn's error") from e
        except Exception as e:
            check("TT_FATAL" in str(e), "ttnn's refusal carries TT_FATAL: %s" % str(e)[:300])
            line = [ln for ln in str(e).split("\n") if "TT_FATAL" in ln][0]
            print("ttnn refusal:", line.strip()[:300])
        else:
            raise AssertionError("rms_norm of 96 columns with a 48-value gamma was not refused")
        b = self.act(37, 100)
        try:
            m.add(x, b)
        except ValueError as e:
            raise AssertionError("add of mismatched shapes: expected ttnn's error") from e
        except RuntimeError as e:
            check("TT_THROW" in str(e) or "TT_FATAL" in str(e), "ttnn's text: %s" % str(e)[:200])
        else:
            raise AssertionError("add of 37x96 and 37x100 was not refused")
        try:
            m.append_rows(None, x, 5)
        except ValueError as e:
            check("append_rows" in str(e), "our refusal names the op")
        else:
            raise AssertionError("append_rows of 96 columns in 5 heads was not refused")
        try:
            m.check(Meta(37, 95, m.n, F32, TILE, ACTIVATION, REPLICATED), x[1])
        except ValueError as e:
            check("result check" in str(e), "check names itself")
        else:
            raise AssertionError("check accepted a 37x96 tensor as 37x95")
        for pair in (x, w, b):
            m.free(*pair)

    def report(self):
        print(
            "host time per ABI op on the mock (1x%d, %s activations, programs cached; "
            "min-max over the shapes run; ttnn calls incl. deallocates):"
            % (self.cols, "bf16" if self.act_dtype == BF16 else "f32")
        )
        for name, runs in sorted(self.timings.items()):
            ts = [r[0] * 1e3 for r in runs]
            calls = [r[1] for r in runs]
            frees = [r[2] for r in runs]
            print(
                "  %-20s %6.2f-%6.2f ms  %3d-%3d ttnn calls (%d-%d deallocate)"
                % (name, min(ts), max(ts), min(calls), max(calls), min(frees), max(frees))
            )
        print("host time per ttnn call (mean over the timed runs):")
        for k, (c, sec) in sorted(self.per_call.items(), key=lambda kv: -kv[1][1]):
            print("  %-52s %5d calls %7.1f us" % (k, c, sec / c * 1e6))


def descriptors_dir(args):
    if "--descriptors" in args:
        return args[args.index("--descriptors") + 1]
    env = os.environ.get("CLEF_TT_MOCK_DESCRIPTORS")
    if env:
        return env
    # The project's kit (ffi/ttnn-mock).
    folder = os.path.normpath(os.path.join(HERE, "..", "..", "..", "ttnn-mock"))
    if os.path.exists(os.path.join(folder, "blackhole_P150.yaml")):
        return folder
    raise SystemExit("no mock cluster descriptors found: pass --descriptors DIR")


def spare_pools_follow_the_latest():
    """SparePools keeps the newest `limit` pool tensors: a longer sequence after shorter ones
    fills the spares reuses its own pools from its next chunk on (fake pools and a fake ttnn:
    the policy alone)."""

    class Tensor:
        def __init__(self):
            self.alive = True

        def is_allocated(self):
            return self.alive

    class FakeTtnn:
        @staticmethod
        def deallocate(t, force=False):
            t.alive = False

    class Pool:
        def __init__(self, cap):
            self.heads, self.dp, self.cap, self.t = 2, 256, cap, Tensor()

    spares = SparePools(2)
    small = [Pool(2), Pool(3)]
    for p in small:
        check(spares.keep(p, FakeTtnn), "a spare is kept below the limit")
    check(spares.take(2, 256, 4) is None, "no shorter sequence's pool fits a longer one")
    big = Pool(4)
    check(spares.keep(big, FakeTtnn), "at the limit the newest is kept")
    check(not small[0].t.alive and small[1].t.alive, "and the oldest is deallocated")
    check(spares.take(2, 256, 4) == (4, big.t), "the longer sequence's pool is reused")
    check(spares.take(2, 256, 1) == (3, small[1].t), "the smallest that fits is taken")
    check(spares.take(2, 128, 1) is None, "pools of another head shape never mix")
    check(not SparePools(0).keep(Pool(1), FakeTtnn), "a limit of 0 keeps nothing")


def main(args):
    spare_pools_follow_the_latest()
    if "--cols" in args:
        cols = int(args[args.index("--cols") + 1])
        act = F32 if "--act" in args and args[args.index("--act") + 1] == "f32" else BF16
        Suite(cols, act).run()
        print("ok: 1x%d mesh" % cols)
        return 0
    folder = descriptors_dir(args)
    runs = (
        (1, "blackhole_P150.yaml", "bf16"),
        (2, "blackhole_2xP150.yaml", "bf16"),
        (1, "blackhole_P150.yaml", "f32"),
    )
    failed = 0
    for cols, desc, act in runs:
        env = dict(os.environ, TT_METAL_MOCK_CLUSTER_DESC_PATH=os.path.join(folder, desc))
        r = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--cols", str(cols), "--act", act], env=env
        )
        print(
            "mesh 1x%d, %s activations: %s"
            % (cols, act, "ok" if r.returncode == 0 else "FAILED (%d)" % r.returncode)
        )
        failed += r.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
