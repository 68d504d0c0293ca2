"""What the C++ core tells this package about a tensor, and the C enums of ffi/include/clef_tt.h.

`Meta` mirrors `clef_tt::Meta` (ffi/shim/backend.hpp): one per-device shape, the format the host
gave, the role and the placement. The enums' integers come from abi.py, generated from the header
(ffi/regenerate-bindings.sh), so the header is their one source. Geometry helpers (tiles, packed
sizes) follow core/tile_format.hpp.
"""

from collections import namedtuple

from .abi import (  # noqa: F401 (the package's names for the C enums)
    ACTIVATION,
    BF16,
    BFP4_B,
    BFP8_B,
    EXACT,
    F32,
    GELU_ERF,
    GELU_TANH,
    HIFI2,
    HIFI3,
    HIFI4,
    LOFI,
    MATRIX,
    PARTIAL,
    REPLICATED,
    ROW_MAJOR,
    SHARDED,
    TILE,
    VECTOR,
)

DTYPE_NAMES = {F32: "f32", BF16: "bf16", BFP8_B: "bfp8_b", BFP4_B: "bfp4_b"}
ROLE_NAMES = {ACTIVATION: "activation", MATRIX: "matrix", VECTOR: "vector"}
PLACEMENT_NAMES = {REPLICATED: "replicated", SHARDED: "sharded", PARTIAL: "partial"}

TILE_SIZE = 32
# Rows of one page of the paged KV cache (the port's block size).
KV_BLOCK = 64

Meta = namedtuple("Meta", "rows cols devices dtype layout role placement")
Meta.__doc__ = (
    "A tensor as the core knows it: per-device [rows, cols], the clef_tt_dtype the "
    "host gave, clef_tt_layout, clef_tt_role and clef_tt_placement (ints of "
    "clef_tt.h)."
)


def f32(x):
    """x rounded to the nearest float32 (nanobind refuses a Python float for a C++ float
    parameter when the value is not exactly representable, e.g. 24 ** -0.5)."""
    import numpy as np

    return float(np.float32(x))


def tiles(n):
    """32-element tiles covering n."""
    return (n + TILE_SIZE - 1) // TILE_SIZE


def round_up(n, m):
    return (n + m - 1) // m * m


def tile_bytes(dtype):
    """Bytes of one 32x32 tile: f32 4096, bf16 2048, bfp8_b 64 + 1024, bfp4_b 64 + 512."""
    return {F32: 4096, BF16: 2048, BFP8_B: 1088, BFP4_B: 576}[dtype]


def packed_bytes(rows, cols, dtype):
    """Bytes of a [rows, cols] matrix as the host packs it (whole tiles)."""
    return tiles(rows) * tiles(cols) * tile_bytes(dtype)


def stored_bytes(meta):
    """Bytes of one device's part as uploaded and read back by read_stored (backend.hpp)."""
    if meta.role == MATRIX and meta.layout == TILE:
        return packed_bytes(meta.rows, meta.cols, meta.dtype)
    return meta.rows * meta.cols * 4


def describe(meta):
    """A short text of a Meta for error messages."""
    return "%dx%d %s %s %s" % (
        meta.rows,
        meta.cols,
        DTYPE_NAMES.get(meta.dtype, "?"),
        ROLE_NAMES.get(meta.role, "?"),
        PLACEMENT_NAMES.get(meta.placement, "?"),
    )


def as_meta(m):
    """A Meta from a Meta, a tuple of its seven fields or a dict with its field names."""
    if isinstance(m, Meta):
        return m
    if isinstance(m, dict):
        return Meta(**{k: int(m[k]) for k in Meta._fields})
    return Meta(*[int(v) for v in m])
