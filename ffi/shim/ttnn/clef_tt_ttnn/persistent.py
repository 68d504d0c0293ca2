"""Device tensors of a pass that live at fixed addresses (passes.py): what a traced pass reads
and writes besides its inputs, and the ABI tensors that stand for them.

- `StateSet`: DeltaNet states at fixed addresses, per DeltaNet layer the conv carry (ROW_MAJOR
  bf16 [1, 1, 3, channels], the form the native conv reads) and the recurrent state (TILE f32
  [1, 1, value_heads * key_dim, value_dim]). The live set is the state every solo pass
  continues: a pass reads it (or zeros, from a sequence's start) and leaves its own final state
  in it, so the next chunk of a prompt continues in place, with no copy, and every trace reads
  and writes the same buffers. A batched pass keeping prefixes' states writes each kept
  prefix's into a set of its own (per traced form and block).
- `LiveState`: the ABI tensor a pass returns for one of them, valid while the buffers hold that
  pass's state (the set's generation). Before a pass overwrites a set, every such tensor the
  caller still holds and did not give up (`consume`) is copied into buffers of its own (a
  prefix-cache slot keeping a state); one the caller gave up is stale from then on, and using
  it is an error, never a silently wrong state.
- `View`: the first `rows` rows of a persistent tensor the mesh keeps (a pass's output rows,
  valid until that bucket's next pass), freed with nothing.
"""

import weakref


class StaleState(RuntimeError):
    """A DeltaNet state handle whose pass's state was overwritten (a caller bug)."""


class LiveState:
    """An ABI tensor holding DeltaNet layer `layer`'s carry (`which` 0) or state (1) as pass
    generation `gen` left it: in the live buffers, or in buffers of its own once materialized."""

    __slots__ = ("live", "layer", "which", "gen", "own", "__weakref__")

    def __init__(self, live, layer, which, gen):
        self.live, self.layer, self.which, self.gen, self.own = live, layer, which, gen, None

    def current(self):
        return self.own is None and self.gen == self.live.gen

    @property
    def t(self):
        if self.own is not None:
            return self.own
        if self.gen != self.live.gen:
            raise StaleState(
                "a DeltaNet state of a pass that later passes overwrote (layer %d): keep a copy "
                "of a state before the next pass, or do not mark it consumed" % self.layer
            )
        return self.live.buffer(self.layer, self.which)

    def tensors(self):
        return [self.own] if self.own is not None else []

    def release(self, ttnn):
        if self.own is not None and self.own.is_allocated():
            ttnn.deallocate(self.own, force=False)
        self.own = None
        self.gen = -1


class StateSet:
    """DeltaNet buffers at fixed addresses and the handles standing for their contents."""

    def __init__(self):
        self.carry, self.state = {}, {}
        # Per layer: (channels, rows, cols) its buffers were made for.
        self.dims = {}
        self.gen = 0
        self.handles = weakref.WeakSet()
        # The (layer, which, Meta) a handle's result check passed for (the mesh's `check`:
        # the buffers keep their shapes).
        self.checked = set()

    def tensors(self):
        return list(self.carry.values()) + list(self.state.values())

    def buffer(self, layer, which):
        return (self.carry if which == 0 else self.state)[layer]

    def ensure(self, mesh, layer, channels, rows, cols):
        """Layer `layer`'s buffers (carry [1, 1, 3, channels] bf16 ROW_MAJOR, state [1, 1, rows,
        cols] f32 TILE), allocated on first use (before any trace reads them)."""
        made = self.dims.get(layer)
        if made is not None:
            if made != (channels, rows, cols):
                c, s = self.carry[layer], self.state[layer]
                raise ValueError(
                    "DeltaNet layer %d: live buffers %s / %s, a pass of %d channels / [%d, %d]"
                    % (layer, list(c.shape), list(s.shape), channels, rows, cols)
                )
            return
        ttnn = mesh.ttnn
        self.carry[layer] = mesh.protect(
            mesh.tt.call(
                "allocate_tensor_on_device",
                ttnn.allocate_tensor_on_device,
                ttnn.Shape([1, 1, 3, channels]),
                ttnn.bfloat16,
                ttnn.ROW_MAJOR_LAYOUT,
                mesh.device,
                mesh.dram,
            ),
            mesh,
        )
        self.state[layer] = mesh.protect(mesh.zeros((1, 1, rows, cols), ttnn.float32), mesh)
        self.dims[layer] = (channels, rows, cols)

    def handle(self, mesh, layer, which):
        h = mesh.track(LiveState(self, layer, which, self.gen))
        self.handles.add(h)
        return h

    def before_overwrite(self, mesh, consumed):
        """Before a pass writes the buffers: the current handles the caller still holds are
        materialized, except `consumed` ones (ids), which go stale."""
        for h in list(self.handles):
            if not h.current():
                continue
            if id(h) in consumed:
                h.gen = -1
                continue
            src = self.buffer(h.layer, h.which)
            h.own = mesh.tt.call("clone", mesh.ttnn.clone, src, memory_config=mesh.dram)

    def restore(self, mesh, layer, carry, state):
        """Copy a state held elsewhere (`carry`, `state`: device tensors) into layer `layer`'s
        buffers (a pass continuing a prefix-cache slot)."""
        copy = mesh.ttnn.copy
        mesh.tt.call("copy", copy, carry, self.carry[layer])
        mesh.tt.call("copy", copy, state, self.state[layer])


class View:
    """The first `rows` rows of persistent tensor `t` (see the module docstring)."""

    __slots__ = ("t", "rows", "__weakref__")

    def __init__(self, t, rows):
        self.t, self.rows = t, rows

    def tensors(self):
        return []

    def release(self, ttnn):
        self.t = None
