"""The mesh commands (`Mesh.command`, clef_tt_mesh_command): {"trace": ...} for the traced passes
(passes.py `trace_command`), and ttnn's graph capture: the device
operations between {"graph_capture": "begin"} and {"graph_capture": "end"}, counted by ttnn
itself (the capture's function_start nodes that name a program factory; a mesh workload counts
once), per program, with the data-movement ops and the bytes they write (their output tensors'
size per device), every buffer allocated (address, size) and the host's writes to the devices:
two identical chunks allocating at the same addresses with no host write in between is what
ttnn's trace capture needs on chips. Used by `clef-tt bench prefill --shape` and the bench scripts; it works in
mock mode (ttnn's trace capture does not).
"""

# Data-movement kinds, matched in this order against the device operation's and the program
# factory's names (untilize before tilize, the heads ops before concat, tilize-with-padding
# before pad).
MOVEMENT = (
    "untilize",
    "tilize",
    "nlp",
    "reshape",
    "slice",
    "concat",
    "typecast",
    "transpose",
    "permute",
    "pad",
)


def movement_kind(operation, factory):
    """The data-movement kind of a device operation (its name and its program factory's short
    name: NlpCreateHeadsDeviceOperation runs a factory called just `Interleaved`), or None for
    a compute op."""
    name = (operation + " " + factory.rsplit("::", 1)[-1]).lower()
    for kind in MOVEMENT:
        if kind in name:
            return "heads" if kind == "nlp" else kind
    return None


# Functions through which the host writes device memory.
HOST_WRITES = ("to_device", "copy_host_to_device", "write_tensor")


def summarize(graph):
    """{"device_ops", "programs": {factory: count}, "data_movement": {kind: [count, bytes]},
    "allocations": [[address, size] of every device buffer allocated, in order],
    "host_writes": the calls that wrote device memory from the host}."""
    programs, movement, stack, total = {}, {}, [], 0
    allocations, host_writes = [], 0
    for node in graph:
        kind = node.get("node_type")
        params = node.get("params") or {}
        if kind == "buffer_allocate":
            allocations.append([int(params.get("address", 0)), int(params.get("size", 0))])
        if kind == "function_start":
            if any(w in str(params.get("name", "")) for w in HOST_WRITES):
                host_writes += 1
            stack.append(node)
        elif kind == "function_end" and stack:
            start = stack.pop()
            factory = (start.get("params") or {}).get("program_factory_type")
            if factory is None:
                continue
            total += 1
            short = factory.rsplit("::", 1)[-1]
            programs[short] = programs.get(short, 0) + 1
            moved = movement_kind(str((start.get("params") or {}).get("name", "")), factory)
            if moved is not None:
                written = sum(
                    int((graph[c].get("params") or {}).get("size", 0))
                    for c in node.get("connections", [])
                    if c < len(graph) and graph[c].get("node_type") == "tensor"
                )
                entry = movement.setdefault(moved, [0, 0])
                entry[0] += 1
                entry[1] += written
    return {
        "device_ops": total,
        "programs": programs,
        "data_movement": movement,
        "allocations": allocations,
        "host_writes": host_writes,
    }


class GraphCommands:
    """The mesh commands (mesh mixin)."""

    def command(self, request):
        """A mesh command (clef_tt_mesh_command): see the module docstring."""
        if isinstance(request, dict) and "trace" in request:
            return self.trace_command(request)
        capture = request.get("graph_capture") if isinstance(request, dict) else None
        graph = self.ttnn._ttnn.graph
        if capture == "begin":
            graph.begin_graph_capture(graph.RunMode.NORMAL)
            return {}
        if capture == "end":
            return summarize(graph.end_graph_capture())
        raise NotImplementedError(
            "no mesh command %r (graph_capture: begin | end; trace: facts | configure)" % request
        )
