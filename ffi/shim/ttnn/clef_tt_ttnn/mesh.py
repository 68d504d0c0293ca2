"""One opened mesh (clef_tt::DeviceMesh of ffi/shim/backend.hpp): device ids, memory, the
op statistics, internal per-mesh constants, and every op through its mixins.

Memory: `memory()` is the bytes per device that the mesh's live ABI tensors hold: for every live
tensor (and a shared KV pool once) its device buffers' footprint as the allocator places them,
`ceil(pages / DRAM banks) * banks * aligned page size` from the tensor's real buffer
(`buffer_num_pages`, `buffer_aligned_page_size`; all tensors are DRAM interleaved, so every bank
holds the same number of pages, and mesh buffers are allocated alike on every device). The
allocator's own totals (`ttnn.get_memory_view`) are reported by `allocator_bytes()`; they also
count what ttnn keeps for itself (reshape mapping tensors, CCL buffers) and this mesh's internal
constants (page tables, DeltaNet constant tiles, rope tables), which are not tensors of the ABI.
"""

import weakref

from .attention import Attention
from .delta import DeltaOps
from .dispatch import Dispatcher
from .golden import enabled as golden_enabled
from .graph import GraphCommands
from .kv_cache import KV, KvCache, SparePools
from .layers import LayerOps
from .meta import ACTIVATION, BF16, DTYPE_NAMES, F32, MATRIX, VECTOR, as_meta
from .meta import describe as meta_text
from .passes import PassOps
from .persistent import LiveState, View
from .programs import eltwise_cores
from .tensors import DT, Helpers
from .text_ops import TextOps
from .trace import Traces
from .transfers import Transfers, tt_dtype
from .vision import VisionOps

# Internal tensors a mesh keeps at most (page tables and rope tables beyond are dropped).
INTERNAL_LIMIT = 64
# Spare KV pool tensors a mesh keeps (kv_cache.SparePools).
KV_SPARE_POOLS = 64


# What this backend keeps, and why it keeps nothing else: the KV cache is read by
# chunked_scaled_dot_product_attention, which takes bf16 (or block-float) K and V only, never
# f32; the DeltaNet gates and state go through chunk_gated_delta_rule, which runs in f32.
KEPT = {
    "kv_dtype": (BF16, "the KV cache", "its attention reads bf16 K/V only", "CLEF_KV_DTYPE=bf16"),
    "gdn_gate_dtype": (
        F32,
        "the DeltaNet gates",
        "the delta rule runs in f32",
        "QWEN36_GDN_GATE_FP32=1",
    ),
    "gdn_state_dtype": (
        F32,
        "the DeltaNet state",
        "the delta rule runs in f32",
        "QWEN_GDN_FP32_STATE=1",
    ),
}


def check_kept(config):
    """Refuses (ValueError, before any device opens) a mesh config asking to keep the KV cache
    or the DeltaNet gates or state in a dtype this backend cannot keep, naming the fix. A key
    the config lacks takes the dtype kept."""
    for key, (dtype, what, why, fix) in KEPT.items():
        asked = int(config.get(key, dtype))
        if asked != dtype:
            raise ValueError(
                f"{what} cannot be kept in {DTYPE_NAMES.get(asked, asked)} on the ttnn backend "
                f"({why}); it keeps {DTYPE_NAMES[dtype]}: set {fix}"
            )


# The fine ops whose methods take their arguments otherwise than (tensors..., params...):
# name -> (tensors, params, list, rope tables) -> the method's positional arguments.
FINE_OP_ARGS = {
    # The matmul numerics as one config dict.
    "linear": lambda t, p, items, tables: (*t, p),
    # The delta rule's sizes as one spec dict.
    "gated_delta_rule": lambda t, p, items, tables: (*t, p),
    # The rope tables the core computed from the positions, and the head layout.
    "rope": lambda t, p, items, tables: (t[0], tables, p["heads"], p["head_dim"]),
    "split_cols": lambda t, p, items, tables: (t[0], list(items)),
    # (start, end) pairs.
    "segment_attention": lambda t, p, items, tables: (
        *t,
        p["heads"],
        p["head_dim"],
        list(zip(items[0::2], items[1::2], strict=True)),
    ),
}


class Mesh(
    Helpers,
    Transfers,
    KvCache,
    Attention,
    TextOps,
    DeltaOps,
    VisionOps,
    LayerOps,
    PassOps,
    Traces,
    GraphCommands,
):
    """An opened 1xN mesh; methods named as DeviceMesh's. Tensor arguments are (meta, obj)
    pairs; results are the objects the bridge keeps for the core's handles."""

    def __init__(self, ttnn, device, config, parent=None, on_close=None):
        self.ttnn = ttnn
        self.device = device
        self.parent = parent
        self.config = dict(config)
        self._on_close = on_close
        self.tt = Dispatcher(ttnn)
        self.dram = ttnn.DRAM_MEMORY_CONFIG
        self.n = int(device.get_num_devices())
        grid = device.compute_with_storage_grid_size()
        self.grid = (int(grid.x), int(grid.y))
        self.eltwise_cores = eltwise_cores(ttnn, self.grid)
        self.act_dtype = (
            ttnn.bfloat16 if int(config.get("activation_dtype", BF16)) == BF16 else ttnn.float32
        )
        self.dram_banks = int(ttnn.get_memory_view(device, ttnn.BufferType.DRAM).num_banks)
        self.internal = {}
        # The last rope tables object the bridge passed and its device tables, per form
        # (text_ops.rope_tables).
        self._rope_last = {}
        # The carry-returning conv's global semaphores (delta.py), made on first use.
        self.conv_semaphores = None
        # KV pool tensors kept for reuse (kv_cache.py): two per attention layer of a model
        # with 32 of them, for one sequence at a time.
        self.kv_spares = SparePools(KV_SPARE_POOLS)
        self.owned = weakref.WeakValueDictionary()
        self._live = weakref.WeakSet()
        self.closed = False
        self.passes_init()
        self.traces_init()
        if golden_enabled():
            from .golden import install

            install(self)

    # -- the fine ops -----------------------------------------------------------------------------
    def op(self, name, tensors, params, items, tables):
        """The ABI's fine-op entry (clef_tt_op): the method of the same name, given the tensors in
        the declared order ((meta, obj) pairs, None for an absent optional one) and then the
        parameters in the declared order (ffi/shim/core/op_table.cpp); the few ops whose methods
        take a config, a list or rope tables get them as those methods take them (FINE_OP_ARGS).
        Returns a result, or a tuple or list of results."""
        shape = FINE_OP_ARGS.get(name)
        if shape is not None:
            return getattr(self, name)(*shape(tensors, params, items, tables))
        return getattr(self, name)(*tensors, *params.values())

    # -- bookkeeping ------------------------------------------------------------------------------
    def wrap(self, t, host=None):
        d = DT(t, host)
        self.protect(t, d)
        self._live.add(d)
        return d

    def tensors(self):
        """The mesh's internal tensors (page tables, constants, rope tables, spare KV pools)."""
        out = [e[3] for e in self.kv_spares.tensors]
        for v in self.internal.values():
            out.extend(v if isinstance(v, tuple) else (v,))
        out.extend(self.persistent_tensors())
        return out

    def track(self, obj):
        self._live.add(obj)
        return obj

    def keep_internal(self, key, value):
        if len(self.internal) >= INTERNAL_LIMIT:
            self.drop_internal(next(iter(self.internal)))
        self.internal[key] = value
        for t in value if isinstance(value, tuple) else (value,):
            self.protect(t, self)

    def internal_once(self, key, make):
        """The mesh's internal tensor(s) under `key`, made by `make()` on first use."""
        hit = self.internal.get(key)
        if hit is None:
            hit = make()
            self.keep_internal(key, hit)
        return hit

    def drop_internal(self, key):
        value = self.internal.pop(key, None)
        for t in value if isinstance(value, tuple) else (value,):
            if t is not None:
                self.owned.pop(id(t), None)
                self.drop(t)

    def op_stats(self):
        """{ttnn op name: (calls, host seconds)} since the last reset_op_stats()."""
        return self.tt.stats()

    def reset_op_stats(self):
        self.tt.reset()

    # -- DeviceMesh ------------------------------------------------------------------------------
    def device_ids(self):
        return [int(i) for i in self.device.get_device_ids()]

    def memory(self):
        """Bytes per device held by the mesh's live tensors (see the module docstring)."""
        seen, total = set(), 0
        for obj in list(self._live):
            if isinstance(obj, KV):
                if obj.released:
                    continue
                ts = obj.tensors()
            else:
                ts = obj.tensors()
            for t in ts:
                if t is None or not t.is_allocated():
                    continue
                key = t.buffer_address()
                if key in seen:
                    continue
                seen.add(key)
                total += self.footprint(t)
        return [total] * self.n

    def internal_bytes(self):
        """Bytes per device of this mesh's internal tensors (page tables, window bounds, rope
        tables, DeltaNet constant tiles, spare KV pools): not ABI tensors, so not in memory()."""
        return sum(self.footprint(t) for t in self.tensors())

    def allocator_bytes(self):
        """The allocator's allocated bytes per device (DRAM, L1), everything included."""
        out = {}
        for name in ("DRAM", "L1"):
            view = self.ttnn.get_memory_view(self.device, getattr(self.ttnn.BufferType, name))
            out[name] = int(view.total_bytes_allocated_per_bank) * int(view.num_banks)
        return out

    def check(self, meta, obj):
        """Check a result against the Meta the core gives it (Storage::bind): per-device shape,
        layout and dtype class (activations in the activation dtype or f32 — partial sums,
        DeltaNet gates and states —, matrices in their dtype, vectors f32 row-major). Placement
        is not visible in a ttnn tensor and is not checked. Raises ValueError naming both."""
        meta = as_meta(meta)
        if meta.devices != self.n:
            raise ValueError(
                "result check: a %s for %d devices on a mesh of %d"
                % (meta_text(meta), meta.devices, self.n)
            )
        if isinstance(obj, KV):
            p = obj.pool
            if meta.role != ACTIVATION or obj.rows != meta.rows or p.heads * p.d != meta.cols:
                raise ValueError(
                    "result check: %s, got a KV cache of %d rows x %d heads x %d"
                    % (meta_text(meta), obj.rows, p.heads, p.d)
                )
            return
        if isinstance(obj, LiveState) and obj.current():
            # A pass's DeltaNet state in its set's buffers: their shapes are checked once.
            key = (obj.layer, obj.which, meta)
            if key in obj.live.checked:
                return
            self._check_tensor(meta, obj)
            obj.live.checked.add(key)
            return
        if isinstance(obj, DT) and obj._t is None and obj.pending is not None:
            # An upload still on the host (tensors.DT): its arrays have the shape.
            a, rows = obj.pending[1][0], obj.pending[2]
            if (rows, a.shape[-1]) != (meta.rows, meta.cols) or meta.role != ACTIVATION:
                raise ValueError("result check: %s, got host rows %s" % (meta_text(meta), a.shape))
            return
        self._check_tensor(meta, obj)

    def _check_tensor(self, meta, obj):
        """`check` of a result held as one ttnn tensor (`obj.t`)."""
        ttnn = self.ttnn
        t = obj.t
        shape = tuple(int(d) for d in t.shape)
        if isinstance(obj, View):
            # A pass's output: the first rows of its bucket's persistent rows.
            shape = shape[:2] + (obj.rows,) + shape[3:]
        if meta.role == MATRIX:
            layout, dtypes = ttnn.TILE_LAYOUT, (tt_dtype(ttnn, meta.dtype),)
        elif meta.role == VECTOR:
            layout, dtypes = ttnn.ROW_MAJOR_LAYOUT, (ttnn.float32,)
        else:
            # Activations (partial sums too) in the activation dtype, or f32 (DeltaNet gates and
            # states); TILE, or ROW_MAJOR bf16 for the native conv's carry (delta.py), the form
            # the next chunk's conv reads.
            layout, dtypes = ttnn.TILE_LAYOUT, (self.act_dtype, ttnn.float32)
            if t.layout == ttnn.ROW_MAJOR_LAYOUT and t.dtype == ttnn.bfloat16:
                layout = t.layout
        if shape != (1, 1, meta.rows, meta.cols) or t.layout != layout or t.dtype not in dtypes:
            raise ValueError(
                "result check: %s, got a tensor %s %s %s"
                % (meta_text(meta), list(shape), t.dtype, t.layout)
            )

    def describe(self):
        view = self.ttnn.get_memory_view(self.device, self.ttnn.BufferType.DRAM)
        trace = self.ttnn.get_memory_view(self.device, self.ttnn.BufferType.TRACE)
        return {
            "devices": self.n,
            "device_ids": self.device_ids(),
            "compute_grid": list(self.grid),
            "dram_bytes_per_device": int(view.total_bytes_per_bank) * int(view.num_banks),
            "dram_banks": int(view.num_banks),
            # The allocator's own count: everything ttnn holds on a device, its own buffers too.
            "dram_allocated_per_device": int(view.total_bytes_allocated_per_bank)
            * int(view.num_banks),
            # The trace region reserved at open (passes.py replays its traces from it).
            "trace_region_bytes": int(trace.total_bytes_per_bank) * int(trace.num_banks),
            "activation_dtype": "bf16" if self.act_dtype == self.ttnn.bfloat16 else "f32",
            # What the mesh keeps (check_kept: the only dtypes this backend keeps).
            **{key: DTYPE_NAMES[dtype] for key, (dtype, *_) in KEPT.items()},
            # Batched passes (layers.py): the cores the delta rule spreads batch x value heads
            # over (batch x value heads per device must not exceed them); 0 where the layer ops
            # do not run (activations or KV not bf16).
            "batch_cores": self.grid[0] * self.grid[1]
            if self.act_dtype == self.ttnn.bfloat16 and self.kv_dtype() == self.ttnn.bfloat16
            else 0,
        }

    def close(self):
        """Close the mesh (the core guarantees no ABI tensor is alive)."""
        if self.closed:
            return
        self.closed = True
        ttnn = self.ttnn
        self.trace_release_all()
        for t in self.persistent_tensors():
            if t.is_allocated():
                ttnn.deallocate(t, force=True)
        for key in list(self.internal):
            self.drop_internal(key)
        for entry in self.kv_spares.tensors:
            if entry[3].is_allocated():
                ttnn.deallocate(entry[3], force=False)
        self.kv_spares.tensors = []
        try:
            ttnn.synchronize_device(self.device)
        finally:
            ttnn.close_mesh_device(self.device)
            if self._on_close is not None:
                self._on_close()
