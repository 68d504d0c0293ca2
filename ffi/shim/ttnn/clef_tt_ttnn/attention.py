"""causal_attention over the paged KV cache and the vision tower's segment_attention (mixin).

causal_attention: q rows are the last positions of keys/values (start = keys rows - q rows).
As the port's chunked prefill: q [1, heads, T, d] against the paged K/V pools through
`transformer.chunked_scaled_dot_product_attention` with the page table of the handles' blocks
(kv_cache.py) zero-padded to a multiple of 32 columns, chunk_start_idx = start, q/k chunks from programs.sdpa_chunks, scale
head_dim^-0.5. ttnn needs chunk_start_idx to be a multiple of the q chunk: a start that is not a
multiple of 32 is moved back to the multiple of 32 below it and q is prefixed with that many
zero rows (their outputs are dropped; causality keeps every real row's keys exactly
0..its position). Head dims that are not multiples of 32 are zero-padded (SDPA refuses them)
with the scale of the real head dim. q, K and V are bf16 in SDPA (it refuses f32).

segment_attention: as the port's vision attention, one bidirectional
`transformer.scaled_dot_product_attention` (is_causal=False) over all rows with the segments as
`cu_window_seqlens` (block-diagonal attention, mask built on the device). Rows are zero-padded to
a multiple of 32 and the padding is its own last window, so no real row sees a padded key.
"""

from .meta import KV_BLOCK, TILE_SIZE, f32, round_up
from .programs import precise, sdpa_chunks, sdpa_program


class Attention:
    """causal_attention, segment_attention (mesh mixin)."""

    def _heads_out(self, o, r0, r1, d):
        """[1, heads, L, dp] rows [r0, r1), first d channels -> [1, 1, r1-r0, heads*d] in the
        activation dtype."""
        s = self.shape(o)
        part = self.slice(o, (0, 0, r0, 0), (s[0], s[1], r1, d))
        flat = self.heads_last(part)
        out = self.typecast(flat, self.act_dtype)
        for tmp in (part, flat):
            if tmp is not out and tmp is not o:
                self.drop(tmp)
        return out

    def causal_attention(self, q, keys, values, heads, kv_heads, head_dim):
        mq, qo = q
        mk = keys[0]
        d = head_dim
        if kv_heads <= 0 or heads % kv_heads or mq.cols != heads * d or mk.rows < mq.rows:
            raise ValueError(
                "causal_attention: q %dx%d, keys %dx%d for %d heads, %d kv heads x %d"
                % (mq.rows, mq.cols, mk.rows, mk.cols, heads, kv_heads, d)
            )
        k, k_made = self.as_kv(keys, kv_heads)
        v, v_made = self.as_kv(values, kv_heads)
        qh = self.kv_input(qo.t, heads, d, k.pool.dp)
        o = self.paged_attention(qh, k, v, d)
        self.drop(qh)
        out = self._heads_out(o, 0, mq.rows, d)
        if out is not o:
            self.drop(o)
        for h, made in ((k, k_made), (v, v_made)):
            if made:
                h.release(self.ttnn)
        return self.wrap(out)

    def paged_attention(self, qh, k, v, d, ckc=None):
        """Heads-first q [1, heads, T, dp] (KV dtype) of the last T positions of KV handles k and
        v -> the heads-first output [1, heads, T, dp] (see the module docstring); HiFi4 unless
        the kernel config `ckc` is given."""
        heads, t, dp = self.shape(qh)[1:]
        start = k.rows - t
        front = start % TILE_SIZE
        aligned = start - front
        length = front + t
        q_chunk, _ = sdpa_chunks(length, aligned)
        if front:
            zeros = self.zeros((1, heads, front, dp), self.kv_dtype())
            qf = self.concat([zeros, qh], 2)
            self.drop(zeros)
        else:
            qf = qh
        needed = (aligned + round_up(length, q_chunk) + KV_BLOCK - 1) // KV_BLOCK
        table = self.kv_table(k, v, needed)
        o = self.chunked_sdpa(qf, k, v, table, aligned, d, ckc or precise(self.ttnn))
        if qf is not qh:
            self.drop(qf)
        if not front:
            return o
        out = self.slice(o, (0, 0, front, 0), (1, heads, length, dp))
        self.drop(o)
        return out

    def chunked_sdpa(self, q, k, v, table, start, d, ckc):
        """`transformer.chunked_scaled_dot_product_attention`: q [B, heads, L, dp] at positions
        start.. against the pools of KV handles k and v through `table` (a row per batch
        element), causal, scale d^-0.5."""
        q_chunk, k_chunk = sdpa_chunks(self.shape(q)[2], start)
        return self.tt.call(
            "transformer.chunked_scaled_dot_product_attention",
            self.ttnn.transformer.chunked_scaled_dot_product_attention,
            q,
            k.pool.t,
            v.pool.t,
            table,
            chunk_start_idx=start,
            scale=f32(d**-0.5),
            program_config=sdpa_program(self.ttnn, self.grid, q_chunk, k_chunk),
            compute_kernel_config=ckc,
            memory_config=self.dram,
        )

    def windows(self, bounds):
        """int32 ROW_MAJOR [len(bounds)] window boundaries on every device (cached, internal)."""
        key = ("windows",) + tuple(bounds)
        t = self.internal.get(key)
        if t is None:
            import numpy as np

            t = self.tt.call(
                "Tensor",
                self.ttnn.Tensor,
                np.array(bounds, dtype=np.int32),
                data_type=self.ttnn.int32,
                layout=self.ttnn.ROW_MAJOR_LAYOUT,
                device=self.device,
                mem_config=self.dram,
                mesh_mapper=self.ttnn.replicate_tensor_to_mesh_mapper(self.device),
            )
            self.keep_internal(key, t)
        return t

    def segment_attention(self, q, k, v, heads, head_dim, segments):
        mq, qo = q
        d = head_dim
        dp = round_up(d, TILE_SIZE)
        nxt = 0
        for s, e in segments:
            if s != nxt or e <= s:
                raise ValueError(
                    "segment_attention: segments %s do not tile %d rows" % (list(segments), mq.rows)
                )
            nxt = e
        if nxt != mq.rows or mq.cols != heads * d:
            raise ValueError(
                "segment_attention: q %dx%d for %d heads x %d, segments end at %d"
                % (mq.rows, mq.cols, heads, d, nxt)
            )
        rows = mq.rows
        padded = round_up(rows, TILE_SIZE)
        bounds = [0] + [e for _, e in segments] + ([padded] if padded > rows else [])
        parts = []
        for obj in (qo, k[1], v[1]):
            x = self.pad_end(obj.t, 2, padded)
            parts.append(self.kv_input(x, heads, d, dp))
            if x is not obj.t:
                self.drop(x)
        chunk = 128 if padded >= 2048 else 64
        o = self.tt.call(
            "transformer.scaled_dot_product_attention",
            self.ttnn.transformer.scaled_dot_product_attention,
            parts[0],
            parts[1],
            parts[2],
            is_causal=False,
            scale=f32(d**-0.5),
            cu_window_seqlens=self.windows(bounds),
            program_config=sdpa_program(self.ttnn, self.grid, chunk, chunk),
            compute_kernel_config=precise(self.ttnn),
            memory_config=self.dram,
        )
        self.drop(*parts)
        out = self._heads_out(o, 0, rows, d)
        if out is not o:
            self.drop(o)
        return self.wrap(out)
