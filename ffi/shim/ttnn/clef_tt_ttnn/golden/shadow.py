"""`Shadow`: the dispatcher hook of the golden-shadow mode (see __init__.py): a twin (one torch
tensor per device) for every tensor a mesh's ttnn calls make, computed by the op's golden
function or its own shadow (ops.py), and the values downloads return."""

import time

import numpy as np
import torch

from . import ops


class ShadowError(RuntimeError):
    """A tensor without a twin, an op without a shadow, or a shadow of the wrong shape."""


class Frozen:
    """A device tensor as a call recorded in a trace capture saw it: its twin's key and what
    the shadows read of it (shape, dtype, layout). The recorded call runs again on every replay
    (trace.py), when the tensor object itself is long gone; its buffer is still where the
    captured commands read and write."""

    __slots__ = ("key", "shape", "dtype", "layout")

    def __init__(self, key, t):
        self.key = key
        self.shape, self.dtype, self.layout = t.shape, t.dtype, t.layout

    def buffer_address(self):
        return self.key[0]

    def is_allocated(self):
        return True


class Shadow:
    """Twins of one mesh's tensors; called by the mesh's Dispatcher after every ttnn call."""

    def __init__(self, mesh):
        # The goldens run on tiny host tensors next to ttnn's own threads: torch's thread pool
        # only spins against them (a 2-core machine ran the delta rule's golden ~80x slower).
        torch.set_num_threads(1)
        self.mesh = mesh
        self.ttnn = mesh.ttnn
        self.n = mesh.n
        self._dev = {}  # (address, shape, dtype, layout) -> [torch tensor per device]
        self._host = {}  # id(host tensor) -> (tensor, [torch tensor per shard])
        self.calls = {}  # op name -> ("golden" | "own", calls, host seconds)
        self.pending_free = {}  # id(tensor) -> its key, taken just before a deallocate
        # The calls of an open trace capture (trace.py), or None.
        self.recording = None

    # -- keys and twins ---------------------------------------------------------------------------
    def is_tensor(self, x):
        return isinstance(x, (self.ttnn.Tensor, Frozen))

    def on_device(self, t):
        return isinstance(t, Frozen) or self.ttnn.is_tensor_storage_on_device(t)

    def key(self, t):
        if isinstance(t, Frozen):
            return t.key
        return (
            int(t.buffer_address()),
            tuple(int(d) for d in t.shape),
            str(t.dtype),
            str(t.layout),
        )

    def twins(self, t):
        """The per-device twins of `t` (a list of n torch tensors, or of its host shards)."""
        if not self.on_device(t):
            hit = self._host.get(id(t))
            if hit is None or hit[0] is not t:
                raise ShadowError(
                    "golden shadow: a host tensor %s without a shadow value" % list(t.shape)
                )
            return hit[1]
        hit = self._dev.get(self.key(t))
        if hit is None:
            raise ShadowError(
                "golden shadow: no shadow value for the device tensor %s %s at %d "
                "(made outside the dispatcher?)" % (list(t.shape), t.dtype, t.buffer_address())
            )
        return hit

    def twin(self, t, device):
        return self.twins(t)[device]

    def set(self, t, values, name):
        """Store per-device `values` as the twin of result `t`, as `t` stores them (its dtype) and
        with its shape."""
        from ttnn.operations.golden_common import golden_to_output_dtype

        shape = tuple(int(d) for d in t.shape)
        out = []
        for v in values:
            if not isinstance(v, torch.Tensor):
                raise ShadowError("golden shadow: %s gave %r, not a tensor" % (name, type(v)))
            if tuple(v.shape) != shape:
                if v.numel() != int(np.prod(shape)) or name not in ops.RESHAPED_OUTPUTS:
                    raise ShadowError(
                        "golden shadow: %s gave %s for a device result %s"
                        % (name, list(v.shape), list(shape))
                    )
                v = v.reshape(shape)
            out.append(golden_to_output_dtype(v.detach(), t.dtype).contiguous())
        if len(out) != self.n and self.on_device(t):
            raise ShadowError(
                "golden shadow: %s gave %d shards for %d devices" % (name, len(out), self.n)
            )
        if self.on_device(t):
            self._dev[self.key(t)] = out
        else:
            self._host[id(t)] = (t, out)

    def host_rewritten(self, t, data):
        """Host tensor `t` borrows `data`'s memory, which the host wrote again (no ttnn call
        saw it): its twin is the values now, as a new `ttnn.Tensor(data)` would have."""
        ops.tensor(self, "Tensor", None, (data,), {}, t)

    def purge(self):
        """Drop the twins of tensors no longer alive. Between ABI ops (a download) the only
        device tensors alive are the mesh's ABI tensors (with their derived forms and KV pools)
        and its internal ones; tensors freed by a release or by the garbage collector leave
        their twins behind otherwise (their keys are only overwritten when an address is used
        again). A twin purged too early would fail loudly (no shadow value), never silently."""
        from ..kv_cache import KV

        keep = set()
        for obj in list(self.mesh._live):
            if isinstance(obj, KV) and obj.released:
                continue
            for t in obj.tensors():
                if t is not None and t.is_allocated():
                    keep.add(self.key(t))
        for t in self.mesh.tensors():
            if t is not None and t.is_allocated():
                keep.add(self.key(t))
        self._dev = {k: v for k, v in self._dev.items() if k in keep}

    def forget_host(self, t):
        self._host.pop(id(t), None)

    def arg(self, x, device):
        """A call argument as the golden of device `device` takes it."""
        if self.is_tensor(x):
            return self.twin(x, device)
        if isinstance(x, (list, tuple)) and any(self.is_tensor(e) for e in x):
            return [self.arg(e, device) for e in x]
        return x

    # -- the dispatcher hooks ---------------------------------------------------------------------
    def before(self, name, args):
        """Before a call: a deallocated tensor has no address any more, so take its key now."""
        if name == "deallocate" and args and self.is_tensor(args[0]):
            t = args[0]
            if t.is_allocated() and self.on_device(t):
                self.pending_free[id(t)] = self.key(t)

    def __call__(self, name, fn, args, kwargs, result):
        handler = ops.HANDLERS.get(name)
        if handler is None:
            raise ShadowError("golden shadow: no golden function or shadow for ttnn op %r" % name)
        kind, body = handler
        if self.recording is not None:
            # Inside a trace capture: recorded, computed at every replay (see begin_capture).
            self._record(name, fn, args, kwargs, result)
            return
        t0 = time.perf_counter()
        body(self, name, fn, args, kwargs, result)
        calls, seconds = self.calls.get(name, (kind, 0, 0.0))[1:]
        self.calls[name] = (kind, calls + 1, seconds + time.perf_counter() - t0)

    # -- trace capture and replay -----------------------------------------------------------------
    def _freeze(self, x):
        if isinstance(x, self.ttnn.Tensor) and self.on_device(x):
            return Frozen(self.key(x), x)
        if isinstance(x, (list, tuple)):
            return type(x)(self._freeze(e) for e in x)
        if isinstance(x, dict):
            return {k: self._freeze(v) for k, v in x.items()}
        return x

    def _record(self, name, fn, args, kwargs, result):
        if name == "deallocate":
            key = self.pending_free.pop(id(args[0]), None)
            if key is not None and not args[0].is_allocated():
                self.recording.append((name, fn, key, None, None))
            return
        self.recording.append(
            (name, fn, self._freeze(args), self._freeze(kwargs), self._freeze(result))
        )

    def begin_capture(self):
        """A trace capture starts: from here every call is recorded and not computed. On chips
        a capture computes nothing either (its commands are only recorded): the replays do."""
        if self.recording is not None:
            raise ShadowError("golden shadow: a trace capture inside another")
        self.recording = []

    def end_capture(self):
        """The calls recorded since `begin_capture`."""
        calls, self.recording = self.recording, None
        return calls or []

    def replay(self, calls):
        """A trace replay: every recorded call again, from the twins its tensors' buffers hold
        now (the persistent inputs as the host last wrote them), writing its results' twins."""
        for name, fn, args, kwargs, result in calls:
            if name == "deallocate":
                self._dev.pop(args, None)
                continue
            kind, body = ops.HANDLERS[name]
            t0 = time.perf_counter()
            body(self, name, fn, args, kwargs, result)
            label = "%s (replayed)" % name
            calls_, seconds = self.calls.get(label, (kind, 0, 0.0))[1:]
            self.calls[label] = (kind, calls_ + 1, seconds + time.perf_counter() - t0)

    def report(self):
        """One line per op: golden or own shadow, calls, host seconds of the shadow."""
        rows = sorted(self.calls.items(), key=lambda kv: -kv[1][2])
        lines = [
            "golden-shadow op %-50s %-6s %7d calls %8.2f s" % (name, kind, n, s)
            for name, (kind, n, s) in rows
        ]
        held = sum(v.numel() * v.element_size() for twins in self._dev.values() for v in twins)
        lines.append(
            "golden-shadow twins held: %d device tensors, %.1f MB" % (len(self._dev), held / 1e6)
        )
        return "\n".join(lines)

    # -- reads ------------------------------------------------------------------------------------
    def values(self, t, device):
        """Device `device`'s shadow values of `t` as a flat f32 numpy array."""
        return self.twin(t, device).detach().to(torch.float32).reshape(-1).numpy()

    def stored_bytes(self, t, device, dtype):
        """The tile bytes a TILE matrix `t` of ttnn dtype `dtype` holds on `device` (repacked by
        ttnn's host conversion from its shadow values)."""
        from ..transfers import host_bytes

        v = self.twin(t, device).detach().to(torch.float32).contiguous()
        host = self.ttnn.Tensor(v.numpy(), data_type=dtype, layout=self.ttnn.TILE_LAYOUT)
        return host_bytes(host)
