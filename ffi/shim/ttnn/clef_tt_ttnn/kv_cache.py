"""The paged KV cache behind append_rows (a mesh mixin): blocks of a shared pool, a page table
per handle, copy-on-write of at most one block.

A pool is one ttnn tensor [capacity_blocks, heads, 64, head_dim_padded] in bf16 (SDPA refuses
f32, so a mesh asked for an f32 KV cache does not open: mesh.check_kept; an f32-activation mesh
rounds K/V to bf16 here; head_dim padded to a multiple of 32 with
zeros, because SDPA refuses other head widths), as the port holds its KV cache. A cache is a
`KV` handle: `rows` rows held in the pool blocks `blocks` (block j of the handle holds its
positions [64 j, 64 j + 64)). Rows are written with `experimental.paged_fill_cache` through a
page table of the blocks written, and read by `transformer.chunked_scaled_dot_product_attention`
through a page table of the handle's blocks.

append_rows is functional in the ABI: the old handle stays valid and may be appended to again
(a prefix-cache slot: every hit appends its own tail to the same prefix). So blocks are shared
and counted:
- the new handle shares the old one's whole blocks (nothing is copied);
- the old handle's last, partial block is written in place when no one has written past the
  old handle's end in it (the pool keeps each block's filled rows), else copied into a fresh
  block with the new rows (copy-on-write of that one block: at most 63 rows);
- the remaining rows go to fresh blocks, the lowest free ones first;
- a block is free again when the last handle holding it is released.
So a prefix-cache hit copies no pool, and the pool stays the same size across hits whose
handles are released: their blocks are reused. A pool no handle holds is kept by the mesh as
a spare (`SparePools`) for the next sequence's pool of its shape: no allocation, no fill. A pool out of free blocks grows to twice its
capacity (one device copy, amortised over a long prompt); block ids stay valid. `copy` (a
prefix-cache slot) is a handle sharing the same blocks. Keys and values are appended in step,
so a layer's key and value handles hold the same block ids (the one page table SDPA takes).
A pool's device buffer is kept as a spare, or freed, with its last handle.
"""

import heapq

from .meta import KV_BLOCK, TILE_SIZE, round_up


class KVPool:
    """One device tensor of KV blocks, with each block's holders and filled rows."""

    __slots__ = (
        "t",
        "cap",
        "heads",
        "d",
        "dp",
        "refs",
        "filled",
        "free",
        "users",
        "spares",
        "shared",
        "__weakref__",
    )

    def __init__(self, t, cap, heads, d, dp, spares=None, shared=None):
        self.t, self.cap, self.heads, self.d, self.dp = t, cap, heads, d, dp
        self.users = 0
        # The mesh's spare pool tensors (SparePools), where this one goes when unused.
        self.spares = spares
        # A pool of the passes' KV (SharedPools): the block bookkeeping shared with every
        # other layer's pools, and the tensor kept while the mesh lives.
        self.shared = shared
        if shared is not None:
            self.refs, self.filled, self.free = shared.refs, shared.filled, shared.free
        else:
            self.refs = [0] * cap
            self.filled = [0] * cap
            self.free = list(range(cap))

    def tensors(self):
        return [self.t] if self.t is not None else []

    def take(self, n):
        """`n` free block ids, the lowest first."""
        return [heapq.heappop(self.free) for _ in range(n)]

    def hold(self, blocks):
        for b in blocks:
            self.refs[b] += 1

    def drop_blocks(self, blocks):
        for b in blocks:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.filled[b] = 0
                heapq.heappush(self.free, b)


class Hold:
    """One hold on blocks of the shared pools for every KV handle a pass made (passes.py: all
    its layers' keys and values hold the same blocks): the blocks are counted once, and
    dropped when the last of those handles goes."""

    __slots__ = ("shared", "blocks", "handles")

    def __init__(self, shared, blocks):
        self.shared, self.blocks, self.handles = shared, blocks, 0
        shared.hold(blocks)


class KV:
    """A KV cache handle: `rows` rows in the pool blocks `blocks` (held by the handle, or by
    `hold`, shared with the other handles of a pass)."""

    __slots__ = ("pool", "rows", "blocks", "released", "hold", "__weakref__")

    def __init__(self, pool, rows, blocks, hold=None):
        self.pool, self.rows, self.released, self.hold = pool, rows, False, hold
        pool.users += 1
        if hold is not None:
            self.blocks = hold.blocks
            hold.handles += 1
        else:
            self.blocks = list(blocks)
            pool.hold(self.blocks)

    def tensors(self):
        return [self.pool.t] if self.pool.t is not None else []

    def release(self, ttnn):
        if self.released:
            return
        self.released = True
        pool = self.pool
        if self.hold is not None:
            self.hold.handles -= 1
            if self.hold.handles == 0:
                self.hold.shared.release(self.hold.blocks)
        else:
            pool.drop_blocks(self.blocks)
        pool.users -= 1
        if pool.users == 0 and pool.t is not None and pool.shared is None:
            if pool.spares is None or not pool.spares.keep(pool, ttnn):
                if pool.t.is_allocated():
                    ttnn.deallocate(pool.t, force=False)
            pool.t = None

    def __del__(self):
        try:
            if not self.released:
                import ttnn

                self.release(ttnn)
        except Exception:
            pass


class SparePools:
    """Pool tensors no handle holds any more, kept for the next pools of their shape (at most
    `limit`): a new sequence's KV lands in the buffers the last one used, with no allocation
    and no zero fill (stale rows are never read: SDPA reads only a handle's blocks, causally).
    Trace capture on chips needs exactly this: the same buffers for the same chunk."""

    def __init__(self, limit):
        self.limit, self.tensors = limit, []

    def keep(self, pool, ttnn):
        """Keep `pool`'s tensor. With `limit` kept, the oldest goes (deallocated), so the spares
        follow the latest sequences: refusing the newest instead left a 1,024-token chunk that
        came after many shorter ones allocating its pools on every call."""
        if self.limit <= 0 or pool.t is None or not pool.t.is_allocated():
            return False
        if len(self.tensors) >= self.limit:
            oldest = self.tensors.pop(0)[3]
            if oldest.is_allocated():
                ttnn.deallocate(oldest, force=False)
        self.tensors.append((pool.heads, pool.dp, pool.cap, pool.t))
        return True

    def take(self, heads, dp, need):
        """The smallest kept tensor of `heads` x `dp` with at least `need` blocks, or None."""
        fits = [e for e in self.tensors if e[0] == heads and e[1] == dp and e[2] >= need]
        if not fits:
            return None
        best = min(fits, key=lambda e: e[2])
        self.tensors.remove(best)
        return best[2], best[3]


class SharedPools:
    """The KV of passes (passes.py): per attention layer a keys and a values pool of `cap`
    blocks at addresses fixed for the mesh's life (a trace bakes them), all sharing one block
    bookkeeping, so every layer's handle of a sequence holds the same block ids and one page
    table serves every layer. The last block is the trash: a bucket's pad rows are written
    there. Out of blocks, every pool grows at once (a device copy each) and the traces that
    read the old ones are released (passes capture them again)."""

    def __init__(self, cap, heads, d, dp):
        self.cap, self.heads, self.d, self.dp = cap, heads, d, dp
        self.refs = [0] * cap
        self.filled = [0] * cap
        self.trash = cap - 1
        self.free = list(range(cap - 1))
        self.layers = {}

    def tensors(self):
        return [p.t for pair in self.layers.values() for p in pair]

    def pools(self, mesh, layer):
        """Layer `layer`'s (keys, values) pools, made (zeros) on first use."""
        pair = self.layers.get(layer)
        if pair is None:
            pair = tuple(
                KVPool(
                    mesh.protect(
                        mesh.zeros((self.cap, self.heads, KV_BLOCK, self.dp), mesh.kv_dtype()),
                        mesh,
                    ),
                    self.cap,
                    self.heads,
                    self.d,
                    self.dp,
                    shared=self,
                )
                for _ in range(2)
            )
            self.layers[layer] = pair
        return pair

    def hold(self, blocks):
        for b in blocks:
            self.refs[b] += 1

    def release(self, blocks):
        for b in blocks:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.filled[b] = 0
                heapq.heappush(self.free, b)

    def take(self, mesh, n):
        """`n` free block ids (the lowest first), growing every pool when too few are free."""
        if n > len(self.free):
            self.grow(mesh, max(2 * self.cap, self.cap + n - len(self.free)))
        return [heapq.heappop(self.free) for _ in range(n)]

    def grow(self, mesh, cap):
        mesh.trace_release_all()
        extra = cap - self.cap
        for pair in self.layers.values():
            for pool in pair:
                rest = mesh.zeros((extra, self.heads, KV_BLOCK, self.dp), mesh.kv_dtype())
                old = pool.t
                pool.t = mesh.protect(mesh.concat([old, rest], 0), mesh)
                mesh.ttnn.deallocate(old, force=True)
                mesh.drop(rest)
                pool.cap = cap
        self.refs += [0] * extra
        self.filled += [0] * extra
        for b in range(self.cap, cap):
            heapq.heappush(self.free, b)
        self.cap = cap


def _blocks(rows):
    return (rows + KV_BLOCK - 1) // KV_BLOCK


class KvCache:
    """append_rows, the KV parts of download/copy, and page tables (mesh mixin)."""

    KV_DTYPE = "bfloat16"

    def kv_dtype(self):
        return getattr(self.ttnn, self.KV_DTYPE)

    def page_table(self, blocks, columns):
        """int32 ROW_MAJOR [1, columns] on every device: the block ids, then 0 (every entry must
        name a real block; the port pads with 0). Cached per mesh (internal)."""
        key = ("page_table", tuple(blocks), columns)
        t = self.internal.get(key)
        if t is None:
            t = self.page_rows([blocks], columns)
            self.keep_internal(key, t)
        return t

    def page_rows(self, rows, columns):
        """int32 ROW_MAJOR [len(rows), columns] on every device: per row its block ids, then 0
        (a page table of one row per batch element; not cached: the caller drops it)."""
        import numpy as np

        ids = np.zeros((len(rows), columns), np.int32)
        for i, blocks in enumerate(rows):
            ids[i, : len(blocks)] = np.asarray(blocks, dtype=np.int32)
        return self.tt.call(
            "Tensor",
            self.ttnn.Tensor,
            ids,
            data_type=self.ttnn.int32,
            layout=self.ttnn.ROW_MAJOR_LAYOUT,
            device=self.device,
            mem_config=self.dram,
            mesh_mapper=self.ttnn.replicate_tensor_to_mesh_mapper(self.device),
        )

    def kv_input(self, t, heads, d, dp):
        """[1, 1, T, heads*d] activation -> [1, heads, T, dp] in the KV dtype."""
        x = self.heads_first(t, heads, d)
        y = self.pad_end(x, 3, dp)
        z = self.typecast(y, self.kv_dtype())
        for tmp in (x, y):
            if tmp is not z:
                self.drop(tmp)
        return z

    def _new_pool(self, need, heads, d, dp):
        """A pool of at least `need` blocks: a spare one of this shape, else a new zero one."""
        spare = self.kv_spares.take(heads, dp, need)
        if spare is not None:
            cap, t = spare
        else:
            cap, t = need, self.zeros((need, heads, KV_BLOCK, dp), self.kv_dtype())
        pool = KVPool(t, cap, heads, d, dp, self.kv_spares)
        self.protect(t, pool)
        return pool

    def _grow(self, pool, cap):
        """The pool's tensor with room for `cap` blocks (the old blocks copied; ids kept)."""
        rest = self.zeros((cap - pool.cap, pool.heads, KV_BLOCK, pool.dp), self.kv_dtype())
        old = pool.t
        pool.t = self.concat([old, rest], 0)
        self.protect(pool.t, pool)
        self.drop(old, rest)
        pool.refs += [0] * (cap - pool.cap)
        pool.filled += [0] * (cap - pool.cap)
        for b in range(pool.cap, cap):
            heapq.heappush(pool.free, b)
        pool.cap = cap

    def append_rows(self, cache, rows, heads):
        """`cache` rows followed by `rows`' rows, as a KV handle (see the module docstring)."""
        mr, r = rows
        if heads <= 0 or mr.cols % heads:
            raise ValueError("append_rows: %d columns in %d heads" % (mr.cols, heads))
        d = mr.cols // heads
        dp = round_up(d, TILE_SIZE)
        c = owned = None
        if cache is not None:
            c = cache[1]
            if not isinstance(c, KV):
                # A plain activation as the cache: page it first (a copy).
                c = owned = self.append_rows(None, cache, heads)
        new = self.kv_input(r.t, heads, d, dp)
        out = self.append_heads(c, new, heads, d)
        if owned is not None:
            owned.release(self.ttnn)
        return out

    def append_heads(self, kv, new, heads, d):
        """KV handle `kv` (None: empty) followed by heads-first rows `new` [1, heads, T, dp] in
        the KV dtype (consumed), as a new handle (see the module docstring). A handle in the
        passes' shared pools (SharedPools) is first copied into a pool of its own: their blocks
        are allocated once per pass for every layer, which appends layer by layer cannot
        follow (keys and values would part)."""
        dp = self.shape(new)[3]
        t = self.shape(new)[2]
        owned = None
        if kv is not None and kv.pool.shared is not None:
            kv = owned = self._own_pool(kv)
        if kv is None:
            pool, r0, base = self._new_pool(_blocks(t), heads, d, dp), 0, []
        else:
            pool, r0, base = kv.pool, kv.rows, kv.blocks
            if pool.heads != heads or pool.d != d:
                raise ValueError(
                    "append_rows: a cache of %d heads x %d, rows of %d heads x %d"
                    % (pool.heads, pool.d, heads, d)
                )
        b0, off = divmod(r0, KV_BLOCK)
        # The old handle's partial last block: in place if no one wrote past its end there.
        in_place = [base[b0]] if off and pool.filled[base[b0]] == off else []
        fresh = _blocks(r0 + t) - b0 - len(in_place)
        if pool.shared is not None:
            write = in_place + pool.shared.take(self, fresh)
        else:
            if fresh > len(pool.free):
                self._grow(pool, max(2 * pool.cap, pool.cap + fresh - len(pool.free)))
            write = in_place + pool.take(fresh)
        if off:
            src = base[b0]
            prefix = self.slice(pool.t, (src, 0, 0, 0), (src + 1, heads, off, dp))
            inp = self.concat([prefix, new], 2)
            self.drop(prefix, new)
        else:
            inp = new
        table = self.page_table(write, len(write))
        self.tt.call(
            "experimental.paged_fill_cache",
            self.ttnn.experimental.paged_fill_cache,
            pool.t,
            inp,
            table,
            batch_idx=0,
        )
        self.drop(inp)
        written = off + t
        for i, b in enumerate(write):
            pool.filled[b] = min(KV_BLOCK, written - i * KV_BLOCK)
        out = self.track(KV(pool, r0 + t, base[:b0] + write))
        if owned is not None:
            owned.release(self.ttnn)
        return out

    def _own_pool(self, kv):
        """A handle of `kv`'s rows in a pool of its own (a device copy of its rows)."""
        p = kv.pool
        rows = self.kv_rows(kv)
        heads_first = self.kv_input(rows, p.heads, p.d, p.dp)
        self.drop(rows)
        return self.append_heads(None, heads_first, p.heads, p.d)

    def as_kv(self, pair, heads):
        """(KV handle, made-here) for an attention operand that may be a plain activation."""
        meta, obj = pair
        if isinstance(obj, KV):
            return obj, False
        return self.append_rows(None, pair, heads), True

    def kv_table(self, k, v, needed):
        """The page table SDPA reads k and v through: their first `needed` blocks (padded with
        block 0 past the handle's blocks, to a multiple of 32 entries)."""
        if k.blocks != v.blocks:
            raise ValueError(
                "causal_attention: keys and values in different pool blocks "
                "(%d and %d blocks); they are appended in step" % (len(k.blocks), len(v.blocks))
            )
        return self.page_table(k.blocks[:needed], round_up(needed, 32))

    def kv_rows(self, kv):
        """A KV handle's rows as a new [1, 1, rows, heads*d] tensor (for downloads)."""
        p = kv.pool
        runs, start = [], 0
        for i in range(1, len(kv.blocks) + 1):
            if i == len(kv.blocks) or kv.blocks[i] != kv.blocks[i - 1] + 1:
                first = kv.blocks[start]
                runs.append(
                    self.slice(p.t, (first, 0, 0, 0), (first + i - start, p.heads, KV_BLOCK, p.dp))
                )
                start = i
        blocks = self.concat(runs, 0)
        tokens = self.permute(blocks, (0, 2, 1, 3))
        narrow = self.cols(tokens, 0, p.d)
        flat = self.reshape(narrow, (1, 1, len(kv.blocks) * KV_BLOCK, p.heads * p.d))
        out = self.rows(flat, 0, kv.rows)
        self.drop(*[t for t in runs + [blocks, tokens, narrow, flat] if t is not out])
        return out

    def kv_copy(self, kv):
        """A handle on the same blocks (appends to either copy write only blocks they own or
        fresh ones, so the rows they share never change)."""
        return self.track(KV(kv.pool, kv.rows, kv.blocks))
