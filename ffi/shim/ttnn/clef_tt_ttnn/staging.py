"""Host buffers the devices are written from and read into without a conversion.

- `host_view`: a read-only array over a host tensor's memory (dlpack), no copy.
- `RowBuffer`: a writable array over a ttnn host tensor's memory, so what the host writes there
  is that tensor's values (uploads' rows, a pass's inputs: transfers.py, passes.py).
"""

import ctypes
import itertools

import numpy as np


def host_view(t):
    """A 1-D uint8 array viewing (no copy) a single-shard host tensor's buffer (the shard may sit
    at any mesh coordinate: a device's part read back keeps its device's coordinate). The view
    keeps the buffer alive (dlpack's owner), not the tensor."""
    import ttnn

    buf = t.host_buffer()
    shape = buf.shape()
    dims = [int(shape[i]) for i in range(shape.dims())]
    for coord in itertools.product(*[range(d) for d in dims]):
        shard = buf.get_shard(ttnn.MeshCoordinate(*coord))
        if shard is not None:
            return np.from_dlpack(shard).reshape(-1)
    raise ValueError("read_stored: the host tensor holds no shard")


class RowBuffer(np.ndarray):
    """A host row buffer of the uploads (and of a pass's other inputs: passes.py): a writable
    f32 array [1, 1, rows, cols] (or int32, uint32) over the memory of a ttnn host tensor
    (`host`, ROW_MAJOR, the same dtype), so rows the host writes here are that tensor's values
    and go to a device with no conversion (`Transfers.staged_host`): `ttnn.Tensor(array)`
    copies every value, ~1.3 ms for a 1,024-row chunk of Clef 27B. ttnn
    0.81.1 gives a host tensor's memory only as a read-only dlpack view, so the writable view
    is made over the same address (ctypes). Every view of the buffer keeps it (numpy's `base`)
    and so its tensor alive; nothing else holds the address. A buffer goes back to the pool
    only once the device write from it is done (passes.py: a blocking read on the same command
    queue follows it), since the next upload overwrites it."""


def row_buffer(ttnn, shape, dtype=None):
    """A new RowBuffer of `shape` (zeros) in ttnn `dtype`: float32 (the default), int32 or
    uint32."""
    dtype = ttnn.float32 if dtype is None else dtype
    np_type, c_type = {
        ttnn.float32: (np.float32, ctypes.c_float),
        ttnn.int32: (np.int32, ctypes.c_int32),
        ttnn.uint32: (np.uint32, ctypes.c_uint32),
    }[dtype]
    host = ttnn.Tensor(np.zeros(shape, np_type), data_type=dtype, layout=ttnn.ROW_MAJOR_LAYOUT)
    n = int(np.prod(shape))
    memory = host_view(host)
    if memory.nbytes != 4 * n:
        raise ValueError("a host row buffer of %s holds %d bytes" % (shape, memory.nbytes))
    raw = (c_type * n).from_address(memory.ctypes.data)
    buf = np.ctypeslib.as_array(raw).reshape(shape).view(RowBuffer)
    buf.host = host
    return buf
