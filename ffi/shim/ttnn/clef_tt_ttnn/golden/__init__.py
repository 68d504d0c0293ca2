"""The golden-shadow mode of the ttnn backend (`CLEF_TT_GOLDEN=1`): the model's numbers through
ttnn's own definition of each op.

Every ttnn call of a mesh goes through its dispatcher (dispatch.py); in this mode the dispatcher's
`shadow` hook is a `Shadow` (shadow.py). After each call it recomputes the call's output on the
host with the op's own ttnn golden function (`ttnn.get_golden_function(op)`, torch), once per
device, from the shadow values of the call's inputs, and keeps the result as the shadow value
(the "twin": one torch tensor per device shard) of the call's output tensor. Downloads return
the twins (`Transfers.download` / `read_stored` ask the shadow), so everything the core reads
back — hidden states, logits, KV rows — is what ttnn's definitions of the ops compute, while the
device side still runs the real ttnn validation, dispatch and allocation (in tt-metal's mock mode
device data are zeros). Ops that have no golden function in ttnn 0.81.1 get a shadow written
from their documented semantics (ops.py lists each).

Conventions (docs/ttnn-goldens.md):
- goldens take the STORED values of their inputs (bf16 tensors as torch bf16, f32 as f32,
  bfloat8_b / bfloat4_b matrices as the float values their tiles decode to), exactly what ttnn's
  comparison mode feeds them; each golden output is then stored as the device tensor stores it
  (`golden_to_output_dtype(out, result.dtype)`: bf16 rounding, bfp8/bfp4 re-packing);
- device-only arguments (memory, program and compute-kernel configs, the delta rule's constant
  tiles) are not passed; `ttnn.reshape`'s golden takes (x, shape) only;
- the collectives' goldens get the list of per-device twins and the mesh metadata
  (`_ttnn_golden_mesh_shape`, `_ttnn_golden_mesh_shard_dims`) and return one composed tensor that
  is cut back into per-device shards (reduce_scatter: chunk i for device i).

Identity of a device tensor: ttnn 0.81.1's Tensor takes neither attributes nor weak references,
so a twin is keyed by the tensor's device buffer address with its shape, dtype and layout (a
reshape view shares the address but not the shape). Every tensor the package creates comes out
of a dispatched call, so a key whose buffer was freed and re-used is overwritten before it is
read; an explicit deallocation that frees the buffer drops the twin. Host tensors (matrix
uploads before `to_device`) are keyed by object and held until moved to the device.

Test hook: `CLEF_TT_GOLDEN_MUTATE=NAME` (only in this mode) installs a deliberate convention change
in the op mapping (mutate.py), to show that the golden shadow catches it.

Needs torch (imported here only: the package keeps importing without it).
"""

import os


def enabled():
    return os.environ.get("CLEF_TT_GOLDEN", "") == "1"


def install(mesh):
    """Put a golden shadow on `mesh`'s dispatcher (and the mutation asked for, if any)."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise RuntimeError(
            "CLEF_TT_GOLDEN=1 needs torch in the ttnn environment (pip install torch): %s" % e
        ) from e
    from .shadow import Shadow

    shadow = mesh.tt.shadow = Shadow(mesh)
    if os.environ.get("CLEF_TT_GOLDEN_REPORT", "") == "1":
        # The shadow's calls and host time per op, on stderr when the mesh closes.
        close = mesh.close

        def close_and_report():
            import sys

            sys.stderr.write(shadow.report() + "\n")
            sys.stderr.flush()
            close()

        mesh.close = close_and_report
    mutation = os.environ.get("CLEF_TT_GOLDEN_MUTATE", "")
    if mutation:
        from .mutate import apply

        apply(mesh, mutation)
    return mesh.tt.shadow
