"""What this package returns for an ABI tensor, and the small device helpers every op uses.

An ABI tensor is one of:
- `DT`: one ttnn mesh tensor (one shard per device, in mesh order). Activations are
  [1, 1, rows, cols] TILE in the mesh's activation dtype (partial sums, DeltaNet gates and states
  FLOAT32); matrices [1, 1, in, out] TILE in the uploaded dtype; vectors [1, 1, rows, cols]
  ROW_MAJOR FLOAT32. A vector also keeps its host values (`host`, one array per device) and the
  per-op forms derived from them on first use (`derived`: a norm's gamma row, conv tap rows,
  -exp(A_log)); those device tensors belong to the vector and are freed with it.
- `KV`: a KV cache made by append_rows, held paged as the port holds it (kv_cache.py).

`Helpers` is mixed into the mesh: thin wrappers that send every ttnn call through the mesh's
dispatcher (dispatch.py) under the op's name.
"""

import numpy as np

from .meta import TILE_SIZE


class DT:
    """One ABI tensor held as one ttnn mesh tensor (see the module docstring). An uploaded
    activation stays on the host until an op reads it (`pending`: the mesh, its host arrays
    [1, 1, rows padded, cols] f32 and its rows): a pass (passes.py) writes a replicated one
    straight into its persistent input instead, the rows already padded to the pass's bucket
    by the upload (one copy of the caller's rows in all)."""

    __slots__ = ("_t", "host", "derived", "pending", "__weakref__")

    def __init__(self, t, host=None, pending=None):
        self._t = t
        self.host = host
        self.derived = {}
        self.pending = pending

    @property
    def t(self):
        if self._t is None and self.pending is not None:
            mesh, arrays, rows = self.pending
            self.pending = None
            self._t = mesh.protect(
                mesh.host_rows(
                    [a[:, :, :rows] for a in arrays], mesh.act_dtype, mesh.ttnn.TILE_LAYOUT
                ),
                self,
            )
            mesh.return_row_buffers(arrays)
        return self._t

    def take_host_values(self):
        """The upload's host values (see `host_values`), given up: the caller is the last to
        read them, and returns them with `return_row_buffers` when done."""
        values = self.host_values()
        if values is not None:
            self.pending = None
        return values

    @t.setter
    def t(self, value):
        self._t = value

    def host_values(self):
        """The replicated host values of an upload no op has read yet ([1, 1, rows padded,
        cols] f32, the pad rows zeros), else None."""
        if self._t is None and self.pending is not None and len(self.pending[1]) == 1:
            return self.pending[1][0]
        return None

    def tensors(self):
        """Every device tensor this ABI tensor holds."""
        return ([self._t] if self._t is not None else []) + list(self.derived.values())

    def release(self, ttnn):
        # force=False: a buffer another tensor still views (a reshape view) stays alive.
        for t in self.tensors():
            if t is not None and t.is_allocated():
                ttnn.deallocate(t, force=False)
        self._t = None
        if self.pending is not None:
            self.pending[0].return_row_buffers(self.pending[1])
        self.pending = None
        self.derived = {}


class Helpers:
    """ttnn calls through the mesh's dispatcher (`self.tt`), on `self.device`, in DRAM."""

    # -- shapes ---------------------------------------------------------------------------------
    @staticmethod
    def shape(t):
        return tuple(t.shape)

    def reshape(self, t, shape):
        shape = tuple(int(d) for d in shape)
        if t.shape == shape:
            return t
        return self.tt.call("reshape", self.ttnn.reshape, t, shape)

    def slice(self, t, begin, end):
        """t[begin:end] over all four dims (a new tensor, or t itself when whole)."""
        s = self.shape(t)
        if tuple(begin) == (0,) * len(s) and tuple(end) == s:
            return t
        return self.tt.call(
            "slice",
            self.ttnn.slice,
            t,
            list(begin),
            list(end),
            memory_config=self.dram,
            sub_core_grids=self.eltwise_cores,
        )

    def cols(self, t, c0, c1):
        """Last-dim columns [c0, c1) of a 4-D tensor."""
        s = self.shape(t)
        return self.slice(t, (0,) * (len(s) - 1) + (c0,), s[:-1] + (c1,))

    def rows(self, t, r0, r1):
        """Rows [r0, r1) (dim -2) of a 4-D tensor."""
        s = self.shape(t)
        return self.slice(t, (0,) * (len(s) - 2) + (r0, 0), s[:-2] + (r1, s[-1]))

    def concat(self, parts, dim):
        parts = [p for p in parts if p is not None]
        if len(parts) == 1:
            return parts[0]
        return self.tt.call("concat", self.ttnn.concat, parts, dim, memory_config=self.dram)

    def pad_end(self, t, dim, to, value=0.0):
        """Pad dim `dim` of a 4-D tensor at its end to `to` with `value`."""
        s = self.shape(t)
        if s[dim] == to:
            return t
        pads = [(0, 0)] * len(s)
        pads[dim] = (0, to - s[dim])
        return self.tt.call("pad", self.ttnn.pad, t, pads, value, memory_config=self.dram)

    def permute(self, t, dims):
        return self.tt.call("permute", self.ttnn.permute, t, tuple(dims), memory_config=self.dram)

    def typecast(self, t, dtype):
        if t.dtype == dtype:
            return t
        return self.tt.call("typecast", self.ttnn.typecast, t, dtype, memory_config=self.dram)

    def to_tile(self, t):
        if t.layout == self.ttnn.TILE_LAYOUT:
            return t
        return self.tt.call(
            "to_layout", self.ttnn.to_layout, t, self.ttnn.TILE_LAYOUT, memory_config=self.dram
        )

    def binary(self, name, fn, a, b, **kwargs):
        """An elementwise binary op of the layer ops (`fn` ttnn.add, ttnn.multiply, ...) on the
        mesh's elementwise cores (programs.eltwise_cores), in DRAM."""
        return self.tt.call(
            name, fn, a, b, memory_config=self.dram, sub_core_grids=self.eltwise_cores, **kwargs
        )

    def unary(self, name, *params):
        """A fused activation (`activations=` / `input_tensor_*_activations=` of binary ops)."""
        return self.ttnn.UnaryWithParam(getattr(self.ttnn.UnaryOpType, name), *params)

    def zeros(self, shape, dtype):
        return self.tt.call(
            "zeros",
            self.ttnn.zeros,
            tuple(shape),
            dtype=dtype,
            layout=self.ttnn.TILE_LAYOUT,
            device=self.device,
            memory_config=self.dram,
        )

    def protect(self, t, owner):
        """Mark `t` as held by `owner` (an ABI tensor, a KV pool or the mesh): drop() leaves it.
        Helpers may return their input unchanged (a whole slice, a pad to the same size), so an
        op's "intermediate" can be an input; this is what keeps inputs alive."""
        self.owned[id(t)] = owner
        return t

    def held(self, t):
        owner = self.owned.get(id(t))
        return owner is not None and any(x is t for x in owner.tensors())

    # Set while a layer op runs (layers.py): its intermediates are freed when their Python
    # objects go (at the latest when the op returns), without a deallocate call each.
    deferred_frees = False

    def drop(self, *ts):
        """Deallocate intermediates now, never a tensor an ABI tensor, a pool or the mesh holds.
        force=False: a buffer still viewed by a tensor in use (reshape views share buffers) is
        kept until its last reference goes."""
        if self.deferred_frees:
            return
        for t in ts:
            if t is not None and not self.held(t) and t.is_allocated():
                self.tt.call("deallocate", self.ttnn.deallocate, t, force=False)

    # -- head layouts ---------------------------------------------------------------------------
    def heads_first(self, t, heads, d):
        """[1, 1, T, heads*d] -> [1, heads, T, d]."""
        rows = self.shape(t)[2]
        per_head = self.reshape(t, (1, rows, heads, d))
        return self.permute(per_head, (0, 2, 1, 3))

    def heads_last(self, t):
        """[1, heads, T, d] -> [1, 1, T, heads*d]."""
        _, heads, rows, d = self.shape(t)
        if d % TILE_SIZE == 0:
            return self.tt.call(
                "experimental.nlp_concat_heads",
                self.ttnn.experimental.nlp_concat_heads,
                t,
                memory_config=self.dram,
            )
        p = self.permute(t, (0, 2, 1, 3))
        return self.reshape(p, (1, 1, rows, heads * d))

    # -- host to device ---------------------------------------------------------------------------
    def host_rows(self, arrays, dtype, layout):
        """A mesh tensor from host f32 arrays [1, 1, r, c]: one array (replicated) or one per
        device (sharded along the mesh)."""
        ttnn = self.ttnn
        if len(arrays) == 1:
            mapper = ttnn.replicate_tensor_to_mesh_mapper(self.device)
            data = arrays[0]
        else:
            mapper = ttnn.shard_tensor_to_mesh_mapper(self.device, 3)
            data = np.concatenate(arrays, axis=3)
        return self.tt.call(
            "Tensor",
            ttnn.Tensor,
            np.array(data, dtype=np.float32, order="C"),
            data_type=dtype,
            layout=layout,
            device=self.device,
            mem_config=self.dram,
            mesh_mapper=mapper,
        )

    def derived(self, vec, key, make):
        """A per-op form of vector weight `vec` (a DT with host values), made once by
        `make(list of per-device host arrays)` and kept with the weight."""
        t = vec.derived.get(key)
        if t is None:
            t = make(vec.host)
            vec.derived[key] = self.protect(t, vec)
        return t

    def row_of(self, vec, key, dtype, transform=None):
        """A vector's values as a [1, 1, 1, n] TILE row (per device), optionally transformed on the
        host (e.g. 1 + w), kept with the vector."""

        def make(host):
            arrays = []
            for h in host:
                v = h.reshape(-1).astype(np.float32)
                if transform is not None:
                    v = transform(v).astype(np.float32)
                arrays.append(v.reshape(1, 1, 1, -1))
            return self.host_rows(arrays, dtype, self.ttnn.TILE_LAYOUT)

        return self.derived(vec, key, make)
