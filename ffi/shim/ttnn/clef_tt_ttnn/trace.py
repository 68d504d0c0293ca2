"""ttnn traces of a mesh (a mesh mixin): capture a run of ops once, replay it with no host work
per op. passes.py captures whole prefill passes this way.

A trace is the device commands of a sequence of ops, recorded by `ttnn.begin_trace_capture` /
`end_trace_capture` and run again by `ttnn.execute_trace`. Everything an op was given is baked
into its commands: buffer addresses, shapes, scalars. So a traced run reads its inputs from
persistent device tensors allocated before the capture, which the host rewrites before each
replay (never inside a capture: chips refuse host writes, reads and program loads there, and
so does the mock kit, ffi/ttnn-mock), and its results land where the capture put them.

Intermediates. The ops of a capture allocate and free their intermediates as they do eagerly;
the addresses they got are baked into the trace, which writes them on every replay. A device
buffer allocated after the capture at such an address would be overwritten by the next replay
(tt-metal warns: "Allocating device buffers is potentially unsafe due to the existence of an
active trace"). So right after a capture, every DRAM range the capture allocated is taken by a
placeholder tensor (a "plug"): nothing allocated later can land there. The ranges come from
ttnn's own graph capture, run around the trace capture, which reports every buffer allocation
(address per bank and size), the ones ops make inside themselves too. The traces of a mesh
share one arena: replays run one at a time, so their intermediates may overlap. A capture
frees the arena's plugs first (its intermediates then land largely where earlier traces' did)
and plugs the union of every trace's ranges after: ~184 MB per device for the 8 warm-up forms
of Clef 27B, where a plug per trace took 704 MB. ttnn allocates first fit, bottom up, at the
same address in every bank, so a placeholder of a freed range's size lands exactly on it: each
plug's address is checked, and a trace whose ranges cannot be plugged is released (its pass
runs eagerly) and the arena plugged as before it.

Golden shadow (CLEF_TT_GOLDEN=1): a capture records its calls instead of computing them (on
chips a capture computes nothing either) and every replay computes them again from the twins
its buffers hold (golden/shadow.py), so a replayed pass has numbers, and a replay bug (an input
not rewritten, a result read from the wrong buffer) changes them.

`CLEF_TT_TRACE` sets how passes run (`trace_mode`): traced (the default), `eager` (whole
passes, every op dispatched: the traced path without its traces, for bring-up and to check
replays against) or `0` (no whole passes: the caller runs the layers one by one, as before
traces). A mesh command changes it per mesh (passes.py).
"""

import gc
import os
import time

# Traces a mesh holds at most (CLEF_TT_TRACE_MAX): capturing one more releases the one replayed
# least recently.
MAX_TRACES = 16
# Trace region bytes a captured device op takes, estimated from tt-metal's dispatch commands
# (a program's runtime arguments per core, its config, binaries referenced by address, launch
# messages and go signal: ~28 KB for a matmul on 110 cores, 4-15 KB for the small ops; mock
# mode records no commands, so this is arithmetic, to be read off chips:
# `ttnn.get_memory_view(mesh, BufferType.TRACE)`).
TRACE_BYTES_PER_OP = 16 << 10
# Device ops of a Clef 27B pass (1,604 layer-op ops, the row masks' 96, the state copies' 96,
# the rows' tilize and typecast, the output's untilize and copy).
PASS_OPS = 1800
# Trace region of a mesh (bytes per device) when the opening config names none and tracing is
# on: room for MAX_TRACES passes of Clef 27B.
DEFAULT_TRACE_REGION = MAX_TRACES * PASS_OPS * TRACE_BYTES_PER_OP


def max_traces():
    value = os.environ.get("CLEF_TT_TRACE_MAX", "")
    return int(value) if value.isdigit() and int(value) > 0 else MAX_TRACES


MODES = ("traced", "eager", "off")


def trace_mode():
    """How passes run, from CLEF_TT_TRACE: "traced", "eager" or "off" (see the docstring)."""
    value = os.environ.get("CLEF_TT_TRACE", "1").strip().lower()
    return {"0": "off", "off": "off", "eager": "eager"}.get(value, "traced")


class Trace:
    """One captured trace: its id, what it was captured for, the golden calls it replays (in
    golden-shadow mode), its placeholders and its statistics."""

    __slots__ = ("key", "tid", "calls", "ranges", "ops", "replays", "capture_s", "used")

    def __init__(self, key, tid):
        self.key, self.tid = key, tid
        self.calls, self.ranges = None, []
        self.ops, self.replays, self.capture_s, self.used = 0, 0, 0.0, 0


class TraceError(RuntimeError):
    """A capture that could not be made safe (its pass runs eagerly instead)."""


class Traces:
    """capture / replay / release of ttnn traces (mesh mixin)."""

    def traces_init(self):
        self.traces = {}
        self.trace_counts = {"captures": 0, "replays": 0, "released": 0, "arena_resets": 0}
        # The arena's placeholders: one per merged range of every trace's intermediates.
        self.arena_plugs = []

    def trace_capture(self, key, run):
        """Capture `run()` (its ops dispatched into a trace, nothing computed), plug the ranges
        its intermediates used, and keep the trace under `key`. Returns (trace, what run
        returned). Raises what the capture raised (the trace released, nothing kept)."""
        ttnn = self.ttnn
        graph = ttnn._ttnn.graph
        shadow = self.tt.shadow
        while len(self.traces) >= max_traces():
            self.trace_release(min(self.traces.values(), key=lambda tr: tr.used).key)
        t0 = time.perf_counter()
        calls0 = self.tt.total_calls()
        self._unplug()
        graph.begin_graph_capture(graph.RunMode.NORMAL)
        tid = ttnn.begin_trace_capture(self.device, cq_id=0)
        if shadow is not None:
            shadow.begin_capture()
        try:
            try:
                out = run()
            finally:
                ttnn.end_trace_capture(self.device, tid, cq_id=0)
                if shadow is not None:
                    recorded = shadow.end_capture()
                nodes = graph.end_graph_capture()
        except BaseException:
            ttnn.release_trace(self.device, tid)
            self._restore_arena()
            raise
        trace = Trace(key, tid)
        trace.calls = recorded if shadow is not None else None
        trace.ops = self.tt.total_calls() - calls0
        try:
            trace.ranges = self._captured_ranges(nodes)
            try:
                self._plug_arena(trace.ranges)
            except TraceError:
                # The older traces' ranges no longer plug where they were (the allocator's free
                # space changed since their captures): they go (each is captured again when its
                # form comes back), and the new one's ranges plug alone, as their own capture
                # placed them.
                self.trace_release_all()
                self.trace_counts["arena_resets"] += 1
                self._plug_arena(trace.ranges)
        except BaseException:
            self._unplug()
            ttnn.release_trace(self.device, tid)
            self._restore_arena()
            raise
        # What lives now (weights, programs, the package) lives as long as the traces: the
        # cyclic collector stops walking it after every few hundred allocations (~0.5-1 ms of
        # a replayed 1,024-row chunk's host time), garbage of now collected first.
        gc.collect()
        gc.freeze()
        trace.capture_s = time.perf_counter() - t0
        self.traces[key] = trace
        self.trace_counts["captures"] += 1
        return trace, out

    def trace_replay(self, trace):
        """Run `trace` on the devices (and its golden calls on the twins)."""
        self.ttnn.execute_trace(self.device, trace.tid, cq_id=0, blocking=False)
        if trace.calls is not None:
            self.tt.shadow.replay(trace.calls)
        trace.replays += 1
        self.trace_counts["replays"] += 1
        trace.used = self.trace_counts["replays"]

    def trace_release(self, key):
        """Release the trace under `key`; the arena keeps its ranges until the next capture
        plugs the ranges of the traces left."""
        trace = self.traces.pop(key, None)
        if trace is None:
            return
        self.ttnn.release_trace(self.device, trace.tid)
        self.trace_counts["released"] += 1
        if not self.traces:
            self._unplug()

    def trace_release_all(self):
        for key in list(self.traces):
            self.trace_release(key)

    def trace_facts(self):
        """{"traces", "captures", "replays", "released", "trace_region_bytes" (the TRACE
        region's allocated bytes per device, the allocator's count), "plug_bytes" (per device:
        the DRAM the traces' intermediates keep)}."""
        view = self.ttnn.get_memory_view(self.device, self.ttnn.BufferType.TRACE)
        return {
            "traces": len(self.traces),
            **self.trace_counts,
            "trace_region_bytes": int(view.total_bytes_allocated_per_bank) * int(view.num_banks),
            "trace_region_size": int(view.total_bytes_per_bank) * int(view.num_banks),
            "plug_bytes": sum(self.footprint(p) for p in self.arena_plugs),
        }

    # -- placeholders ---------------------------------------------------------------------------
    def _captured_ranges(self, nodes):
        """Per-bank DRAM address ranges [start, end) the capture allocated and freed (merged
        where they touch), from the graph capture's buffer_allocate / buffer_deallocate nodes
        (buffer_type 0: DRAM; the trace buffer itself, type 4, lives in the trace region).
        TraceError when a buffer allocated inside the capture outlives it: freed later, its
        range would be reused while replays write it."""
        live, spans = {}, []
        for node in nodes:
            kind = node.get("node_type")
            if kind not in ("buffer_allocate", "buffer_deallocate"):
                continue
            params = node.get("params") or {}
            if int(params.get("buffer_type", -1)) != 0 or int(params.get("device_id", 0)) != 0:
                continue
            address = int(params["address"])
            if kind == "buffer_allocate":
                live[address] = address + int(params["max_size_per_bank"])
            elif address in live:
                spans.append((address, live.pop(address)))
        if live:
            raise TraceError(
                "%d device buffer(s) made inside a trace capture outlive it (at %s)"
                % (len(live), sorted(live)[:4])
            )
        return merge(spans)

    def _plug_arena(self, extra=()):
        """Plug the union of every trace's ranges and `extra` (a new capture's), in address
        order. A placeholder that lands in a free gap below its range (the allocator places
        first fit) stays there as a filler while the next try goes higher; the fillers are
        freed at the end. TraceError when a placeholder lands over a range (part of it is
        taken), the arena left unplugged."""
        ranges = merge([r for t in self.traces.values() for r in t.ranges] + list(extra))
        fillers = []
        try:
            for a, b in ranges:
                for _ in range(64):
                    plug = self._placeholder(b - a)
                    landed = int(plug.buffer_address())
                    if landed == a:
                        self.arena_plugs.append(plug)
                        break
                    fillers.append(plug)
                    if landed + (b - a) > a and landed < b:
                        raise TraceError(
                            "a trace's intermediates at %d..%d could not be reserved (the "
                            "placeholder landed at %d)" % (a, b, landed)
                        )
                else:
                    raise TraceError("a trace's intermediates at %d..%d: no placeholder" % (a, b))
        except BaseException:
            self._unplug()
            raise
        finally:
            for plug in fillers:
                self.ttnn.deallocate(plug, force=True)

    def _placeholder(self, nbytes):
        """A DRAM buffer of at least `nbytes` per bank (64-byte aligned), interleaved over the
        banks like the intermediates it stands in for."""
        ttnn = self.ttnn
        align = 64
        rows = -(-nbytes // align) * self.dram_banks
        return ttnn.allocate_tensor_on_device(
            ttnn.Shape([1, 1, rows, align // 2]),
            ttnn.bfloat16,
            ttnn.ROW_MAJOR_LAYOUT,
            self.device,
            self.dram,
        )

    def _restore_arena(self):
        """The arena plugged as before a capture that failed; where it cannot be, every trace
        is released (their intermediates would be unprotected)."""
        try:
            self._plug_arena()
        except TraceError:
            self.trace_release_all()

    def _unplug(self):
        for plug in self.arena_plugs:
            if plug.is_allocated():
                self.ttnn.deallocate(plug, force=True)
        self.arena_plugs = []


def merge(spans):
    """Address ranges [start, end) merged where they touch or overlap, in order."""
    merged = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged
