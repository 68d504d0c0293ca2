"""One pass's plan (passes.py): its persistent device inputs, its KV blocks, the host's writes
before it runs, and the hooks the layer ops call while it runs (layers.py, delta.py,
text_ops.py read `mesh.pass_ctx`).

Forms:
- solo: one request's chunk of T rows in a bucket of TB. Its K and V go to blocks of the shared
  pools through the fill page table (pad rows to the trash block), SDPA reads the sequence's
  blocks through the read table from the start tensor; the DeltaNet gates are 0 on the pad
  rows (the row mask), and the conv takes its carry at row T (`actual_end`).
- batch: B requests in blocks of `each` rows (layers.py's batched layer ops), fresh or all
  continuing one prefix-cache slot. The row mask (1 on each request's rows) is an input. A
  fresh batch keeping prefixes writes each kept prefix's K and V to blocks of its own (a fill
  table per kept block); a continuing batch writes each block's K and V after the slot's blocks
  (a fill table per block) and SDPA reads them through one read-table row per block, from the
  slot's end (the start tensor). Those continuing blocks are freed after the pass (a hit keeps
  nothing).

Every input is a persistent tensor of the mesh (`Mesh.pass_tensor`: allocated on first use,
before any capture of a form that reads it), named by what it holds and its shape, and written
from the host before every run of the pass, never inside a capture.
"""

import numpy as np

from .meta import KV_BLOCK, f32
from .programs import sdpa_chunks, sdpa_program


def _blocks(rows):
    return -(-rows // KV_BLOCK)


class PassCtx:
    """One pass's inputs, its KV plan, and the hooks the layer ops call in a pass."""

    def __init__(self, mesh, form):
        self.mesh, self.form = mesh, form
        self.layer, self.eps = 0, 0.0
        # Whether the pass replays a trace (only the golden-shadow mutations ask).
        self.replaying = False
        # The rope tables: the inputs, and the tiles the pass makes of them (rope_heads reads).
        self.rope_in = self.rope = None
        self.mask = self.row_mask = self.actual_end = None
        self.fill = self.read = self.start_t = None
        self.kept_fills, self.cont_fills = [], []
        # Blocks of the shared pools the pass writes: per kept prefix (kept), per continuing
        # block (freed after), or the solo pass's.
        self.kept_blocks, self.cont_blocks, self.new, self.blocks = [], [], [], []
        self.writes = []

    # -- the plan ---------------------------------------------------------------------------------
    def plan(self, rows_meta, tables, start, base, width):
        """Allocate (first use) and fill in the host values of every input; take the blocks."""
        mesh, form, ttnn = self.mesh, self.form, self.mesh.ttnn
        get, rm, tile = mesh.pass_tensor, ttnn.ROW_MAJOR_LAYOUT, ttnn.TILE_LAYOUT
        shared = mesh.kv_shared
        tb, hidden = form.rows, rows_meta.cols
        # The rows as the host holds them (f32 ROW_MAJOR: no conversion on the host); the
        # pass's first two ops make them bf16 tiles.
        self.rows_in = get("rows", (1, 1, tb, hidden), ttnn.float32, rm)
        self.out = get("out", (1, 1, tb, hidden), ttnn.bfloat16, rm)
        n, half = int(tables[0]), int(tables[1])
        # The rope tables as the core computed them (f32 rows; the pass makes them tiles).
        self.rope_in = tuple(
            get(name, (1, 1, form.rope_rows, 2 * half), ttnn.float32, rm) for name in "cs"
        )
        for name, dev, raw in zip("cs", self.rope_in, (tables[2], tables[3])):
            a = np.frombuffer(raw, dtype=np.float32).reshape(n, half)
            full = self._staged(name, dev, ttnn.float32)
            full[0, 0, :n, :half] = a
            full[0, 0, :n, half:] = a
            full[0, 0, n:] = 0.0
        self.start_t = get("start", (1,), ttnn.int32, rm)
        self._staged("start", self.start_t, ttnn.int32)[0] = start
        if form.batch is None:
            self._plan_solo(rows_meta.rows, base, width)
        elif form.continuing:
            self._plan_continuing(base, width)
        else:
            self._plan_kept()
        if form.batch is not None:
            mask = np.zeros((form.count, form.each), np.float32)
            for i, length in enumerate(form.lengths):
                mask[i, :length] = 1.0
            self.row_mask = get("batch_row_mask", (1, 1, tb, 1), ttnn.bfloat16, tile)
            self.writes.append((self.row_mask, mask.reshape(1, 1, tb, 1), ttnn.bfloat16, tile))
        for blocks in self.kept_blocks + self.cont_blocks + [self.new]:
            shared.hold(blocks)

    def _staged(self, name, dev, dtype):
        """The host buffer of persistent input `dev` (ROW_MAJOR, `dtype`), written to it before
        the pass runs; the caller fills it."""
        host = self.mesh.pass_host(name, tuple(dev.shape), dtype)
        self.writes.append((dev, host, dtype, self.mesh.ttnn.ROW_MAJOR_LAYOUT))
        return host

    def _table(self, name, ids, shape):
        ttnn = self.mesh.ttnn
        t = self.mesh.pass_tensor(name, shape, ttnn.int32, ttnn.ROW_MAJOR_LAYOUT)
        self._staged(name, t, ttnn.int32)[...] = np.asarray(ids, np.int32).reshape(shape)
        return t

    def _take(self, rows, first_row=0):
        """Blocks for `rows` rows, their filled rows noted."""
        shared = self.mesh.kv_shared
        blocks = shared.take(self.mesh, _blocks(rows))
        for j, b in enumerate(blocks):
            shared.filled[b] = min(KV_BLOCK, rows - j * KV_BLOCK)
        return blocks

    def _plan_solo(self, t, base, width):
        mesh, ttnn, tb = self.mesh, self.mesh.ttnn, self.form.rows
        rm, trash = ttnn.ROW_MAJOR_LAYOUT, mesh.kv_shared.trash
        self.new = self._take(t)
        self.blocks = base + self.new
        self.fill = self._table(
            "fill_table", self.new + [trash] * (tb // KV_BLOCK - len(self.new)), (1, tb // KV_BLOCK)
        )
        self.read = self._table(
            "read_table", self.blocks + [trash] * (width - len(self.blocks)), (1, width)
        )
        self.actual_end = mesh.pass_tensor("actual_end", (1,), ttnn.uint32, rm)
        self._staged("actual_end", self.actual_end, ttnn.uint32)[0] = t
        self.mask = mesh.pass_tensor("row_mask", (1, 1, tb, 1), ttnn.float32, ttnn.TILE_LAYOUT)
        mask = np.zeros((1, 1, tb, 1), np.float32)
        mask[0, 0, :t] = 1.0
        self.writes.append((self.mask, mask, ttnn.float32, ttnn.TILE_LAYOUT))

    def _plan_kept(self):
        for i, n in enumerate(self.form.keep):
            if n:
                blocks = self._take(n)
                self.kept_blocks.append(blocks)
                self.kept_fills.append(self._table(("kept_fill", i), blocks, (1, len(blocks))))

    def _plan_continuing(self, base, width):
        trash = self.mesh.kv_shared.trash
        rows = []
        for i in range(self.form.count):
            blocks = self._take(self.form.each)
            self.cont_blocks.append(blocks)
            self.cont_fills.append(self._table(("cont_fill", i), blocks, (1, len(blocks))))
            rows.append(base + blocks + [trash] * (width - len(base) - len(blocks)))
        self.read = self._table("batch_read_table", rows, (self.form.count, width))

    def release(self):
        """The pass's temporary holds on its blocks (handles hold what they keep)."""
        shared = self.mesh.kv_shared
        for blocks in self.kept_blocks + self.cont_blocks + [self.new]:
            shared.release(blocks)

    def write(self):
        for t, array, dtype, layout in self.writes:
            self.mesh._write(t, array, dtype, layout)

    # -- hooks of the layer ops -------------------------------------------------------------------
    def _sdpa(self, mesh, q, pools, read, d, ckc):
        q_chunk, k_chunk = sdpa_chunks(mesh.shape(q)[2], 0)
        ttnn = mesh.ttnn
        return mesh.tt.call(
            "transformer.chunked_scaled_dot_product_attention",
            ttnn.transformer.chunked_scaled_dot_product_attention,
            q,
            pools[0].t,
            pools[1].t,
            read,
            chunk_start_idx_tensor=self.start_t,
            scale=f32(d**-0.5),
            program_config=sdpa_program(ttnn, mesh.grid, q_chunk, k_chunk),
            compute_kernel_config=ckc,
            memory_config=mesh.dram,
        )

    def _fill(self, mesh, pool, rows, table):
        ttnn = mesh.ttnn
        mesh.tt.call(
            "experimental.paged_fill_cache",
            ttnn.experimental.paged_fill_cache,
            pool.t,
            rows,
            table,
            batch_idx=0,
        )

    def attend(self, mesh, q, k, v, d, ckc):
        """A solo pass's layer: its K and V into the pools at the pass's blocks, then causal
        SDPA of q over the sequence's blocks from the start tensor."""
        pools = mesh.kv_shared.pools(mesh, self.layer)
        for pool, new in zip(pools, (k, v)):
            self._fill(mesh, pool, new, self.fill)
        return self._sdpa(mesh, q, pools, self.read, d, ckc)

    def keep_kv(self, mesh, k, v, keep, kvh, d):
        """A fresh batch's kept prefixes: each one's K and V rows ([B, kvh, each, d] heads, its
        block's first `keep[i]` rows) into its own blocks."""
        pools = mesh.kv_shared.pools(mesh, self.layer)
        tables = iter(self.kept_fills)
        for i, n in enumerate(keep):
            if not n:
                continue
            table = next(tables)
            for pool, x in zip(pools, (k, v)):
                rows = mesh.slice(x, (i, 0, 0, 0), (i + 1, kvh, n, d))
                self._fill(mesh, pool, rows, table)
                mesh.drop(rows)

    def continued(self, mesh, q, k, v, kvh, d, ckc):
        """A continuing batch's layer: every block's K and V after the slot's blocks, then
        causal SDPA of every block's queries over the slot's rows and its own (one read-table
        row per block) from the slot's end."""
        pools = mesh.kv_shared.pools(mesh, self.layer)
        count, each = self.form.count, self.form.each
        for i in range(count):
            for pool, x in zip(pools, (k, v)):
                rows = mesh.slice(x, (i, 0, 0, 0), (i + 1, kvh, each, d))
                self._fill(mesh, pool, rows, self.cont_fills[i])
                mesh.drop(rows)
        return self._sdpa(mesh, q, pools, self.read, d, ckc)

    def masked_gates(self, mesh, g, beta):
        """A solo pass's g and beta with 0 on the pad rows (decay exp(0) = 1, no update: the
        state after the pass is the state at its last real row)."""
        out = [mesh.binary("multiply", mesh.ttnn.multiply, a, self.mask) for a in (g, beta)]
        mesh.drop(g, beta)
        return out
