"""Layer ops (a mesh mixin): a whole attention, DeltaNet or MLP sublayer of the text backbone in
one ABI call, its tensors kept in the layouts the next ttnn op reads.

The fine ABI ops (text_ops.py, attention.py, delta.py) hand every result over as a token-major
[1, 1, T, cols] tile, so each op converts in and out of the layout it needs (heads first for
attention, rank 3 for the delta rule, padded heads for per-head norms). A layer op runs the same
computation as src/backbone/ composes from the fine ops, but inside one call, so:
- attention: `nlp_create_qkv_heads` makes q|gate, k and v heads-first in one op from the fused
  projection (the interleaved q|gate heads are 2H heads of head_dim; a free reshape to
  [H, 2, T, d] and two slices part them); the q/k norms run on the heads (no 32-row padding of
  the 2 KV heads); rope is `rotary_embedding_hf` on the rotated channels of the heads; K and V
  go to the paged cache as they are; SDPA reads q as it is and its output is gated heads-first,
  then `nlp_concat_heads` feeds o_proj.
- DeltaNet: ttnn's native conv reads q|k|v in place from the fused in_proj output, and its
  three outputs are the delta rule's rank-3 inputs; its carry-returning form also writes the
  next chunk's history (CLEF_TT_GDN_CARRY=slices cuts it from the input instead); the gates
  come from the b|a columns through two small selection matmuls ([2nv, nv] 0/1 matrices, exact)
  with the sigmoid and the softplus(+dt_bias) fused, in f32; the delta rule's head-major output
  is normed per head as it is, `nlp_concat_heads` makes it token-major, and the SiLU(z) gate is a
  fused multiply.
- MLP: `experimental.minimal_matmul_split` writes gate and up as two tensors (no slices), the
  SiLU is fused into their product.
SDPA and the norms run at the profile's fidelity, at least HiFi2 (programs.sublayer: the port's
HiFi2 under `selected`); the gate selection stays HiFi4 (exact copies). Each ends with the
row-parallel projection, the all-reduce (reduce-scatter + all-gather, when
the plan asks for it) and the residual add: one ABI call per sublayer instead of 10-16.

A batched pass (params `batch`: {"requests": B, "lengths": [L_i]}) runs B requests as one: h
holds B blocks of `each` rows (each request's rows at the front of its block, zero rows after,
at least 3 of them: each = t / B, a multiple of 32), every row-wise op runs once over all t
rows, and the mixers run over a batch of B (fresh requests first; continuations below):
- attention: `nlp_create_qkv_heads` on [B, 1, each, cols] gives heads [B, H, each, d]; the rope
  tables are one request's positions 0..each-1, broadcast over the batch; causal SDPA
  (`transformer.scaled_dot_product_attention`, is_causal) per batch element, so a request's
  queries see only its own keys and never the pad rows after them. With media the blocks have
  positions of their own (M-RoPE) and the tables hold all t rows; `rotary_embedding_hf` takes
  tables of batch 1 only, so the heads are made and roped over the t rows as one sequence
  ([1, H, t, d]) and q, k and v are permuted into blocks [B, H, each, d] for SDPA, its output
  back (4 permutes per attention layer, 64 per Clef 27B pass);
- DeltaNet: the native conv runs over the t rows as one sequence (it takes no batch); the
  normed input is multiplied by a row mask (1 on a request's rows, 0 on pads), so every block's
  last 3 rows are zeros after the projection and the next request's conv starts from a zero
  history, as a fresh request does; the delta rule runs batched ([B, each, width], a zero
  [B, nv, dk, dv] state: each request's own, no chunk crossing a block; the op needs B x nv <=
  cores, so B <= 4 for Clef 27B's 24 value heads per device); pad rows after a request change
  nothing before them.
It returns the residual stream (the caller reads each request's rows from its block) and, for
each block with a kept prefix (`batch["keep"][i]` rows, a multiple of 32: a prefix-cache miss
whose state at the prefix's end is stored), that prefix's state:
- attention: the first keep rows of the block's k and v heads (slices, appended to fresh KV);
- DeltaNet: the conv carry of the prefix's last rows (the fused input's rows before the prefix
  end) and the recurrent state at the prefix's end, from a second delta-rule call over the same
  batch whose g and beta are multiplied by a keep mask (0 after the prefix: decay 1, no update,
  so the final state is the state at the prefix end; 2 multiplies and one delta-rule call more
  per DeltaNet layer, only in a pass that keeps a prefix).
One extra device op per DeltaNet layer (the row mask) against the solo pass otherwise.
Given a cache and state (keys and values, conv carry and recurrent state: hits of one
prefix-cache slot), every block continues it, at one block's positions from the cache's end:
- attention: each block's keys and values are appended to the cache as a handle of its own
  (the cached pool blocks shared, its rows in fresh ones), and chunked SDPA reads the pool
  through one page-table row per block (chunk_start_idx: the cache's rows, one for all);
- DeltaNet: the first block's conv reads the carry as its history; the carry is added into
  the 3 zeroed pad rows before every other block (tiles: an exact sum), so each block's conv
  starts from it; the delta rule starts every block from the state (B copies).
A continuing pass keeps nothing (no `keep`).

A layer op takes only the forms it was written for: bf16 activations and KV, tile-aligned head
dims and split points, the native conv's shapes, the rope widths `rotary_embedding_hf` takes,
one delta-rule call. Anything else raises NotImplementedError before any ttnn call, and the
caller composes the fine ops instead (the tiny fixture's head_dim 32 / rotary 8, the f32
profile).
"""

import functools
import json

import numpy as np

from .delta import CARRY_FORM, DELTA_PIECE, NATIVE_CONV_TAPS
from .meta import KV_BLOCK, TILE_SIZE, f32, round_up
from .programs import kernel_config, precise, sdpa_chunks, sdpa_program, sublayer

# Zero rows a batched pass leaves after each request (at least the conv's history, so the next
# request's conv starts from zeros).
BATCH_PAD_ROWS = NATIVE_CONV_TAPS - 1


@functools.lru_cache(maxsize=256)
def _parsed(text):
    """A layer op's parameters from their JSON text, parsed once per distinct text (a chunk
    passes the same few texts to its 64 layers). The ops only read them."""
    return json.loads(text)


def _refuse(op, why):
    raise NotImplementedError("%s layer op: %s (the fine ops compose it)" % (op, why))


class LayerOps:
    """attention_layer, delta_layer, mlp_layer and their entry `layer_op` (mesh mixin)."""

    def layer_op(self, name, tensors, params, tables):
        """The ABI's layer entry: `tensors` in the op's order ((meta, obj) pairs, None for an
        absent one), `params` a dict or its JSON text (as the bridge passes it), `tables` the
        rope tables (or None). Returns the results."""
        op = {
            "attention": self.attention_layer,
            "delta_net": self.delta_layer,
            "mlp": self.mlp_layer,
            "pass": self.pass_op,
        }.get(name)
        if op is None:
            _refuse(name, "no such layer op")
        if isinstance(params, str):
            params = _parsed(params)
        # Intermediates go with their Python objects (ttnn frees a device buffer with its last
        # tensor): a sublayer's peak is its few intermediates (under 100 MB per device for
        # Clef 27B at 1,024 tokens), and a deallocate call per tensor (a third of the ttnn
        # calls) is saved.
        self.deferred_frees = True
        try:
            return op(tensors, params, tables)
        finally:
            self.deferred_frees = False

    # -- shared -----------------------------------------------------------------------------------
    def _bf16_only(self, op):
        if self.act_dtype != self.ttnn.bfloat16 or self.kv_dtype() != self.ttnn.bfloat16:
            _refuse(op, "activations or KV not bf16")

    def _input_norm(self, h, w, eps, config):
        """The sublayer's zero-centred input rms_norm (gamma 1 + w) of the residual stream."""
        mh, ho = h
        gamma = self.gamma(w[1], mh.cols, True)
        return self.norm_groups(
            ho.t, mh.rows, mh.cols, mh.cols, eps, gamma, sublayer(self.ttnn, config)
        )

    def _residual(self, h, partial, reduce):
        """h + the all-reduce of the row-parallel projection's partial sums (or the sums as
        they are, when the plan needs no collective)."""
        total = self.reduced(partial) if reduce else partial
        out = self.binary("add", self.ttnn.add, h[1].t, total)
        self.drop(*[t for t in (partial, total) if t is not out])
        return out

    def _batch(self, op, p, t, fresh):
        """A batched pass's (requests, rows per request block, lengths, kept prefix rows,
        continuing), or None for an ordinary one. `fresh`: whether the op was given no cache or
        carried state; given one, every block continues it (`continuing`)."""
        batch = p.get("batch")
        if not batch:
            return None
        count, lengths = int(batch["requests"]), [int(n) for n in batch["lengths"]]
        if count < 1 or len(lengths) != count or t % count:
            _refuse(
                op, "a batch of %d requests, %d lengths over %d rows" % (count, len(lengths), t)
            )
        each = t // count
        if each % TILE_SIZE or any(n < 1 or n + BATCH_PAD_ROWS > each for n in lengths):
            _refuse(op, "blocks of %d rows for requests of %s rows" % (each, lengths))
        keep = [int(n) for n in batch.get("keep") or [0] * count]
        if len(keep) != count or any(
            n < 0 or n > m or n % TILE_SIZE for n, m in zip(keep, lengths)
        ):
            _refuse(op, "prefixes of %s rows kept of requests of %s rows" % (keep, lengths))
        if not fresh and any(keep):
            _refuse(op, "a batched pass continuing a state and keeping prefixes")
        return count, each, lengths, keep, not fresh

    def _row_mask(self, each, lengths):
        """[1, 1, t, 1] bf16: 1 on the requests' rows, 0 on the pad rows after them (made once
        per form of batch; in a pass, passes.py, the pass's input)."""
        if self.pass_ctx is not None and self.pass_ctx.row_mask is not None:
            return self.pass_ctx.row_mask

        def make():
            mask = np.zeros((len(lengths), each), np.float32)
            for i, n in enumerate(lengths):
                mask[i, :n] = 1.0
            return self.host_rows(
                [mask.reshape(1, 1, -1, 1)], self.ttnn.bfloat16, self.ttnn.TILE_LAYOUT
            )

        return self.internal_once(("batch_row_mask", each, tuple(lengths)), make)

    def _keep_mask(self, each, width, keep):
        """[B, each, width] f32: 1 on the rows of each block's kept prefix, 0 after it (and on a
        block that keeps none), made once per form of batch."""

        def make():
            mask = np.zeros((len(keep), each, width), np.float32)
            for i, n in enumerate(keep):
                mask[i, :n] = 1.0
            return self.host_rows([mask], self.ttnn.float32, self.ttnn.TILE_LAYOUT)

        return self.internal_once(("batch_keep_mask", each, width, tuple(keep)), make)

    # -- attention --------------------------------------------------------------------------------
    def attention_layer(self, tensors, p, tables, check=False):
        """tensors: h, input norm, qkv|gate, q_norm, k_norm, o_proj, keys cache, values cache.
        Returns the new residual stream, keys and values (a batched pass: the stream, then keys and
        values per kept prefix; in a pass, passes.py: the stream, None, None). `check`: only
        refuse a form the op does not take (NotImplementedError), run nothing."""
        h, norm, qkv, qn, kn, o_proj, ck, cv = tensors
        heads, kvh, d = int(p["heads"]), int(p["kv_heads"]), int(p["head_dim"])
        self._bf16_only("attention")
        rot = 2 * int(tables[1]) if tables is not None else 0
        t = h[0].rows
        if (ck is None) != (cv is None):
            _refuse("attention", "a keys cache without values, or values without keys")
        batch = self._batch("attention", p, t, ck is None)
        count, each = (batch[0], batch[1]) if batch else (1, t)
        # Every block's own positions (media): the heads are made and roped over all t rows,
        # then split into blocks for SDPA.
        own = batch is not None and count > 1 and tables is not None and int(tables[0]) == t
        if tables is None or int(tables[0]) != (t if own else each):
            _refuse(
                "attention",
                "rope tables of %s rows for %d" % (None if tables is None else tables[0], t),
            )
        hb, he = (1, t) if own else (count, each)
        if d % TILE_SIZE or not (rot == 32 or (rot and rot % 64 == 0)) or rot > d:
            _refuse("attention", "head_dim %d, rotary %d" % (d, rot))
        if kvh <= 0 or heads % kvh or qkv[0].cols != (2 * heads + 2 * kvh) * d:
            _refuse(
                "attention",
                "qkv %d columns for %d heads, %d kv heads x %d" % (qkv[0].cols, heads, kvh, d),
            )
        if check:
            return None
        caches = [None if c is None else self.as_kv(c, kvh) for c in (ck, cv)]
        ttnn, call, dram = self.ttnn, self.tt.call, self.dram
        config = p["config"]
        x = self._input_norm(h, norm, float(p["eps"]), config)
        fused = self.matmul(x, t, qkv, config)
        self.drop(x)
        blocks = self.reshape(fused, (hb, 1, he, qkv[0].cols))
        # q|gate interleaved per head: 2H heads of d, then the KV heads.
        qg, k, v = call(
            "experimental.nlp_create_qkv_heads",
            ttnn.experimental.nlp_create_qkv_heads,
            blocks,
            num_heads=2 * heads,
            num_kv_heads=kvh,
            transpose_k_heads=False,
            memory_config=dram,
        )
        self.drop(fused, blocks)
        q, gate = self.query_gate_heads(qg, hb, heads, he, d)
        normed = []
        for x_, w_ in ((q, qn), (k, kn)):
            gamma = self.gamma(w_[1], d, True)
            y = call(
                "rms_norm",
                ttnn.rms_norm,
                x_,
                epsilon=f32(float(p["eps"])),
                weight=gamma,
                compute_kernel_config=sublayer(ttnn, config),
                memory_config=dram,
            )
            self.drop(x_)
            normed.append(self.rope_heads(y, tables, rot, d))
            self.drop(y)
        q, k = normed
        if batch:
            if own:
                q, k, v = [self._to_blocks(x, count) for x in (q, k, v)]
            if batch[4]:
                kept = []
                o = self._continued_attention(q, k, v, caches, kvh, d, sublayer(ttnn, config))
            else:
                kept = self._kept_kv(k, v, batch[3], kvh, d)
                o = self._batched_attention(q, k, v, d, sublayer(ttnn, config))
            self.drop(k, v)
            for c in caches:
                if c is not None and c[1]:
                    c[0].release(ttnn)
            if own:
                o = self._from_blocks(o)
        elif self.pass_ctx is not None:
            # A pass (passes.py): K and V into the passes' pools through the pass's page table,
            # SDPA from its start tensor; its KV handles are made by the pass.
            o = self.pass_ctx.attend(self, q, k, v, d, sublayer(ttnn, config))
            keys = values = None
        else:
            keys, values = [
                self.append_heads(None if c is None else c[0], new, kvh, d)
                for c, new in zip(caches, (k, v))
            ]
            for c in caches:
                if c is not None and c[1]:
                    c[0].release(ttnn)
            o = self.paged_attention(q, keys, values, d, sublayer(ttnn, config))
        self.drop(q)
        gated = self.binary(
            "multiply", ttnn.multiply, o, gate, input_tensor_b_activations=[self.unary("SIGMOID")]
        )
        self.drop(o, gate)
        flat = self.reshape(self.heads_last(gated), (1, 1, t, heads * d))
        self.drop(gated)
        out = self.matmul(flat, t, o_proj, config)
        self.drop(flat)
        new_h = self.wrap(self._residual(h, out, bool(p["reduce"])))
        return [new_h, *kept] if batch else [new_h, keys, values]

    def query_gate_heads(self, qg, hb, heads, he, d):
        """The queries and the output gates, [hb, heads, he, d] each, out of the 2 * heads
        heads `nlp_create_qkv_heads` made of the fused projection (q|gate interleaved per
        head: head 2j is query j, head 2j + 1 its gate); `qg` is dropped."""
        bh = hb * heads
        pairs = self.reshape(qg, (bh, 2, he, d))
        q = self.reshape(self.slice(pairs, (0, 0, 0, 0), (bh, 1, he, d)), (hb, heads, he, d))
        gate = self.reshape(self.slice(pairs, (0, 1, 0, 0), (bh, 2, he, d)), (hb, heads, he, d))
        self.drop(qg, pairs)
        return q, gate

    def _kept_kv(self, k, v, keep, kvh, d):
        """The keys and values of each block's kept prefix (its first `keep[i]` rows, heads of
        [B, kvh, each, d]) as KV handles, a block's keys then its values: what the block's
        prefix alone appends to an empty cache. In a pass (passes.py) they go to the blocks the
        pass planned, and the pass makes the handles."""
        if self.pass_ctx is not None:
            self.pass_ctx.keep_kv(self, k, v, keep, kvh, d)
            return []
        kept = []
        for i, n in enumerate(keep):
            for x in (k, v) if n else ():
                rows = self.slice(x, (i, 0, 0, 0), (i + 1, kvh, n, d))
                kept.append(self.append_heads(None, rows, kvh, d))
        return kept

    def _continued_attention(self, q, k, v, caches, kvh, d, ckc):
        """Causal SDPA over a batch of blocks that all continue the same cached keys and values
        (hits of one prefix-cache slot): each block's keys and values [B, kvh, each, d] are
        appended to the cache as a handle of its own (the cached blocks shared, its rows in
        fresh pool blocks: kv_cache.py), and chunked SDPA reads the pool through one page-table
        row per block, every block's queries from the cache's end. The handles are released
        after: a hit keeps nothing. In a pass (passes.py), through the blocks and tables the
        pass planned."""
        if self.pass_ctx is not None:
            return self.pass_ctx.continued(self, q, k, v, kvh, d, ckc)
        (kc, _), (vc, _) = caches
        count, _, each, _ = self.shape(q)
        start = kc.rows
        if start % TILE_SIZE or vc.rows != start:
            _refuse("attention", "a batch continuing %d cached rows" % start)
        handles = []
        for i in range(count):
            rows = [self.slice(x, (i, 0, 0, 0), (i + 1, kvh, each, d)) for x in (k, v)]
            handles.append([self.append_heads(c, r, kvh, d) for c, r in zip((kc, vc), rows)])
        q_chunk, _ = sdpa_chunks(each, start)
        needed = (start + round_up(each, q_chunk) + KV_BLOCK - 1) // KV_BLOCK
        for hk, hv in handles:
            if hk.blocks != hv.blocks:
                raise ValueError("attention: a block's keys and values in different pool blocks")
        table = self.page_rows([hk.blocks[:needed] for hk, _ in handles], round_up(needed, 32))
        o = self.chunked_sdpa(q, *handles[0], table, start, d, ckc)
        self.drop(table)
        for pair in handles:
            for h in pair:
                h.release(self.ttnn)
        return o

    def _to_blocks(self, x, count):
        """Heads of all rows [1, h, t, d] -> a batch of blocks [count, h, t / count, d]."""
        _, h, t, d = self.shape(x)
        out = self.permute(self.reshape(x, (h, count, t // count, d)), (1, 0, 2, 3))
        self.drop(x)
        return out

    def _from_blocks(self, x):
        """A batch of blocks [count, h, each, d] -> heads of all rows [1, h, count * each, d]."""
        count, h, each, d = self.shape(x)
        out = self.reshape(self.permute(x, (1, 0, 2, 3)), (1, h, count * each, d))
        self.drop(x)
        return out

    def _batched_attention(self, q, k, v, d, ckc):
        """Causal SDPA over a batch: q [B, H, each, d], k and v [B, kv heads, each, d], each
        batch element its own sequence from position 0 (the pad rows after a request come
        after its queries, so causality keeps them out)."""
        each = self.shape(q)[2]
        q_chunk, k_chunk = sdpa_chunks(each, 0)
        return self.tt.call(
            "transformer.scaled_dot_product_attention",
            self.ttnn.transformer.scaled_dot_product_attention,
            q,
            k,
            v,
            is_causal=True,
            scale=f32(d**-0.5),
            program_config=sdpa_program(self.ttnn, self.grid, q_chunk, k_chunk),
            compute_kernel_config=ckc,
            memory_config=self.dram,
        )

    # -- Gated DeltaNet ---------------------------------------------------------------------------
    def _gate_selection(self, nv, which):
        """[2nv, nv] bf16 0/1 matrix picking b (which 0) or a (which 1) out of the b|a columns."""

        def make():
            s = np.zeros((2 * nv, nv), np.float32)
            s[which * nv + np.arange(nv), np.arange(nv)] = 1.0
            return self.host_rows(
                [s.reshape(1, 1, 2 * nv, nv)], self.ttnn.bfloat16, self.ttnn.TILE_LAYOUT
            )

        return self.internal_once(("gate_selection", nv, which), make)

    def delta_layer(self, tensors, p, tables, check=False):
        """tensors: h, input norm, in_proj, conv, A_log, dt_bias, gated norm, out_proj, conv
        carry, recurrent state. Returns the new residual stream, conv carry and state (a
        batched pass: the stream, then conv carry and state per kept prefix). `check`: only
        refuse a form the op does not take, run nothing."""
        h, norm, in_proj, conv, a_log, dt_bias, gnorm, out_proj, carry, state = tensors
        nk, nv = int(p["key_heads"]), int(p["value_heads"])
        dk, dv = int(p["key_dim"]), int(p["value_dim"])
        kernel = int(p["conv_kernel"])
        self._bf16_only("delta_net")
        t = h[0].rows
        if (carry is None) != (state is None):
            _refuse("delta_net", "a conv carry without a recurrent state, or a state without one")
        batch = self._batch("delta_net", p, t, carry is None)
        count, each = (batch[0], batch[1]) if batch else (1, round_up(t, TILE_SIZE))
        kd, vd = nk * dk, nv * dv
        ch = 2 * kd + vd
        tp = round_up(t, TILE_SIZE)
        if (
            kernel != NATIVE_CONV_TAPS
            or dk != dv
            or dk % TILE_SIZE
            or vd % TILE_SIZE
            or t < NATIVE_CONV_TAPS - 1
            or each > DELTA_PIECE
            or nk <= 0
            or nv % nk
        ):
            _refuse(
                "delta_net",
                "%d rows, kernel %d, %d key heads x %d, %d value heads x %d"
                % (t, kernel, nk, dk, nv, dv),
            )
        if in_proj[0].cols != ch + vd + 2 * nv:
            _refuse("delta_net", "in_proj of %d columns" % in_proj[0].cols)
        if check:
            return None
        ttnn, call, dram, fp32 = self.ttnn, self.tt.call, self.dram, self.ttnn.float32
        config = p["config"]
        x = self._input_norm(h, norm, float(p["eps"]), config)
        if batch:
            # Zero pad rows: the conv runs over all blocks as one sequence, and each request's
            # must start from a zero history, the previous block's last rows.
            masked = self.binary("multiply", ttnn.multiply, x, self._row_mask(each, batch[2]))
            self.drop(x)
            x = masked
        fused = self.matmul(x, t, in_proj, config)
        self.drop(x)
        if batch and batch[4]:
            # Every block continues the carry: the first from the conv's history input, the
            # others from the carry placed in the 3 pad rows before them.
            placed = self._placed_history(fused, carry, count, each, ch)
            q, k, v = self.conv_parts(placed, t, conv, carry, (kd, kd, vd))
            self.drop(placed)
            new_carry, kept_carries = None, []
        elif batch:
            q, k, v = self.conv_parts(fused, t, conv, None, (kd, kd, vd))
            new_carry = None
            # A kept prefix's conv history: the 3 rows before its end, as a pass of that
            # prefix alone would carry them.
            kept_carries = [
                self.conv_carry(fused, i * each + n, ch) for i, n in enumerate(batch[3]) if n
            ]
        elif CARRY_FORM == "slices":
            q, k, v = self.conv_parts(fused, t, conv, carry, (kd, kd, vd))
            new_carry = self.conv_carry(fused, t, ch)
        else:
            q, k, v, new_carry = self.conv_parts(
                fused, t, conv, carry, (kd, kd, vd), with_carry=True
            )
        # The gates in f32 from the b|a columns: beta = sigmoid(b),
        # g = -exp(A_log) * softplus(a + dt_bias) (the port's GDN_GATE_FP32).
        ba = self.cols(fused, ch + vd, ch + vd + 2 * nv)
        exact = precise(ttnn)
        # Small blocks: ttnn's default config for this [T, 2nv] x [2nv, nv] product takes
        # 1.3 MiB of L1 per core (graph capture), these 90 KiB.
        small = ttnn._ttnn.operations.experimental.MinimalMatmulConfig(
            M_block_size=4,
            K_block_size=1,
            N_block_size=1,
            subblock_h=1,
            subblock_w=1,
            compute_with_storage_grid_size=ttnn.CoreCoord(*self.grid),
        )
        beta = call(
            "experimental.minimal_matmul",
            ttnn.experimental.minimal_matmul,
            ba,
            self._gate_selection(nv, 0),
            fused_activation=self.unary("SIGMOID"),
            dtype=fp32,
            config=small,
            compute_kernel_config=exact,
            memory_config=dram,
        )
        sp = call(
            "experimental.minimal_matmul",
            ttnn.experimental.minimal_matmul,
            ba,
            self._gate_selection(nv, 1),
            bias_tensor=self.row_of(dt_bias[1], "row_f32", fp32),
            fused_activation=self.unary("SOFTPLUS", 1.0, 20.0),
            dtype=fp32,
            config=small,
            compute_kernel_config=exact,
            memory_config=dram,
        )
        self.drop(ba)
        g = self.binary(
            "multiply",
            ttnn.multiply,
            sp,
            self.row_of(a_log[1], "neg_exp_f32", fp32, lambda w: -np.exp(w)),
        )
        self.drop(sp)
        if self.pass_ctx is not None and self.pass_ctx.mask is not None:
            # A solo pass's pad rows (passes.py) leave the state as it is: g = 0, beta = 0.
            g, beta = self.pass_ctx.masked_gates(self, g, beta)
        gates = [self.reshape(self.pad_end(a, 2, tp), (count, each, nv)) for a in (g, beta)]
        if batch:
            q, k, v = [self.reshape(a, (count, each, self.shape(a)[-1])) for a in (q, k, v)]
        if state is not None:
            s = self.reshape(self.typecast(state[1].t, fp32), (1, nv, dk, dv))
            if count > 1:
                # Every block starts from the same state.
                one = s
                s = self.concat([one] * count, 0)
                if one is not state[1].t:
                    self.drop(one)
        else:
            # A zero state made once (without one the op uploads zeros from the host per call).
            s = self.internal_once(
                ("delta_zero_state", count, nv, dk, dv),
                lambda: self.host_rows(
                    [np.zeros((count, nv, dk, dv), np.float32)], fp32, ttnn.TILE_LAYOUT
                ),
            )
        o, s_next = self.chunk_delta_rule(q, k, v, gates[0], gates[1], dk**-0.5, s)
        kept_states = self._kept_states(q, k, v, gates, s, batch[3], dk) if batch else []
        self.drop(q, k, v, g, beta, *gates)
        if state is not None and s is not state[1].t:
            self.drop(s)
        heads = self.reshape(o, (count, nv, each, dv))
        y = call(
            "rms_norm",
            ttnn.rms_norm,
            heads,
            epsilon=f32(float(p["eps"])),
            weight=self.gamma(gnorm[1], dv, False),
            compute_kernel_config=sublayer(ttnn, config),
            memory_config=dram,
        )
        self.drop(o, heads)
        flat = self.rows(self.reshape(self.heads_last(y), (1, 1, count * each, vd)), 0, t)
        self.drop(y)
        z = self.cols(fused, ch, ch + vd)
        gated = self.binary(
            "multiply",
            ttnn.multiply,
            flat,
            z,
            input_tensor_b_activations=[self.unary("SILU")],
            dtype=self.act_dtype,
        )
        self.drop(flat, z, fused)
        out = self.matmul(gated, t, out_proj, config)
        self.drop(gated)
        new_h = self.wrap(self._residual(h, out, bool(p["reduce"])))
        if batch:
            # Each block's final state is the state after its pad rows: not kept.
            self.drop(s_next)
            pairs = zip(kept_carries, kept_states)
            return [new_h] + [self.wrap(x) for pair in pairs for x in pair]
        s_out = self.reshape(s_next, (1, 1, nv * dk, dv))
        return [
            new_h,
            self.wrap(new_carry),
            self.wrap(s_out),
        ]

    def _placed_history(self, fused, carry, count, each, ch):
        """The conv channels of `fused` ([1, 1, count * each, >= ch]) with the conv history
        `carry` (3 rows) added into the last 3 rows of every block but the last: pad rows,
        zeros there (the row mask), so the next block's conv reads the carry as its history.
        Made from tiles: the carry's 3 rows at the end of one zero tile, between zero blocks
        (constants made once per form), so the sum is exact."""
        ttnn, keep = self.ttnn, NATIVE_CONV_TAPS - 1
        hist, made = self._conv_history(carry, ch)
        lead = self.internal_once(
            ("batch_history_lead", ch),
            lambda: self.host_rows(
                [np.zeros((1, 1, TILE_SIZE - keep, ch), np.float32)],
                ttnn.bfloat16,
                ttnn.ROW_MAJOR_LAYOUT,
            ),
        )
        h4 = self.reshape(hist, (1, 1, keep, ch))
        rows = self.concat([lead, h4], 2)
        tile = self.tt.call(
            "to_layout", ttnn.to_layout, rows, ttnn.TILE_LAYOUT, memory_config=self.dram
        )
        gap = each - TILE_SIZE
        zeros = (
            self.internal_once(
                ("batch_history_gap", gap, ch),
                lambda: self.host_rows(
                    [np.zeros((1, 1, gap, ch), np.float32)], ttnn.bfloat16, ttnn.TILE_LAYOUT
                ),
            )
            if gap
            else None
        )
        last = self.internal_once(
            ("batch_history_last", each, ch),
            lambda: self.host_rows(
                [np.zeros((1, 1, each, ch), np.float32)], ttnn.bfloat16, ttnn.TILE_LAYOUT
            ),
        )
        parts = ([zeros] if gap else []) + [tile]
        placement = self.concat(parts * (count - 1) + [last], 2)
        x = self.cols(fused, 0, ch)
        out = self.binary("add", ttnn.add, x, placement)
        self.drop(*made, *[h4] * (h4 is not hist), rows, tile, placement, x)
        return out

    def _kept_states(self, q, k, v, gates, s, keep, dk):
        """Each kept prefix's recurrent state at its end, [1, 1, nv * dk, dv] f32: a second
        delta-rule call over the batch with both gates 0 after every prefix (decay exp(0) = 1,
        beta 0: no update), so each block's final state is the state at its prefix's end. The
        outputs of this call are not used."""
        if not any(keep):
            return []
        count, each, nv = self.shape(gates[0])
        mask = self._keep_mask(each, nv, keep)
        g, beta = [self.binary("multiply", self.ttnn.multiply, a, mask) for a in gates]
        o, s_kept = self.chunk_delta_rule(q, k, v, g, beta, dk**-0.5, s)
        self.drop(o, g, beta)
        _, _, _, dv = self.shape(s_kept)
        states = [
            self.reshape(self.slice(s_kept, (i, 0, 0, 0), (i + 1, nv, dk, dv)), (1, 1, nv * dk, dv))
            for i, n in enumerate(keep)
            if n
        ]
        self.drop(s_kept)
        return states

    # -- MLP --------------------------------------------------------------------------------------
    def mlp_layer(self, tensors, p, tables, check=False):
        """tensors: h, post-attention norm, gate|up, down. Returns the new residual stream.
        `check`: only refuse a form the op does not take, run nothing."""
        h, norm, gate_up, down = tensors
        self._bf16_only("mlp")
        half = gate_up[0].cols // 2
        if gate_up[0].cols % 2 or half % TILE_SIZE or down[0].rows != half:
            _refuse(
                "mlp", "gate|up of %d columns, down of %d rows" % (gate_up[0].cols, down[0].rows)
            )
        if check:
            return None
        ttnn, call, config = self.ttnn, self.tt.call, p["config"]
        t = h[0].rows
        x = self._input_norm(h, norm, float(p["eps"]), config)
        ckc = kernel_config(
            ttnn,
            int(config.get("fidelity", 0)),
            config.get("fp32_dest_acc", 1),
            config.get("packer_l1_acc", 0),
        )
        gate, up = call(
            "experimental.minimal_matmul_split",
            ttnn.experimental.minimal_matmul_split,
            x,
            gate_up[1].t,
            chunks=2,
            compute_kernel_config=ckc,
            dtype=self.act_dtype,
            memory_config=self.dram,
        )
        self.drop(x)
        act = self.binary(
            "multiply", ttnn.multiply, gate, up, input_tensor_a_activations=[self.unary("SILU")]
        )
        self.drop(gate, up)
        out = self.matmul(act, t, down, config)
        self.drop(act)
        return [self.wrap(self._residual(h, out, bool(p["reduce"])))]
