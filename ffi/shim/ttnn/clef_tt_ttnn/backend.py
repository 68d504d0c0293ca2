"""The backend (clef_tt::Backend of ffi/shim/backend.hpp): the ttnn version check, visible
chips, and opening meshes exactly as the Tenstorrent port does (Tenstorrent's documentation):

- `ttnn.set_fabric_config(FABRIC_1D)` once per process before the first mesh opens; reference
  counted over open meshes and parents, `DISABLED` again after the last one closed;
- `ttnn.open_mesh_device(MeshShape(1, cols), l1_small_size=..., trace_region_size=...,
  num_command_queues=...)`, program cache on;
- a parent (1x`parent_cols`) and its 1x`cols` submesh at column `submesh_offset` through
  `create_submesh(MeshShape(1, cols), MeshCoordinate(0, offset))`; a submesh closes before its
  parent (the core keeps the parent alive while a submesh is open; `Parent.close()` closes it).
"""

import os

from .mesh import Mesh, check_kept
from .trace import DEFAULT_TRACE_REGION, trace_mode

TTNN_VERSION = "0.81.1"

_fabric_users = 0


def _reason(error):
    """The message of a tt-metal exception (the line after its "info:"), else its first line."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    if "info:" in lines and lines.index("info:") + 1 < len(lines):
        return lines[lines.index("info:") + 1]
    return lines[0] if lines else repr(error)


def _ttnn_version(ttnn):
    v = getattr(ttnn, "__version__", None)
    if isinstance(v, str) and v[:1].isdigit():
        return v
    try:
        from importlib.metadata import version

        return version("ttnn")
    except Exception:
        return str(v)


class Parent:
    """A parent mesh that submeshes are taken from (clef_tt::ParentMesh)."""

    def __init__(self, backend, device):
        self.backend = backend
        self.device = device
        self.closed = False

    def close(self):
        if self.closed:
            return
        self.closed = True
        ttnn = self.backend.ttnn
        try:
            for sub in self.device.get_submeshes():
                ttnn.close_mesh_device(sub)
            ttnn.synchronize_device(self.device)
        finally:
            ttnn.close_mesh_device(self.device)
            self.backend._fabric_release()


class Backend:
    """clef_tt::Backend over ttnn 0.81.1's Python API (see the module docstring)."""

    name = "ttnn"

    def __init__(self):
        try:
            import ttnn
        except ImportError as e:
            raise RuntimeError(
                "the ttnn backend needs the ttnn Python package %s: "
                "pip install ttnn==%s (%s)" % (TTNN_VERSION, TTNN_VERSION, e)
            ) from e
        found = _ttnn_version(ttnn)
        if found != TTNN_VERSION:
            raise RuntimeError(
                "the ttnn backend is written for ttnn %s, found ttnn %s: "
                "pip install ttnn==%s, or build tt-metal from a clean checkout "
                "at its v%s tag (a tt-model image: source.tt_metal)"
                % (TTNN_VERSION, found, TTNN_VERSION, TTNN_VERSION)
            )
        self.ttnn = ttnn
        self.version = found

    # -- fabric -----------------------------------------------------------------------------------
    def _fabric_acquire(self):
        global _fabric_users
        if _fabric_users == 0:
            self.ttnn.set_fabric_config(self.ttnn.FabricConfig.FABRIC_1D)
        _fabric_users += 1

    def _fabric_release(self):
        global _fabric_users
        _fabric_users -= 1
        if _fabric_users == 0:
            self.ttnn.set_fabric_config(self.ttnn.FabricConfig.DISABLED)

    # -- Backend ---------------------------------------------------------------------------------
    def visible_devices(self):
        """Chips this process can open (in mock mode: the cluster descriptor's)."""
        return int(self.ttnn.get_num_devices())

    def hardware(self):
        """What runs the ops: 'mock' (tt-metal's mock cluster: real validation and allocation,
        no data), 'simulator' (TT_METAL_SIMULATOR) or 'silicon'."""
        if os.environ.get("TT_METAL_MOCK_CLUSTER_DESC_PATH"):
            return "mock"
        if os.environ.get("TT_METAL_SIMULATOR"):
            return "simulator"
        return "silicon"

    def _open_line(self, cols, config):
        ttnn = self.ttnn
        # Passes are replayed from traces (passes.py): a region for them unless the config
        # names one (or tracing is off).
        region = int(config.get("trace_region_size", 0))
        if region == 0 and trace_mode() == "traced":
            region = DEFAULT_TRACE_REGION
        device = ttnn.open_mesh_device(
            mesh_shape=ttnn.MeshShape(1, int(cols)),
            l1_small_size=int(config.get("l1_small_size", 0)),
            trace_region_size=region,
            num_command_queues=int(config.get("num_command_queues", 1) or 1),
        )
        device.enable_program_cache()
        return device

    def open(self, config):
        """A 1x`cols` mesh opened directly."""
        check_kept(config)
        self._fabric_acquire()
        try:
            device = self._open_line(config["cols"], config)
        except BaseException:
            self._fabric_release()
            raise
        return Mesh(self.ttnn, device, config, on_close=self._fabric_release)

    def open_parent(self, config):
        check_kept(config)
        self._fabric_acquire()
        try:
            device = self._open_line(config["parent_cols"], config)
        except BaseException:
            self._fabric_release()
            raise
        return Parent(self, device)

    def open_submesh(self, parent, config):
        check_kept(config)
        ttnn = self.ttnn
        cols, offset = int(config["cols"]), int(config.get("submesh_offset", 0))
        sub = parent.device.create_submesh(ttnn.MeshShape(1, cols), ttnn.MeshCoordinate(0, offset))
        sub.enable_program_cache()
        return Mesh(ttnn, sub, config, parent=parent)

    def describe(self):
        """The backend as clef_tt_describe reports it: {"backend", "hardware", "runtime",
        "devices"}; an open mesh's describe() has its grid and memory."""
        facts = {
            "backend": self.name,
            "hardware": self.hardware(),
            "runtime": "ttnn " + self.version,
        }
        try:
            facts["devices"] = self.visible_devices()
        except RuntimeError as e:
            # No chips (an image build): ttnn raises "No chips detected in the cluster". The
            # backend itself loaded, which is what `clef-tt devices --check` asks.
            facts["devices"] = None
            facts["devices_error"] = _reason(e)
        return facts
