"""clef_tt_ttnn: the op bodies of clef-tt's ttnn backend, driving ttnn 0.81.1 through its public
Python API. The shim's C++ bridge (embedded CPython) calls into it; the C++ core has already
checked every argument and computed every result's Meta (ffi/shim/core), so this package only
computes.

Layout (mirrors ffi/shim/backend.hpp):
- backend.py   `Backend`: version check, visible chips, open / open_parent / open_submesh
- mesh.py      `Mesh` (DeviceMesh): device ids, memory, op statistics, close
- transfers.py upload / download / read_stored / device_bytes / copy / free (staging.py the
               host buffers written to the devices with no conversion)
- fine ops, a module per family (each module's docstring lists its ops; the op table,
  ffi/shim/core/op_table.cpp, declares them): text_ops.py the text prefill's dense and
  elementwise ops and rope, kv_cache.py the paged KV cache, attention.py attention, delta.py
  Gated DeltaNet's, vision.py the vision tower's
- layers.py    layer_op: a whole attention, DeltaNet or MLP sublayer in one call
- passes.py    the layer op "pass": a whole prefill chunk, replayed from a ttnn trace per form
               (pass_plan.py its inputs and KV plan, trace.py capture and replay, persistent.py
               the DeltaNet state at fixed addresses)
- graph.py     command: the mesh commands (ttnn's graph capture, the traces' facts)
- meta.py      `Meta` and the C enums (abi.py, generated from ffi/include/clef_tt.h);
               dispatch.py the per-op call counter; programs.py the compute kernel and
               program configs
Imports only ttnn and numpy (never torch); CPython 3.10 and 3.12.
"""

from . import meta as enums  # noqa: F401
from .backend import TTNN_VERSION, Backend, Parent  # noqa: F401
from .mesh import Mesh  # noqa: F401
from .meta import Meta  # noqa: F401
