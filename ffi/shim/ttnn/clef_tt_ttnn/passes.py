"""A whole prefill pass in one call (a mesh mixin), replayed from a ttnn trace (trace.py).

The layer op "pass" runs what src/backbone/ runs for one chunk, layer op by layer op: every
decoder layer's mixer (attention or DeltaNet) and MLP, the final norm, and its rows ready to
read. Its tensors, in order: the chunk's rows [T, hidden] (an uploaded activation the package
still holds on the host: transfers.py uploads activations lazily), the final norm, then per
layer its mixer's weights (attention: input norm, qkv|gate, q_norm, k_norm, o_proj; DeltaNet:
input norm, in_proj, conv, A_log, dt_bias, gated norm, out_proj), its MLP's (post norm,
gate|up, down) and its state (attention: keys, values; DeltaNet: conv carry, recurrent state;
absent at a sequence's start). Params: {"layers": [{"kind": "attention" | "delta_net",
"mixer": {the layer op's params}, "mlp": {...}}], "eps", "config", "start" (the position of
the first row), "consume" (the caller drops the states it passes: the previous chunk's),
"batch" (a batched pass, as the layer ops take it: {"requests", "lengths", "keep"})}.
Results: the final rows [T, hidden], then every layer's new state (a batched pass: every
layer's state of each kept prefix, in block order).

Forms (pass_plan.py). A solo pass's T rows round up to the smallest bucket
(CLEF_TT_TRACE_BUCKETS, default 128, 256, 512 and 1,024 tokens; longer chunks to a multiple
of 64). The pad rows after the T real ones change nothing that outlives the pass: their K and
V go to the KV pools' trash block, the delta rule's gates are 0 on them (no state update), the
conv's carry is taken at row T (its `actual_end` input), and their output rows are never read.
A batched pass (packing: B requests in blocks) is a form of its own per block count and size,
kept prefixes and fresh or continuing. A pass is captured once per form (bucket, from the
start or continuing, page-table width; for a batch also its blocks and kept prefixes) and
replayed from then on: the first pass of a form runs its ops eagerly (programs compiled and
cached: a capture must not load programs), the next one is captured and replayed, every later
one only replays.

Persistent inputs (allocated before any capture of their form, written by the host before each
run, never inside a capture): the rows, the rope tables, the page tables of the blocks written
and of the blocks SDPA reads, the start position (chunked SDPA's `chunk_start_idx_tensor`: a
device tensor, so one trace serves every start), the conv's `actual_end` and the row masks.
State at fixed addresses: the KV of every pass lives in shared pools (kv_cache.SharedPools: one
page table for every layer), the DeltaNet state in the live buffers (persistent.py), which a
solo pass continues in place; a batch keeping prefixes leaves their states in buffers of its
form. The output is one persistent [rows, hidden] bf16 ROW_MAJOR tensor, read once.

A pass takes the forms the layer ops take (NotImplementedError otherwise, before any device
work: the caller runs its layers itself): bf16, the layer ops' shapes, a start that is a
multiple of 64, KV in the shared pools (a sequence the per-layer path started keeps its own).
"""

import os

import numpy as np

from .delta import CARRY_FORM
from .kv_cache import KV, Hold, SharedPools
from .meta import ACTIVATION, BF16, KV_BLOCK, REPLICATED, TILE, Meta, round_up
from .pass_plan import PassCtx
from .persistent import LiveState, StateSet, View
from .staging import row_buffer
from .trace import MODES, TraceError, trace_mode

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


def bucket_rows(rows):
    """The rows of the bucket a solo pass of `rows` rows runs in."""
    return next((b for b in buckets() if b >= rows), round_up(rows, KV_BLOCK))


def _refuse(why):
    raise NotImplementedError("pass: %s (the caller runs the layers one by one)" % why)


class Layer:
    """One layer of a pass: its kind, weights and params, the state it continues, and whether
    its MLP is composed from the fine ops (a shape the MLP layer op refuses)."""

    __slots__ = ("kind", "mixer", "mixer_p", "mlp", "mlp_p", "state", "mlp_fine")


class Form:
    """What a pass's trace is captured for (see the module docstring)."""

    __slots__ = (
        "rows",
        "rope_rows",
        "batch",
        "count",
        "each",
        "lengths",
        "keep",
        "fresh",
        "continuing",
        "width",
        "key",
    )

    def __init__(self, t, batch, rope_rows):
        self.batch, self.rope_rows = batch, rope_rows
        if batch is None:
            self.rows, self.count, self.each = bucket_rows(t), 1, None
            self.lengths, self.keep = [t], [0]
        else:
            self.rows, self.count = t, int(batch["requests"])
            self.each = t // self.count
            self.lengths = [int(n) for n in batch["lengths"]]
            self.keep = [int(n) for n in batch.get("keep") or [0] * self.count]


class PassOps:
    """The layer op "pass" (mesh mixin); see the module docstring."""

    pass_ctx = None
    # The pass whose inputs the host is writing (golden/mutate.py's stale_input reads it).
    pass_writing = None

    def passes_init(self):
        self.pass_tensors = {}
        self.pass_hosts = {}
        self.kv_shared = None
        self.live = StateSet()
        # The state sets of batched passes' kept prefixes, per block.
        self.kept_sets = {}
        self.pass_seen = {}
        self.pass_untraced = {}
        # The layer forms checked per shape of pass (and which MLPs compose the fine ops).
        self.pass_checked = {}
        self.pass_counts = {"traced": 0, "eager": {}}
        self.pass_kv_tokens = DEFAULT_KV_TOKENS
        self.pass_mode = trace_mode()

    def trace_command(self, request):
        """{"trace": "facts"}: the passes' counts (traced, eager by reason), the buckets and the
        traces' facts (trace.py); {"trace": "configure", "kv_tokens": N, "mode": M}: room for N
        tokens in the passes' KV pools (before the first pass: the pools are made then), and
        how passes run (trace.MODES; traces held are released when it changes)."""
        what = request.get("trace")
        if what == "configure":
            if "kv_tokens" in request:
                self.pass_kv_tokens = int(request["kv_tokens"] or DEFAULT_KV_TOKENS)
            mode = request.get("mode")
            if mode is not None:
                if mode not in MODES:
                    raise ValueError("trace mode %r: one of %s" % (mode, ", ".join(MODES)))
                if mode != self.pass_mode:
                    self.trace_release_all()
                self.pass_mode = mode
            return {}
        if what == "facts":
            return {
                "mode": self.pass_mode,
                "buckets": buckets(),
                "passes": {
                    "traced": self.pass_counts["traced"],
                    "eager": dict(self.pass_counts["eager"]),
                },
                "untraced": sorted(set(self.pass_untraced.values())),
                # Forms of pass seen in traced mode (each ran eagerly once, then was captured).
                "forms": len(self.pass_seen),
                "kv_blocks": self.kv_shared.cap if self.kv_shared is not None else 0,
                **self.trace_facts(),
            }
        raise NotImplementedError("no trace command %r (facts | configure)" % what)

    def pass_host(self, name, shape, dtype):
        """The host buffer (staging.RowBuffer) a persistent input of the passes is written
        from: made once, filled before every pass."""
        key = (name, tuple(shape), dtype)
        buf = self.pass_hosts.get(key)
        if buf is None:
            buf = self.pass_hosts[key] = row_buffer(self.ttnn, tuple(shape), dtype)
        return buf

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

    def persistent_tensors(self):
        """Every device tensor the passes keep (mesh.tensors() lists them)."""
        out = list(self.pass_tensors.values()) + self.live.tensors()
        for kept in self.kept_sets.values():
            out.extend(kept.tensors())
        if self.kv_shared is not None:
            out.extend(self.kv_shared.tensors())
        return out

    def _write(self, t, array, dtype, layout):
        """Host values into persistent tensor `t` (replicated), outside any capture."""
        host = self.staged_host(array, dtype, layout)
        self.tt.call("copy_host_to_device_tensor", self.ttnn.copy_host_to_device_tensor, host, t)

    # -- parsing ----------------------------------------------------------------------------------
    def _pass_layers(self, tensors, p):
        rows, final = tensors[0], tensors[1]
        at, layers = 2, []
        batch = p.get("batch")
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
            if batch:
                layer.mixer_p["batch"] = batch
            layer.mlp_p = dict(spec["mlp"], config=p["config"])
            layer.mlp_fine = False
            layers.append(layer)
        if at != len(tensors) or rows is None or final is None:
            raise ValueError("pass: %d tensors for %d layers" % (len(tensors), len(layers)))
        return rows, final, layers

    def _check_forms(self, layers, h_meta, half, form):
        """Every layer op of the pass takes its form (NotImplementedError before any work)."""
        h = (h_meta, None)
        tables = (form.rope_rows, half, None, None)
        for layer in layers:
            # A continuing batch's layer ops are given its states (they continue them).
            state = layer.state if form.continuing else (None, None)
            if layer.kind == "attention":
                self.attention_layer([h, *layer.mixer, *state], layer.mixer_p, tables, True)
            else:
                self.delta_layer([h, *layer.mixer, *state], layer.mixer_p, None, True)
            try:
                self.mlp_layer([h, *layer.mlp], layer.mlp_p, None, True)
            except NotImplementedError:
                # The MLP from the fine ops, as the backbone composes it (`_mlp_fine`).
                layer.mlp_fine = True

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
                if kv.rows != start or (
                    blocks is not None and kv.blocks is not blocks and kv.blocks != blocks
                ):
                    _refuse("layers' KV caches at different positions")
                blocks = kv.blocks
        return list(blocks or [])

    # -- the op -----------------------------------------------------------------------------------
    def pass_op(self, tensors, p, tables):
        if self.pass_mode == "off":
            _refuse("whole passes are off (CLEF_TT_TRACE=0)")
        if CARRY_FORM != "kernel":
            # The conv's carry cut by slices at the pass's last row would take pad rows.
            _refuse("the conv carry cut by slices (CLEF_TT_GDN_CARRY=%s)" % CARRY_FORM)
        rows, final, layers = self._pass_layers(tensors, p)
        t = rows[0].rows
        if tables is None:
            _refuse("no rope tables")
        batch = p.get("batch")
        form = Form(t, batch, int(tables[0]) if batch else bucket_rows(t))
        self._bf16_only("pass")
        start = int(p.get("start", 0))
        if start % KV_BLOCK:
            _refuse("a start at %d, not a multiple of %d" % (start, KV_BLOCK))
        attention = [i for i, x in enumerate(layers) if x.kind == "attention"]
        if not attention:
            _refuse("no attention layer")
        states = [x.state for x in layers if x.kind == "delta_net"]
        form.fresh = all(s[0] is None for s in states)
        form.continuing = batch is not None and not form.fresh
        weights = tuple(id(w[1]) for x in layers for w in x.mixer + x.mlp) + (id(final[1]),)
        shape = (
            form.rows,
            form.rope_rows,
            int(tables[1]),
            None if batch is None else (form.count, tuple(form.keep), form.continuing),
            hash(weights),
        )
        fine = self.pass_checked.get(shape)
        if fine is None:
            h_meta = Meta(form.rows, rows[0].cols, self.n, BF16, TILE, ACTIVATION, REPLICATED)
            self._check_forms(layers, h_meta, int(tables[1]), form)
            fine = self.pass_checked[shape] = [x.mlp_fine for x in layers]
        for x, f in zip(layers, fine):
            x.mlp_fine = f
        first = layers[attention[0]].mixer_p
        kvh, d = int(first["kv_heads"]), int(first["head_dim"])
        if self.kv_shared is None:
            tokens = self.pass_kv_tokens
            self.kv_shared = SharedPools(-(-tokens // KV_BLOCK) + 1, kvh, d, round_up(d, 32))
        base = self._kv_in(layers, start)
        if bool(base) == form.fresh or (form.fresh and start):
            _refuse("KV and DeltaNet states of different starts")
        reach = start + (form.each if form.continuing else form.rows)
        form.width = max(32, 1 << (-(-reach // KV_BLOCK) - 1).bit_length())
        form.key = (
            form.rows,
            form.rope_rows,
            form.fresh,
            form.width,
            None if batch is None else (form.count, tuple(form.keep)),
            hash(weights),
        )
        return self._run_pass(form, rows, final, layers, tables, start, base, p)

    def _run_pass(self, form, rows, final, layers, tables, start, base, p):
        t = rows[0].rows
        if batch_rows_mismatch(form, tables, t):
            raise ValueError("pass: rope tables of %d rows for %d" % (int(tables[0]), t))
        shared = self.kv_shared
        for i in (i for i, x in enumerate(layers) if x.kind == "attention"):
            shared.pools(self, i)
        delta_inputs = self._prepare_states(form, layers, p)
        ctx = PassCtx(self, form)
        ctx.eps = float(p["eps"])
        ctx.plan(rows[0], tables, start, base, form.width)
        try:
            ctx.replaying = form.key in self.traces
            self.pass_writing = ctx
            try:
                held = self._write_rows(ctx, rows)
                ctx.write()
            finally:
                self.pass_writing = None
            self._execute(form, ctx, final, layers, delta_inputs)
            results = self._results(form, ctx, layers, start, t)
        except BaseException:
            # An unfinished write may still read the host buffers: the next pass gets new ones.
            self.pass_hosts = {}
            raise
        else:
            # The caller reads the rows next (a blocking read after the writes, on the same
            # command queue), before any upload or pass fills the buffers again.
            self.return_row_buffers([held])
            return results
        finally:
            ctx.release()

    def _prepare_states(self, form, layers, p):
        """The DeltaNet states the pass reads and writes, at fixed addresses: the states the
        caller still holds in the sets the pass writes kept (materialized), then the input
        state in the live buffers (restored there unless it is their current content). Returns
        each DeltaNet layer's inputs."""
        consumed = set()
        if p.get("consume"):
            consumed = {id(s[j][1]) for x in layers for s in [x.state] for j in (0, 1) if s[j]}
        in_place = {
            i
            for i, x in enumerate(layers)
            if x.kind == "delta_net"
            and all(
                isinstance(s[1], LiveState) and s[1].live is self.live and s[1].current()
                for s in x.state
                if s
            )
        }
        writes_live = form.batch is None or form.continuing
        if writes_live:
            self.live.before_overwrite(self, consumed)
        kept = [self.kept_set(form, i) for i, n in enumerate(form.keep) if n and form.batch]
        for s in kept:
            s.before_overwrite(self, consumed)
        inputs, restored = {}, False
        for i, x in enumerate(layers):
            if x.kind != "delta_net":
                continue
            spec = x.mixer_p
            nv, dk, dv = int(spec["value_heads"]), int(spec["key_dim"]), int(spec["value_dim"])
            channels = 2 * int(spec["key_heads"]) * dk + nv * dv
            for s in ([self.live] if writes_live else []) + kept:
                s.ensure(self, i, channels, nv * dk, dv)
            carry, state = x.state
            if carry is not None:
                if i not in in_place:
                    self.live.restore(self, i, carry[1].t, state[1].t)
                    restored = True
                inputs[i] = tuple(
                    (m, View(self.live.buffer(i, j), m.rows)) for j, (m, _) in enumerate(x.state)
                )
        if restored:
            # The live buffers hold another state now: no earlier handle stands for them.
            self.live.gen += 1
        return inputs

    def kept_set(self, form, block):
        """The state set a batched pass leaves the kept prefix of its block `block` in (one per
        block index, whatever the form: passes run one at a time, and a set's handles the
        caller still holds are copied out before the next pass writes it)."""
        return self.kept_sets.setdefault(block, StateSet())

    def _write_rows(self, ctx, rows):
        """The rows into the pass's input, from the host (outside any capture). Returns the
        host buffer they were written from."""
        ttnn = self.ttnn
        tb, t, hidden = ctx.form.rows, rows[0].rows, rows[0].cols
        held = rows[1].host_values()
        if held is not None and held.shape[2] >= tb:
            held = rows[1].take_host_values()
        else:
            # Rows an op already read (on the device): back to the host once.
            held = self.row_buffer((1, 1, tb, hidden))
            values = self.download_values(rows[0], rows[1], 0)
            if values.dtype == np.uint16:
                values = (values.astype(np.uint32) << 16).view(np.float32)
            held[0, 0, :t] = values.reshape(t, hidden)
            held[0, 0, t:] = 0.0
        whole = held if held.shape[2] == tb else held[:, :, :tb]
        self._write(ctx.rows_in, whole, ttnn.float32, ttnn.ROW_MAJOR_LAYOUT)
        return held

    def _results(self, form, ctx, layers, start, t):
        """The pass's ABI results: its rows, then the states it leaves."""
        shared = self.kv_shared
        results = [self.track(View(ctx.out, t))]
        if form.batch is None:
            self.live.gen += 1
            hold = Hold(shared, ctx.blocks)
            for i, x in enumerate(layers):
                if x.kind == "attention":
                    pools = shared.pools(self, i)
                    results += [self.track(KV(p, start + t, ctx.blocks, hold)) for p in pools]
                else:
                    results += [self.live.handle(self, i, j) for j in (0, 1)]
            return results
        kept = [(b, n) for b, n in enumerate(form.keep) if n]
        sets = [self.kept_set(form, b) for b, _ in kept]
        for s in sets:
            s.gen += 1
        holds = [Hold(shared, blocks) for blocks in ctx.kept_blocks]
        for i, x in enumerate(layers):
            for (_, n), s, hold in zip(kept, sets, holds):
                if x.kind == "attention":
                    pools = shared.pools(self, i)
                    results += [self.track(KV(p, n, hold.blocks, hold)) for p in pools]
                else:
                    results += [s.handle(self, i, j) for j in (0, 1)]
        return results

    def _execute(self, form, ctx, final, layers, delta_inputs):
        """The pass's ops: replayed, captured then replayed, or run eagerly (counted)."""
        key = form.key

        def body():
            return self._pass_body(form, ctx, final, layers, delta_inputs)

        trace = self.traces.get(key)
        if trace is None and self.pass_mode == "traced" and key not in self.pass_untraced:
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
        reason = (
            "tracing off"
            if self.pass_mode != "traced"
            else "untraceable"
            if key in self.pass_untraced
            else "warming"
        )
        eager = self.pass_counts["eager"]
        eager[reason] = eager.get(reason, 0) + 1
        body()

    def _pass_body(self, form, ctx, final, layers, delta_inputs):
        """The ops of the pass (what a trace holds): every layer, the final norm, the rows
        into the output."""
        ttnn = self.ttnn
        rows = form.rows
        h_meta = Meta(rows, ctx.rows_in.shape[-1], self.n, BF16, TILE, ACTIVATION, REPLICATED)
        half = ctx.rope_in[0].shape[-1] // 2
        tables = (form.rope_rows, half, None, None)
        kept = [self.kept_set(form, b) for b, n in enumerate(form.keep) if n and form.batch]
        self.pass_ctx = ctx
        try:
            tiles = self.to_tile(ctx.rows_in)
            h = (h_meta, View(self.typecast(tiles, self.act_dtype), rows))
            ctx.rope = tuple(self.typecast(self.to_tile(x), self.act_dtype) for x in ctx.rope_in)
            for i, x in enumerate(layers):
                ctx.layer = i
                if x.kind == "attention":
                    kv = x.state if form.continuing else (None, None)
                    out = self.attention_layer([h, *x.mixer, *kv], x.mixer_p, tables)
                else:
                    carry, state = delta_inputs.get(i, (None, None))
                    out = self.delta_layer([h, *x.mixer, carry, state], x.mixer_p, None)
                    # The states the pass leaves, into their sets' buffers.
                    sets = kept if form.batch else [self.live]
                    made = out[1:] if form.batch else out[1:3]
                    for s, pair in zip(sets, zip(made[0::2], made[1::2])):
                        for j, m in enumerate(pair):
                            self.tt.call("copy", ttnn.copy, m.t, s.buffer(i, j))
                h = (h_meta, out[0])
                if x.mlp_fine:
                    h = (h_meta, self._mlp_fine(h, x))
                else:
                    h = (h_meta, self.mlp_layer([h, *x.mlp], x.mlp_p, None)[0])
            hidden = h_meta.cols
            gamma = self.gamma(final[1], hidden, True)
            y = self.norm_groups(h[1].t, rows, hidden, hidden, ctx.eps, gamma)
            rm = self.tt.call(
                "to_layout", ttnn.to_layout, y, ttnn.ROW_MAJOR_LAYOUT, memory_config=self.dram
            )
            self.tt.call("copy", ttnn.copy, rm, ctx.out)
        finally:
            # Nothing made inside the pass outlives it (a capture's intermediates are freed
            # before it ends: trace.py).
            self.pass_ctx = None
            ctx.rope = None

    def _mlp_fine(self, h, layer):
        """An MLP sublayer from the fine ops, as src/backbone/layer.rs composes it where the
        MLP layer op refuses its shapes: post norm, gate|up, SwiGLU, down, its all-reduce and
        the residual add."""
        norm, gate_up, down = layer.mlp
        p, mh = layer.mlp_p, h[0]
        x = self.rms_norm(h, norm, mh.cols, float(p["eps"]), True)
        gu = self.linear((mh, x), gate_up, p["config"])
        width = gate_up[0].cols
        act = self.swiglu((mh._replace(cols=width), gu))
        out = self.linear((mh._replace(cols=width // 2), act), down, p["config"])
        if p["reduce"]:
            out = self.all_reduce((mh, out))
        return self.add(h, (mh, out))


def batch_rows_mismatch(form, tables, t):
    """Whether the rope tables do not cover the pass's rows (a solo pass's T, a batch's one
    block or all its rows)."""
    n = int(tables[0])
    if form.batch is None:
        return n != t
    return n not in (form.each, form.rows)
