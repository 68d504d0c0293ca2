"""The paged KV cache behind append_rows (a mesh mixin), held as the port holds it.

A cache is a `KV` handle: `rows` valid rows in a shared `KVPool`, one ttnn tensor
[capacity_blocks, heads, 64, head_dim_padded] (block 64 rows, block i = positions [64 i, 64 i + 64),
an identity page table; head_dim padded to a multiple of 32 with zeros, because SDPA refuses
other head widths), in bf16 (SDPA refuses f32; an f32-activation mesh rounds K/V to bf16 there).
Rows are written with `experimental.paged_fill_cache` and read by
`transformer.chunked_scaled_dot_product_attention`.

append_rows is functional in the ABI: the old handle stays valid and may be appended to again
(a prefix-cache slot). The rule that keeps the common path free of copies:
- the pool remembers its tail: the rows of the handle that last appended to it;
- appending to a handle whose rows equal the pool's tail, with room in the pool, writes the new
  rows in place (the block holding row `rows` is rewritten from its own first rows plus the new
  ones; the old handle's rows are not changed) and the new handle becomes the tail;
- appending to any other handle (someone appended past it), or beyond the pool's capacity, first
  copies the handle's whole blocks into a new pool of max(needed, 2 x used) blocks (growth that
  amortises copies over a long prompt), then writes in place there.
Old and new handles share a pool; the pool's device buffer is freed with its last handle.
`copy` (prefix-cache slots) makes a pool of exactly the handle's used blocks (a device slice).
"""
from .meta import KV_BLOCK, TILE_SIZE, round_up


class KVPool:
    """One device tensor of KV blocks shared by the handles appended from one another."""

    __slots__ = ("t", "cap", "heads", "d", "dp", "tail", "users", "__weakref__")

    def __init__(self, t, cap, heads, d, dp, tail):
        self.t, self.cap, self.heads, self.d, self.dp, self.tail = t, cap, heads, d, dp, tail
        self.users = 0

    def tensors(self):
        return [self.t] if self.t is not None else []


class KV:
    """A KV cache handle: the first `rows` rows of `pool`."""

    __slots__ = ("pool", "rows", "released", "__weakref__")

    def __init__(self, pool, rows):
        self.pool, self.rows, self.released = pool, rows, False
        pool.users += 1

    def tensors(self):
        return [self.pool.t] if self.pool.t is not None else []

    def release(self, ttnn):
        if self.released:
            return
        self.released = True
        self.pool.users -= 1
        if self.pool.users == 0 and self.pool.t is not None:
            if self.pool.t.is_allocated():
                ttnn.deallocate(self.pool.t, force=False)
            self.pool.t = None

    def __del__(self):
        try:
            if not self.released:
                import ttnn
                self.release(ttnn)
        except Exception:
            pass


def _blocks(rows):
    return (rows + KV_BLOCK - 1) // KV_BLOCK


class KvCache:
    """append_rows, the KV parts of download/copy, and page tables (mesh mixin)."""

    KV_DTYPE = "bfloat16"

    def kv_dtype(self):
        return getattr(self.ttnn, self.KV_DTYPE)

    def page_table(self, first, count, columns):
        """int32 ROW_MAJOR [1, columns] on every device: first .. first+count-1, then 0 (every
        entry must name a real block; the port pads with 0). Cached per mesh (internal)."""
        key = ("page_table", first, count, columns)
        t = self.internal.get(key)
        if t is None:
            import numpy as np
            ids = np.zeros((1, columns), np.int32)
            ids[0, :count] = np.arange(first, first + count, dtype=np.int32)
            t = self.tt.call("Tensor", self.ttnn.Tensor, ids, data_type=self.ttnn.int32,
                             layout=self.ttnn.ROW_MAJOR_LAYOUT, device=self.device,
                             mem_config=self.dram,
                             mesh_mapper=self.ttnn.replicate_tensor_to_mesh_mapper(self.device))
            self.keep_internal(key, t)
        return t

    def kv_input(self, t, heads, d, dp):
        """[1, 1, T, heads*d] activation -> [1, heads, T, dp] in the KV dtype."""
        x = self.heads_first(t, heads, d)
        y = self.pad_end(x, 3, dp)
        z = self.typecast(y, self.kv_dtype())
        for tmp in (x, y):
            if tmp is not z:
                self.drop(tmp)
        return z

    def _new_pool(self, old, used_rows, need, heads, d, dp):
        """A pool of max(need, 2 x used) blocks holding `old`'s first whole blocks of
        `used_rows` rows (old may be None)."""
        used = _blocks(used_rows)
        cap = max(need, 2 * used)
        if old is None or used == 0:
            t = self.zeros((cap, heads, KV_BLOCK, dp), self.kv_dtype())
        else:
            head = self.slice(old.t, (0, 0, 0, 0), (used, heads, KV_BLOCK, dp))
            rest = None
            if cap > used:
                rest = self.zeros((cap - used, heads, KV_BLOCK, dp), self.kv_dtype())
            t = self.concat([head, rest], 0)
            if t is not head:
                self.drop(head, rest)
        return self.pool_of(t, cap, heads, d, dp, used_rows)

    def append_rows(self, cache, rows, heads):
        """`cache` rows followed by `rows`' rows, as a KV handle (see the module docstring)."""
        mr, r = rows
        if heads <= 0 or mr.cols % heads:
            raise ValueError("append_rows: %d columns in %d heads" % (mr.cols, heads))
        d = mr.cols // heads
        dp = round_up(d, TILE_SIZE)
        owned = None
        if cache is None:
            pool, r0 = None, 0
        else:
            mc, c = cache
            if not isinstance(c, KV):
                # A plain activation as the cache: page it first (a copy).
                c = owned = self.append_rows(None, cache, heads)
            pool, r0 = c.pool, c.rows
            if pool.heads != heads or pool.d != d:
                raise ValueError("append_rows: a cache of %d heads x %d, rows of %d heads x %d"
                                 % (pool.heads, pool.d, heads, d))
        r1 = r0 + mr.rows
        need = _blocks(r1)
        if pool is None or pool.tail != r0 or need > pool.cap:
            pool = self._new_pool(pool, r0, need, heads, d, dp)
        new = self.kv_input(r.t, heads, d, dp)
        b0, off = divmod(r0, KV_BLOCK)
        if off:
            prefix = self.slice(pool.t, (b0, 0, 0, 0), (b0 + 1, heads, off, dp))
            inp = self.concat([prefix, new], 2)
            self.drop(prefix, new)
        else:
            inp = new
        table = self.page_table(b0, need - b0, need - b0)
        self.tt.call("experimental.paged_fill_cache", self.ttnn.experimental.paged_fill_cache,
                     pool.t, inp, table, batch_idx=0)
        self.drop(inp)
        pool.tail = r1
        out = self.track(KV(pool, r1))
        if owned is not None:
            owned.release(self.ttnn)
        return out

    def as_kv(self, pair, heads):
        """(KV handle, made-here) for an attention operand that may be a plain activation."""
        meta, obj = pair
        if isinstance(obj, KV):
            return obj, False
        return self.append_rows(None, pair, heads), True

    def kv_rows(self, kv):
        """A KV handle's rows as a new [1, 1, rows, heads*d] tensor (for downloads)."""
        p = kv.pool
        used = _blocks(kv.rows)
        blocks = self.slice(p.t, (0, 0, 0, 0), (used, p.heads, KV_BLOCK, p.dp))
        tokens = self.permute(blocks, (0, 2, 1, 3))
        narrow = self.cols(tokens, 0, p.d)
        flat = self.reshape(narrow, (1, 1, used * KV_BLOCK, p.heads * p.d))
        out = self.rows(flat, 0, kv.rows)
        self.drop(*[t for t in (blocks, tokens, narrow, flat) if t is not out])
        return out

    def kv_copy(self, kv):
        """A handle on a new pool of exactly its used blocks (a device-side copy)."""
        p = kv.pool
        used = _blocks(kv.rows)
        if used == p.cap:
            t = self.tt.call("clone", self.ttnn.clone, p.t, memory_config=self.dram)
        else:
            t = self.tt.call("slice", self.ttnn.slice, p.t, [0, 0, 0, 0],
                             [used, p.heads, KV_BLOCK, p.dp], memory_config=self.dram)
        return self.track(KV(self.pool_of(t, used, p.heads, p.d, p.dp, kv.rows), kv.rows))

    def pool_of(self, t, cap, heads, d, dp, tail):
        pool = KVPool(t, cap, heads, d, dp, tail)
        self.protect(t, pool)
        return pool
