"""Uploads, downloads, stored bytes, device copies and sizes of ABI tensors (a mesh mixin).

Matrix uploads keep the host's packed tile bytes exactly: ttnn 0.81.1 has no Python constructor
that wraps raw tile bytes in a TensorSpec (`ttnn.Tensor(...)` and `ttnn.from_buffer` convert
values; `HostBuffer` has no Python constructor taking bytes; the dlpack view of a host buffer is
read-only). Its tensor file format, however, is a 384-byte flatbuffer header followed by the host
buffer's bytes verbatim, and `ttnn.load_tensor` reads that buffer back without conversion. So a
matrix part is uploaded as: the header of a tensor of the same shape, dtype and TILE layout (made
once per shape by dumping a zero tensor, cached), then the part's bytes, written to a private
file in /dev/shm and loaded with `ttnn.load_tensor`, then `ttnn.to_device`. Sharded parts become
one mesh tensor with `ttnn.from_host_shards`; a replicated part is copied to every device by
`to_device`. `host_matrix` is the host tensor of that path (tests read its bytes back through
`host_buffer()` + dlpack and compare).
"""

import os
import tempfile

import numpy as np

from .kv_cache import KV
from .meta import (
    ACTIVATION,
    BF16,
    BFP4_B,
    BFP8_B,
    F32,
    KV_BLOCK,
    MATRIX,
    PARTIAL,
    REPLICATED,
    VECTOR,
    as_meta,
    describe,
    packed_bytes,
    stored_bytes,
)
from .passes import bucket_rows
from .persistent import LiveState
from .staging import RowBuffer, host_view, row_buffer
from .tensors import DT

_headers = {}


def _scratch_file():
    """A new private file (mode 0600) in /dev/shm where writable, else the temporary folder:
    (open binary file, path). The caller unlinks it; nothing else is left behind (the embedded
    interpreter is never finalised, so an atexit clean-up would not run)."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    fd, path = tempfile.mkstemp(prefix="clef_tt_ttnn_", suffix=".tensorbin", dir=base)
    return os.fdopen(fd, "wb"), path


def tt_dtype(ttnn, dtype):
    return {F32: ttnn.float32, BF16: ttnn.bfloat16, BFP8_B: ttnn.bfloat8_b, BFP4_B: ttnn.bfloat4_b}[
        dtype
    ]


def _header(ttnn, rows, cols, dtype):
    """The tensor-file header of a [1, 1, rows, cols] TILE host tensor of `dtype`."""
    key = (rows, cols, dtype)
    h = _headers.get(key)
    if h is None:
        zero = ttnn.Tensor(
            np.zeros((1, 1, rows, cols), np.float32),
            data_type=tt_dtype(ttnn, dtype),
            layout=ttnn.TILE_LAYOUT,
        )
        f, path = _scratch_file()
        f.close()
        try:
            ttnn.dump_tensor(path, zero)
            size = os.path.getsize(path)
            payload = packed_bytes(rows, cols, dtype)
            with open(path, "rb") as f:
                h = f.read(size - payload)
        finally:
            os.unlink(path)
        _headers[key] = h
    return h


def host_matrix(ttnn, rows, cols, dtype, data):
    """A host TILE tensor [1, 1, rows, cols] of `dtype` whose buffer is `data` byte for byte."""
    header = _header(ttnn, rows, cols, dtype)
    f, path = _scratch_file()
    try:
        with f:
            f.write(header)
            f.write(data)
        return ttnn.load_tensor(path)
    finally:
        os.unlink(path)


def host_bytes(t):
    """The raw bytes of a single-shard host tensor's buffer (a copy of `host_view`)."""
    return host_view(t).tobytes()


class Transfers:
    """upload / download / read_stored / device_bytes / copy / free of the mesh."""

    def upload(self, meta, parts):
        """`parts`: bytes-like per device, or one (replicated). Returns the tensor's object."""
        ttnn = self.ttnn
        parts = [memoryview(p).cast("B") for p in parts]
        want = stored_bytes(meta)
        for i, p in enumerate(parts):
            if len(p) != want:
                raise ValueError(
                    "upload: part %d has %d bytes, a %s takes %d"
                    % (i, len(p), describe(meta), want)
                )
        if len(parts) not in (1, self.n):
            raise ValueError("upload: %d parts for a mesh of %d devices" % (len(parts), self.n))
        if meta.placement == REPLICATED:
            parts = parts[:1]
        if meta.role == MATRIX:
            hosts = [
                self.tt.call("load_tensor", host_matrix, ttnn, meta.rows, meta.cols, meta.dtype, p)
                for p in parts
            ]
            host = (
                hosts[0]
                if len(hosts) == 1
                else self.tt.call(
                    "from_host_shards", ttnn.from_host_shards, hosts, self.device.shape
                )
            )
            return self.wrap(
                self.tt.call(
                    "to_device", ttnn.to_device, host, self.device, memory_config=self.dram
                )
            )
        arrays = [
            np.frombuffer(p, dtype=np.float32).reshape(1, 1, meta.rows, meta.cols) for p in parts
        ]
        if meta.role == VECTOR:
            t = self.host_rows(arrays, ttnn.float32, ttnn.ROW_MAJOR_LAYOUT)
            host = [a.reshape(meta.rows, meta.cols).copy() for a in arrays]
            return self.wrap(t, host=host)
        # An activation goes to the device when an op first reads it (tensors.DT); one that a
        # pass may take (replicated) is held padded to the pass's bucket, in a host buffer
        # used again once the rows went to the devices (fresh 20 MB buffers cost their page
        # faults every chunk).
        padded = meta.rows if len(arrays) > 1 else bucket_rows(meta.rows)
        held = []
        for a in arrays:
            h = self.row_buffer((1, 1, padded, meta.cols))
            h[:, :, : meta.rows] = a
            h[:, :, meta.rows :] = 0.0
            held.append(h)
        d = DT(None, pending=(self, held, meta.rows))
        self._live.add(d)
        return d

    # Host row buffers kept for the next uploads, per shape.
    ROW_BUFFERS = 2

    def row_buffer(self, shape):
        """An f32 host buffer of `shape` (values unset): a kept one, else a new `RowBuffer`."""
        kept = self.__dict__.setdefault("_row_buffers", {}).get(shape)
        return kept.pop() if kept else row_buffer(self.ttnn, shape)

    def staged_host(self, array, dtype, layout):
        """A ttnn host tensor holding `array`'s values: a whole `RowBuffer`'s own tensor (the
        golden shadow told of the values written into it), else a new one."""
        host = array.__dict__.get("host") if isinstance(array, RowBuffer) else None
        if host is None or dtype != host.dtype or layout != self.ttnn.ROW_MAJOR_LAYOUT:
            return self.tt.call(
                "Tensor",
                self.ttnn.Tensor,
                np.ascontiguousarray(array),
                data_type=dtype,
                layout=layout,
            )
        if self.tt.shadow is not None:
            self.tt.shadow.host_rewritten(host, np.asarray(array))
        return host

    def return_row_buffers(self, arrays):
        """Host buffers an upload no longer needs (tensors.DT), kept for the next ones."""
        pool = self.__dict__.setdefault("_row_buffers", {})
        for a in arrays:
            kept = pool.setdefault(a.shape, [])
            if len(kept) < self.ROW_BUFFERS:
                kept.append(a)

    def _device_part(self, t, device):
        """Device `device`'s shard of mesh tensor `t`, read back to the host."""
        shard = self.ttnn.get_device_tensors(t)[device]
        return self.tt.call("from_device", self.ttnn.from_device, shard)

    def _check_device(self, op, device):
        if not 0 <= device < self.n:
            raise ValueError("%s: device %d of a mesh of %d" % (op, device, self.n))

    def download(self, meta, obj, device):
        """Device `device`'s part as row-major f32 [rows, cols] bytes (matrices decoded)."""
        a = self.download_values(meta, obj, device)
        if a.dtype == np.uint16:
            a = (a.astype(np.uint32) << 16).view(np.float32)
        return a.tobytes()

    def download_values(self, meta, obj, device):
        """Device `device`'s part as a 1-D contiguous array of its rows * cols row-major values:
        f32, or bf16 bit patterns (uint16) for a bf16 tensor (the bridge widens them while it
        copies them out, so a download is one read of the device's bytes and one copy).

        A bf16 or f32 tile tensor is untilized on the device first (one program, a fraction of
        the chunk's device time) and its host buffer is read in place (dlpack): converting tiles
        on the host (`to_dtype` + `to_numpy`) took ~3x the host time for a 1,024-token chunk's
        hidden rows. Other formats (bfp8/bfp4 matrices) are decoded on the host."""
        self._check_device("download", device)
        ttnn = self.ttnn
        shadow = self.tt.shadow
        if shadow is not None:
            shadow.purge()
        t = self.kv_rows(obj) if isinstance(obj, KV) else obj.t
        n = meta.rows * meta.cols
        if shadow is not None:
            # The golden-shadow mode (golden/): the values ttnn's golden functions computed.
            a = np.asarray(shadow.values(t, device), dtype=np.float32).reshape(-1)
        elif t.dtype in (ttnn.bfloat16, ttnn.float32) and t.layout == ttnn.ROW_MAJOR_LAYOUT:
            # Rows already untilized on the device (a pass's output, passes.py).
            a = host_view(self._device_part(t, device))
            a = a.view(np.uint16 if t.dtype == ttnn.bfloat16 else np.float32)
        elif t.dtype in (ttnn.bfloat16, ttnn.float32) and t.layout == ttnn.TILE_LAYOUT:
            rm = self.tt.call(
                "to_layout", ttnn.to_layout, t, ttnn.ROW_MAJOR_LAYOUT, memory_config=self.dram
            )
            a = host_view(self._device_part(rm, device))
            a = a.view(np.uint16 if t.dtype == ttnn.bfloat16 else np.float32)
            del rm
        else:
            part = self._device_part(t, device)
            if part.dtype != ttnn.float32:
                part = ttnn.to_dtype(part, ttnn.float32)
            a = part.to_numpy().reshape(-1)
        if a.size < n:
            raise ValueError(
                "download: the device returned %d values, %s holds %d" % (a.size, describe(meta), n)
            )
        if isinstance(obj, KV):
            self.drop(t)
        return np.ascontiguousarray(a[:n])

    def read_stored(self, meta, obj, device):
        """Device `device`'s part as uploaded: tile bytes of a matrix, f32 rows otherwise."""
        self._check_device("read_stored", device)
        if meta.role != MATRIX:
            return self.download(meta, obj, device)
        if self.tt.shadow is not None:
            data = self.tt.shadow.stored_bytes(obj.t, device, tt_dtype(self.ttnn, meta.dtype))
        else:
            data = host_bytes(self._device_part(obj.t, device))
        return data[: stored_bytes(meta)]

    def footprint(self, t):
        """Bytes one device's allocator holds for device tensor `t` (interleaved: the same
        number of pages in every bank)."""
        if t is None or not t.is_allocated():
            return 0
        pages, page = t.buffer_num_pages(), t.buffer_aligned_page_size()
        banks = self.dram_banks
        return (pages + banks - 1) // banks * banks * page

    def device_bytes(self, meta, obj):
        """Device memory of all parts together (a paged KV cache: its whole pool, or its own
        blocks of the passes' shared pools; a pass's DeltaNet state: its live buffer's size)."""
        if isinstance(obj, KV) and obj.pool.shared is not None:
            p = obj.pool
            block = KV_BLOCK * p.heads * p.dp * 2
            return len(obj.blocks) * block * self.n
        if isinstance(obj, LiveState):
            return self.footprint(obj.live.buffer(obj.layer, obj.which)) * self.n
        ts = obj.tensors()
        return sum(self.footprint(t) for t in ts) * self.n

    def copy(self, meta, obj):
        """A new tensor with its own device buffers and the same values (ttnn.clone)."""
        if isinstance(obj, KV):
            return self.kv_copy(obj)
        return self.wrap(
            self.tt.call("clone", self.ttnn.clone, obj.t, memory_config=self.dram), host=obj.host
        )

    def allocate(self, meta):
        """Device memory for `meta` on every device, values unset (no host data): matrices
        [1, 1, in, out] TILE in their format, vectors f32 ROW_MAJOR, activations TILE in the
        activation dtype; a partial descriptor f32 (what a plan allocates for the f32 DeltaNet
        states: partial sums themselves are in the activation dtype)."""
        ttnn = self.ttnn
        meta = as_meta(meta)
        if meta.role == MATRIX:
            dtype, layout = tt_dtype(ttnn, meta.dtype), ttnn.TILE_LAYOUT
        elif meta.role == VECTOR:
            dtype, layout = ttnn.float32, ttnn.ROW_MAJOR_LAYOUT
        else:
            dtype = ttnn.float32 if meta.placement == PARTIAL else self.act_dtype
            layout = ttnn.TILE_LAYOUT
        t = self.tt.call(
            "allocate_tensor_on_device",
            ttnn.allocate_tensor_on_device,
            ttnn.Shape([1, 1, meta.rows, meta.cols]),
            dtype,
            layout,
            self.device,
            self.dram,
        )
        return self.wrap(t)

    def free(self, meta, obj):
        """Release the tensor's device buffers now (the bridge calls this when the ABI frees it;
        dropping the last reference has the same effect later)."""
        if obj is None:
            return
        if meta is not None and as_meta(meta).role != ACTIVATION and self.traces:
            # A weight traces read is going: they go first.
            self.trace_release_all()
        obj.release(self.ttnn)
