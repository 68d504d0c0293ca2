"""A whole prefill pass in one call (a mesh mixin), replayed from a ttnn trace (trace.py).

The layer op "pass" runs what src/backbone/ runs for one chunk of one request, layer op by layer
op: every decoder layer's mixer (attention or DeltaNet) and MLP, the final norm, and its rows
ready to read. Its tensors, in order: the chunk's rows [T, hidden] (an uploaded activation the
package still holds on the host: transfers.py uploads activations lazily), the final norm, then
per layer its mixer's weights (attention: input norm, qkv|gate, q_norm, k_norm, o_proj;
DeltaNet: input norm, in_proj, conv, A_log, dt_bias, gated norm, out_proj), its MLP's (post
norm, gate|up, down) and its state (attention: keys, values; DeltaNet: conv carry, recurrent
state; absent at a sequence's start). Params: {"layers": [{"kind": "attention" | "delta_net",
"mixer": {the layer op's params}, "mlp": {...}}], "eps", "config", "start" (the position of the
first row), "consume" (the caller drops the states it passes: the previous chunk's)}. Results: the final rows [T, hidden], then every layer's new state.

Buckets. T is rounded up to the smallest bucket (CLEF_TT_TRACE_BUCKETS, default 128, 256, 512,
1024 tokens; longer chunks to a multiple of 64); a pass is captured once per (bucket, from the
start or continuing, page-table width) and replayed from then on. The pad rows after the T real
ones change nothing that outlives the pass: their K and V go to the KV pools' trash block, the
delta rule's gates are 0 on them (no state update), the conv's carry is taken at row T (its
`actual_end` input), and their output rows are never read. The first pass of a bucket runs its
ops eagerly (programs compiled and cached: a capture must not load programs); the next one is
captured and replayed; every later one only replays.

Persistent inputs (allocated before any capture of their bucket, written by the host before each
run, never inside a capture): the rows, the rope tables, the page table of the rows' KV blocks
and the one SDPA reads (the sequence's blocks), the start position (chunked SDPA's
`chunk_start_idx_tensor`: a device tensor, so one trace serves every start), the conv's
`actual_end` and the gates' row mask. State at fixed addresses: the KV of every pass lives in
shared pools (kv_cache.SharedPools: one page table for every layer), the DeltaNet state in the
live buffers (persistent.py), which a pass continues in place. The output is one persistent
[bucket, hidden] bf16 ROW_MAJOR tensor, read once.

A pass takes the forms the layer ops take (NotImplementedError otherwise, before any device
work: the caller runs its layers itself): bf16, the layer ops' shapes, a start that is a
multiple of 64, KV in the shared pools (a sequence the per-layer path started keeps its own).
"""

import os

import numpy as np

from .kv_cache import KV, SharedPools
from .meta import ACTIVATION, BF16, KV_BLOCK, REPLICATED, TILE, Meta, f32, round_up
from .persistent import LiveState, LiveStates, View
from .programs import sdpa_chunks, sdpa_program
from .trace import TraceError, tracing_enabled

# Weights each layer kind's mixer takes, in the layer op's order.
MIXER_WEIGHTS = {"attention": 5, "delta_net": 7}
MLP_WEIGHTS = 3
# KV pool room when the caller names none (tokens).
DEFAULT_KV_TOKENS = 32768


def buckets():
    """The pass lengths traces are captured for (CLEF_TT_TRACE_BUCKETS, comma separated, each a
    multiple of 64)."""
    text = os.environ.get("CLEF_TT_TRACE_BUCKETS", "128,256,512,1024")
    out = sorted({int(x) for x in text.split(",") if x.strip().isdigit() and int(x) > 0})
    return [b for b in out if b % KV_BLOCK == 0] or [1024]


def _refuse(why):
    raise NotImplementedError("pass: %s (the caller runs the layers one by one)" % why)


class Layer:
    """One layer of a pass: its kind, weights and params, and the state it continues."""

    __slots__ = ("kind", "mixer", "mixer_p", "mlp", "mlp_p", "state")


class PassCtx:
    """One pass's device inputs and its KV plan; the hooks the layer ops call in a pass."""

    def __init__(self, mesh, rows, tb, start, width, eps):
        self.rows, self.tb, self.start, self.eps = rows, tb, start, eps
        ttnn = mesh.ttnn
        get = mesh.pass_tensor
        self.rows_in = get("rows", (1, 1, tb, rows[0].cols), mesh.act_dtype, ttnn.TILE_LAYOUT)
        self.fill = get("fill_table", (1, tb // KV_BLOCK), ttnn.int32, ttnn.ROW_MAJOR_LAYOUT)
        self.read = get("read_table", (1, width), ttnn.int32, ttnn.ROW_MAJOR_LAYOUT)
        self.start_t = get("start", (1,), ttnn.int32, ttnn.ROW_MAJOR_LAYOUT)
        self.actual_end = get("actual_end", (1,), ttnn.uint32, ttnn.ROW_MAJOR_LAYOUT)
        self.mask = get("row_mask", (1, 1, tb, 1), ttnn.float32, ttnn.TILE_LAYOUT)
        self.out = get("out", (1, 1, tb, rows[0].cols), ttnn.bfloat16, ttnn.ROW_MAJOR_LAYOUT)
        self.rope = None
        self.layer = 0
        # Whether the pass replays a trace (only the golden-shadow mutations ask).
        self.replaying = False

    # -- hooks of the layer ops (layers.py, delta.py, text_ops.py) --------------------------------
    def attend(self, mesh, q, k, v, d, ckc):
        """A layer's new K and V into the passes' pools at the pass's blocks, then causal SDPA
        of q over the sequence's blocks from the start tensor."""
        ttnn = mesh.ttnn
        pools = mesh.kv_shared.pools(mesh, self.layer)
        for pool, new in zip(pools, (k, v)):
            mesh.tt.call(
                "experimental.paged_fill_cache",
                ttnn.experimental.paged_fill_cache,
                pool.t,
                new,
                self.fill,
                batch_idx=0,
            )
        q_chunk, k_chunk = sdpa_chunks(self.tb, 0)
        return mesh.tt.call(
            "transformer.chunked_scaled_dot_product_attention",
            ttnn.transformer.chunked_scaled_dot_product_attention,
            q,
            pools[0].t,
            pools[1].t,
            self.read,
            chunk_start_idx_tensor=self.start_t,
            scale=f32(d**-0.5),
            program_config=sdpa_program(ttnn, mesh.grid, q_chunk, k_chunk),
            compute_kernel_config=ckc,
            memory_config=mesh.dram,
        )

    def masked_gates(self, mesh, g, beta):
        """g and beta with 0 on the pad rows (decay exp(0) = 1, no update: the state after the
        pass is the state at its last real row)."""
        out = [mesh.binary("multiply", mesh.ttnn.multiply, a, self.mask) for a in (g, beta)]
        mesh.drop(g, beta)
        return out


class PassOps:
    """The layer op "pass" (mesh mixin); see the module docstring."""

    pass_ctx = None
    # The pass whose inputs the host is writing (golden/mutate.py's stale_input reads it).
    pass_writing = None

    def passes_init(self):
        self.pass_tensors = {}
        self.kv_shared = None
        self.live = LiveStates()
        self.pass_seen = {}
        self.pass_untraced = {}
        self.pass_counts = {"traced": 0, "eager": {}}
        self.pass_kv_tokens = DEFAULT_KV_TOKENS

    def trace_command(self, request):
        """{"trace": "facts"}: the passes' counts (traced, eager by reason), the buckets and the
        traces' facts (trace.py); {"trace": "configure", "kv_tokens": N}: room for N tokens in
        the passes' KV pools (before the first pass: the pools are made then)."""
        what = request.get("trace")
        if what == "configure":
            self.pass_kv_tokens = int(request.get("kv_tokens") or DEFAULT_KV_TOKENS)
            return {}
        if what == "facts":
            return {
                "tracing": tracing_enabled(),
                "buckets": buckets(),
                "passes": {
                    "traced": self.pass_counts["traced"],
                    "eager": dict(self.pass_counts["eager"]),
                },
                "untraced": sorted(set(self.pass_untraced.values())),
                "kv_blocks": self.kv_shared.cap if self.kv_shared is not None else 0,
                **self.trace_facts(),
            }
        raise NotImplementedError("no trace command %r (facts | configure)" % what)

    def pass_tensor(self, name, shape, dtype, layout):
        """A persistent input or output of the passes (allocated once, values unset)."""
        key = (name, tuple(shape))
        t = self.pass_tensors.get(key)
        if t is None:
            ttnn = self.ttnn
            t = self.tt.call(
                "allocate_tensor_on_device",
                ttnn.allocate_tensor_on_device,
                ttnn.Shape(list(shape)),
                dtype,
                layout,
                self.device,
                self.dram,
            )
            self.pass_tensors[key] = self.protect(t, self)
        return t

    def _write(self, t, array, dtype, layout):
        """Host values into persistent tensor `t` (replicated), outside any capture."""
        ttnn = self.ttnn
        host = self.tt.call(
            "Tensor", ttnn.Tensor, np.ascontiguousarray(array), data_type=dtype, layout=layout
        )
        self.tt.call("copy_host_to_device_tensor", ttnn.copy_host_to_device_tensor, host, t)

    # -- parsing ----------------------------------------------------------------------------------
    def _pass_layers(self, tensors, p):
        rows, final = tensors[0], tensors[1]
        at, layers = 2, []
        for spec in p["layers"]:
            layer = Layer()
            layer.kind = spec["kind"]
            if layer.kind not in MIXER_WEIGHTS:
                _refuse("a layer of kind %r" % layer.kind)
            n = MIXER_WEIGHTS[layer.kind]
            layer.mixer, at = tensors[at : at + n], at + n
            layer.mlp, at = tensors[at : at + MLP_WEIGHTS], at + MLP_WEIGHTS
            layer.state, at = tensors[at : at + 2], at + 2
            layer.mixer_p = dict(spec["mixer"], config=p["config"])
            layer.mlp_p = dict(spec["mlp"], config=p["config"])
            layers.append(layer)
        if at != len(tensors) or rows is None or final is None:
            raise ValueError("pass: %d tensors for %d layers" % (len(tensors), len(layers)))
        return rows, final, layers

    def _check_forms(self, layers, h_meta, half):
        """Every layer op of the pass takes its form (NotImplementedError before any work)."""
        h = (h_meta, None)
        tables = (h_meta.rows, half, None, None)
        for layer in layers:
            if layer.kind == "attention":
                self.attention_layer([h, *layer.mixer, None, None], layer.mixer_p, tables, True)
            else:
                self.delta_layer([h, *layer.mixer, None, None], layer.mixer_p, None, True)
            self.mlp_layer([h, *layer.mlp], layer.mlp_p, None, True)

    def _kv_in(self, layers, start):
        """The blocks of the sequence the pass continues (all layers' handles hold the same),
        or [] from its start; refuses KV outside the shared pools."""
        blocks = None
        for layer in layers:
            if layer.kind != "attention":
                continue
            k, v = layer.state
            if (k is None) != (v is None):
                _refuse("keys without values")
            if k is None:
                if blocks:
                    _refuse("layers from the start and continuing")
                blocks = []
                continue
            for kv in (k[1], v[1]):
                kv_pool = getattr(getattr(kv, "pool", None), "shared", None)
                if kv_pool is None or kv_pool is not self.kv_shared:
                    _refuse("a KV cache outside the passes' pools")
                if kv.rows != start or (blocks is not None and kv.blocks != blocks):
                    _refuse("layers' KV caches at different positions")
                blocks = list(kv.blocks)
        return blocks or []

    # -- the op -----------------------------------------------------------------------------------
    def pass_op(self, tensors, p, tables):
        if not tracing_enabled():
            _refuse("tracing is off (CLEF_TT_TRACE=0)")
        rows, final, layers = self._pass_layers(tensors, p)
        t = rows[0].rows
        tb = next((b for b in buckets() if b >= t), round_up(t, KV_BLOCK))
        if tables is None:
            _refuse("no rope tables")
        self._bf16_only("pass")
        h_meta = Meta(tb, rows[0].cols, self.n, BF16, TILE, ACTIVATION, REPLICATED)
        self._check_forms(layers, h_meta, int(tables[1]))
        start = int(p.get("start", 0))
        if start % KV_BLOCK:
            _refuse("a start at %d, not a multiple of %d" % (start, KV_BLOCK))
        attention = [i for i, x in enumerate(layers) if x.kind == "attention"]
        if not attention:
            _refuse("no attention layer")
        first = layers[attention[0]].mixer_p
        kvh, d = int(first["kv_heads"]), int(first["head_dim"])
        if self.kv_shared is None:
            tokens = self.pass_kv_tokens
            self.kv_shared = SharedPools(-(-tokens // KV_BLOCK) + 1, kvh, d, round_up(d, 32))
        base = self._kv_in(layers, start)
        states = [x.state for x in layers if x.kind == "delta_net"]
        fresh = not base and all(s[0] is None for s in states)
        if (not base) != all(s[0] is None for s in states) or (fresh and start):
            _refuse("KV and DeltaNet states of different starts")
        needed = -(-(start + tb) // KV_BLOCK)
        width = max(32, 1 << (needed - 1).bit_length())
        weights = tuple(id(w[1]) for x in layers for w in x.mixer + x.mlp) + (id(final[1]),)
        key = (tb, fresh, width, hash(weights))
        return self._run_pass(key, rows, final, layers, tables, t, start, base, width, p)

    def _run_pass(self, key, rows, final, layers, tables, t, start, base, width, p):
        tb = key[0]
        if int(tables[0]) != t:
            raise ValueError("pass: rope tables of %d rows for %d" % (int(tables[0]), t))
        ctx = PassCtx(self, rows, tb, start, width, float(p["eps"]))
        ctx.rope = self._rope_inputs(tables, tb)
        shared = self.kv_shared
        for i in (i for i, x in enumerate(layers) if x.kind == "attention"):
            shared.pools(self, i)
        # The live DeltaNet buffers: the states the caller still holds kept, then the pass's
        # input state in them.
        consumed = set()
        if p.get("consume"):
            consumed = {id(s[j][1]) for x in layers for s in [x.state] for j in (0, 1) if s[j]}
        in_place = {
            i
            for i, x in enumerate(layers)
            if x.kind == "delta_net"
            and all(isinstance(s[1], LiveState) and s[1].current() for s in x.state if s)
        }
        self.live.before_overwrite(self, consumed)
        delta_inputs = {}
        for i, x in enumerate(layers):
            if x.kind != "delta_net":
                continue
            spec = x.mixer_p
            nv, dk, dv = int(spec["value_heads"]), int(spec["key_dim"]), int(spec["value_dim"])
            channels = 2 * int(spec["key_heads"]) * dk + nv * dv
            self.live.ensure(self, i, channels, nv * dk, dv)
            carry, state = x.state
            if carry is not None:
                if i not in in_place:
                    self.live.restore(self, i, carry[1].t, state[1].t)
                delta_inputs[i] = tuple(
                    (m, View(self.live.buffer(i, j), m.rows)) for j, (m, _) in enumerate(x.state)
                )
        # The KV plan: the pass's blocks, one temporary hold on them until the handles exist.
        new = shared.take(self, -(-t // KV_BLOCK))
        shared.hold(new)
        try:
            for j, b in enumerate(new):
                shared.filled[b] = min(KV_BLOCK, t - j * KV_BLOCK)
            blocks = base + new
            fill = new + [shared.trash] * (tb // KV_BLOCK - len(new))
            read = blocks + [shared.trash] * (width - len(blocks))
            ctx.replaying = key in self.traces
            self.pass_writing = ctx
            try:
                self._write_inputs(ctx, rows, tables, t, fill, read, start)
            finally:
                self.pass_writing = None
            self._execute(key, ctx, final, layers, delta_inputs)
            self.live.gen += 1
            results = [self.track(View(ctx.out, t))]
            for i, x in enumerate(layers):
                if x.kind == "attention":
                    pools = shared.pools(self, i)
                    results += [self.track(KV(pool, start + t, blocks)) for pool in pools]
                else:
                    results += [self.live.handle(self, i, j) for j in (0, 1)]
            return results
        finally:
            shared.release(new)

    def _rope_inputs(self, tables, tb):
        """The pass's rope tables: persistent [1, 1, bucket, rotary] cos and sin."""
        half = int(tables[1])
        get = self.pass_tensor
        tile = self.ttnn.TILE_LAYOUT
        return tuple(get(name, (1, 1, tb, 2 * half), self.act_dtype, tile) for name in "cs")

    def _write_inputs(self, ctx, rows, tables, t, fill, read, start):
        """Every persistent input of the pass, from the host (outside any capture)."""
        ttnn = self.ttnn
        tb, hidden = ctx.tb, rows[0].cols
        held = rows[1].host_values()
        if held is not None:
            data = np.zeros((1, 1, tb, hidden), np.float32)
            data[0, 0, :t] = held.reshape(t, hidden)
            self._write(ctx.rows_in, data, self.act_dtype, ttnn.TILE_LAYOUT)
        else:
            # Rows already on the device (read by another op first): padded and copied there.
            padded = self.pad_end(rows[1].t, 2, tb)
            self.tt.call("copy", ttnn.copy, padded, ctx.rows_in)
        n, half = int(tables[0]), int(tables[1])
        for dev, raw in zip(ctx.rope, (tables[2], tables[3])):
            a = np.frombuffer(bytes(raw), dtype=np.float32).reshape(n, half)
            full = np.zeros((1, 1, tb, 2 * half), np.float32)
            full[0, 0, :n] = np.concatenate([a, a], axis=1)
            self._write(dev, full, self.act_dtype, ttnn.TILE_LAYOUT)
        rm = ttnn.ROW_MAJOR_LAYOUT
        self._write(ctx.fill, np.asarray([fill], np.int32), ttnn.int32, rm)
        self._write(ctx.read, np.asarray([read], np.int32), ttnn.int32, rm)
        self._write(ctx.start_t, np.asarray([start], np.int32), ttnn.int32, rm)
        self._write(ctx.actual_end, np.asarray([t], np.float32), ttnn.uint32, rm)
        mask = np.zeros((1, 1, tb, 1), np.float32)
        mask[0, 0, :t] = 1.0
        self._write(ctx.mask, mask, ttnn.float32, ttnn.TILE_LAYOUT)

    def _execute(self, key, ctx, final, layers, delta_inputs):
        """The pass's ops: replayed, captured then replayed, or run eagerly (counted)."""

        def body():
            return self._pass_body(ctx, final, layers, delta_inputs)

        trace = self.traces.get(key)
        if trace is None and tracing_enabled() and key not in self.pass_untraced:
            if self.pass_seen.get(key, 0) >= 1:
                try:
                    trace, _ = self.trace_capture(key, body)
                except (TraceError, RuntimeError) as e:
                    self.pass_untraced[key] = str(e).splitlines()[0][:200]
                    trace = None
            self.pass_seen[key] = self.pass_seen.get(key, 0) + 1
        if trace is not None:
            self.trace_replay(trace)
            self.pass_counts["traced"] += 1
            return
        reason = "untraceable" if key in self.pass_untraced else "warming"
        eager = self.pass_counts["eager"]
        eager[reason] = eager.get(reason, 0) + 1
        body()

    def _pass_body(self, ctx, final, layers, delta_inputs):
        """The ops of the pass (what a trace holds): every layer, the final norm, the rows
        into the output."""
        ttnn = self.ttnn
        h_meta = Meta(ctx.tb, ctx.rows[0].cols, self.n, BF16, TILE, ACTIVATION, REPLICATED)
        h = (h_meta, View(ctx.rows_in, ctx.tb))
        self.pass_ctx = ctx
        try:
            for i, x in enumerate(layers):
                ctx.layer = i
                tables = (ctx.tb, ctx.rope[0].shape[-1] // 2, None, None)
                if x.kind == "attention":
                    out = self.attention_layer([h, *x.mixer, None, None], x.mixer_p, tables)
                else:
                    carry, state = delta_inputs.get(i, (None, None))
                    out = self.delta_layer([h, *x.mixer, carry, state], x.mixer_p, None)
                    for j, made in ((0, out[1]), (1, out[2])):
                        self.tt.call("copy", ttnn.copy, made.t, self.live.buffer(i, j))
                h = (h_meta, out[0])
                h = (h_meta, self.mlp_layer([h, *x.mlp], x.mlp_p, None)[0])
            hidden = h_meta.cols
            gamma = self.gamma(final[1], hidden, True)
            y = self.norm_groups(h[1].t, ctx.tb, hidden, hidden, ctx.eps, gamma)
            rm = self.tt.call(
                "to_layout", ttnn.to_layout, y, ttnn.ROW_MAJOR_LAYOUT, memory_config=self.dram
            )
            self.tt.call("copy", ttnn.copy, rm, ctx.out)
        finally:
            self.pass_ctx = None
