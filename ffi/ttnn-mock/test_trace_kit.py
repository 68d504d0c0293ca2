"""Trace capture and replay on the mock P150x2, with the kit's trace shim preloaded.

Run (plain Python; ttnn writes `generated/` into the working directory, so from a scratch folder):
    source DIR/env.sh          # ffi/ttnn-mock/setup.sh DIR writes it (LD_PRELOAD: the trace shim)
    cd "$(mktemp -d)" && $CLEF_TT_PYTHON /path/to/ffi/ttnn-mock/test_trace_kit.py
It opens a 1x2 mesh (FABRIC_1D, a 64 MB trace region, two command queues), runs a linear,
all_gather, add and slice chain eagerly, captures it and replays it (printing the host time of
both). It checks that inside a capture the kit refuses what chips refuse (host writes into device
buffers, reads from them, event records, finishes, program-cache misses) with a RuntimeError
naming the call; that the capture can then be ended and released and the device keeps working;
that writes outside a capture, and on the queue that is not capturing, go through; and that
ttnn's graph capture still works. Two more processes (TT_METAL_TRACE_ALLOC_TRACKING=0 and 1; ttnn
reads it once, at import) check a buffer allocated while a trace exists: tt-metal's warning, and
ttnn's trace allocation tracker. One line per check; exit status 1 on any failure.
"""

import os
import subprocess
import sys
import tempfile
import time

import torch
import ttnn

SHIM = "libclef_tt_trace_shim.so"
N_EAGER, N_REPLAY = 20, 200
passed, failed = 0, 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
    print("%s %s%s" % ("ok  " if ok else "FAIL", name, (": " + detail) if detail else ""))
    sys.stdout.flush()
    return ok


def refused(name, fn, call, chips):
    """Runs fn, which must raise the kit's RuntimeError naming `call` and the chips' message."""
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        ok = "clef-tt mock kit" in msg and call in msg and chips in msg
        return check(name, ok, msg.splitlines()[0] if msg else "")
    return check(name, False, "no error raised")


def memory(mesh, kind):
    """Bytes allocated in one bank of a buffer type (ttnn.get_memory_view)."""
    return ttnn.get_memory_view(mesh, kind).total_bytes_allocated_per_bank


def open_mesh():
    ttnn.set_fabric_config(ttnn.FabricConfig.FABRIC_1D)
    mesh = ttnn.open_mesh_device(
        mesh_shape=ttnn.MeshShape(1, 2),
        l1_small_size=24576,
        trace_region_size=64 << 20,
        num_command_queues=2,
    )
    mesh.enable_program_cache()
    return mesh


def upload(mesh, t, shard=None):
    mapper = ttnn.ShardTensorToMesh(mesh, dim=shard) if shard is not None else None
    return ttnn.from_torch(
        t,
        dtype=ttnn.bfloat16,
        layout=ttnn.TILE_LAYOUT,
        device=mesh,
        memory_config=ttnn.DRAM_MEMORY_CONFIG,
        mesh_mapper=mapper or ttnn.ReplicateTensorToMesh(mesh),
    )


def host(mesh, t):
    """A host tensor laid out as `upload` puts it on the mesh (replicated)."""
    return ttnn.from_torch(
        t,
        dtype=ttnn.bfloat16,
        layout=ttnn.TILE_LAYOUT,
        mesh_mapper=ttnn.ReplicateTensorToMesh(mesh),
    )


def step(x, w):
    """matmul (columns of w sharded over the mesh), all_gather, add, slice: DRAM tensors."""
    y = ttnn.linear(x, w, memory_config=ttnn.DRAM_MEMORY_CONFIG)
    g = ttnn.all_gather(y, 3, cluster_axis=1, memory_config=ttnn.DRAM_MEMORY_CONFIG)
    z = ttnn.add(g, x, memory_config=ttnn.DRAM_MEMORY_CONFIG)
    s = ttnn.slice(z, [0, 0, 0, 0], [1, 1, 32, 256], memory_config=ttnn.DRAM_MEMORY_CONFIG)
    ttnn.deallocate(y)
    ttnn.deallocate(g)
    ttnn.deallocate(z)
    return s


def device_ops(graph):
    """Device operations in a ttnn graph capture: function_start nodes naming a program factory."""
    return sum(
        1
        for n in graph
        if n.get("node_type") == "function_start"
        and (n.get("params") or {}).get("program_factory_type")
    )


def graph_of(fn):
    g = ttnn._ttnn.graph
    g.begin_graph_capture(g.RunMode.NO_DISPATCH)
    try:
        fn()
    finally:
        graph = g.end_graph_capture()
    return graph


def after_refusal(mesh, tid, name, x, w):
    """The capture a refusal left open: still open; end_trace_capture + release_trace close it
    and the device keeps working (an eager step, a new capture replayed)."""
    check(name + ": the capture is still open", ttnn.is_trace_capture_active(mesh))
    try:
        ttnn.end_trace_capture(mesh, tid, cq_id=0)
        ttnn.release_trace(mesh, tid)
        ok = not ttnn.is_trace_capture_active(mesh)
        ttnn.deallocate(step(x, w))
        t2 = ttnn.begin_trace_capture(mesh, cq_id=0)
        out = step(x, w)
        ttnn.end_trace_capture(mesh, t2, cq_id=0)
        ttnn.execute_trace(mesh, t2, cq_id=0, blocking=True)
        ttnn.release_trace(mesh, t2)
        ttnn.deallocate(out)
        check(name + ": end_trace_capture + release_trace recover, the device keeps working", ok)
    except Exception as e:
        check(name + ": end_trace_capture + release_trace recover", False, repr(e))


def main():
    preload = os.environ.get("LD_PRELOAD", "")
    if not check("the trace shim is preloaded", SHIM in preload, "LD_PRELOAD=%r" % preload):
        print("source the kit's env.sh (ffi/ttnn-mock/setup.sh DIR) first")
        return 1
    mesh = open_mesh()
    try:
        run(mesh)
    finally:
        ttnn.close_mesh_device(mesh)
    tracker_process()
    print("%d checks passed%s" % (passed, (", %d failed" % failed) if failed else ""))
    return 1 if failed else 0


def run(mesh):
    torch.manual_seed(0)
    x = upload(mesh, torch.randn(1, 1, 64, 256))
    w = upload(mesh, torch.randn(1, 1, 256, 256), shard=3)

    # Eager: the first step builds the programs, the rest hit the program cache.
    ttnn.deallocate(step(x, w))
    ttnn.synchronize_device(mesh)
    t0 = time.perf_counter()
    for _ in range(N_EAGER):
        ttnn.deallocate(step(x, w))
    ttnn.synchronize_device(mesh)
    eager_us = (time.perf_counter() - t0) / N_EAGER * 1e6
    check("eager step (linear, all_gather, add, slice)", True, "%.0f us of host time" % eager_us)

    # Capture and replay.
    trace_before = memory(mesh, ttnn.BufferType.TRACE)
    tid = ttnn.begin_trace_capture(mesh, cq_id=0)
    active = ttnn.is_trace_capture_active(mesh)
    out = step(x, w)
    ttnn.end_trace_capture(mesh, tid, cq_id=0)
    trace_after = memory(mesh, ttnn.BufferType.TRACE)
    check(
        "capture of the cached chain",
        active and not ttnn.is_trace_capture_active(mesh),
        "trace region per bank: %d B before, %d B after" % (trace_before, trace_after),
    )
    ttnn.execute_trace(mesh, tid, cq_id=0, blocking=True)
    t0 = time.perf_counter()
    for _ in range(N_REPLAY):
        ttnn.execute_trace(mesh, tid, cq_id=0, blocking=False)
    replay_us = (time.perf_counter() - t0) / N_REPLAY * 1e6
    ttnn.synchronize_device(mesh)
    t0 = time.perf_counter()
    for _ in range(N_REPLAY):
        ttnn.execute_trace(mesh, tid, cq_id=0, blocking=True)
    replay_blocking_us = (time.perf_counter() - t0) / N_REPLAY * 1e6
    check(
        "replay",
        True,
        "%.1f us of host time per execute_trace (%.1f us blocking), eager %.0f us"
        % (replay_us, replay_blocking_us, eager_us),
    )

    # Outside any capture: a host write into the tensor the trace reads, then a replay.
    try:
        ttnn.copy_host_to_device_tensor(host(mesh, torch.randn(1, 1, 64, 256)), x)
        ttnn.execute_trace(mesh, tid, cq_id=0, blocking=True)
        back = ttnn.to_torch(ttnn.get_device_tensors(x)[0])
        check("a host write outside a capture, then a replay", tuple(back.shape) == (1, 1, 64, 256))
    except Exception as e:
        check("a host write outside a capture, then a replay", False, repr(e))

    # ttnn's graph capture around a replay and around an eager step.
    try:
        replay_graph = graph_of(lambda: ttnn.execute_trace(mesh, tid, cq_id=0))
        eager_graph = graph_of(lambda: ttnn.deallocate(step(x, w)))
        check(
            "graph capture (NO_DISPATCH) with the shim",
            device_ops(eager_graph) == 4 and device_ops(replay_graph) == 0,
            "device ops: %d in an execute_trace (nodes: %s), %d in an eager step (%d nodes)"
            % (
                device_ops(replay_graph),
                ", ".join(n.get("node_type") for n in replay_graph),
                device_ops(eager_graph),
                len(eager_graph),
            ),
        )
    except Exception as e:
        check("graph capture (NO_DISPATCH) with the shim", False, repr(e))
    ttnn.release_trace(mesh, tid)
    ttnn.deallocate(out)
    check(
        "release_trace",
        memory(mesh, ttnn.BufferType.TRACE) == trace_before,
        "trace region per bank back to %d B" % memory(mesh, ttnn.BufferType.TRACE),
    )

    writes = "Writes are not supported during trace capture"
    reads = "Reads are not supported during trace capture"
    loads = "Cannot load new binaries during trace capture"
    events = "Event Synchronization is not supported during trace capture"
    x_host = host(mesh, torch.randn(1, 1, 64, 256))
    fresh = upload(mesh, torch.randn(1, 1, 96, 320))
    fresh_w = upload(mesh, torch.randn(1, 1, 320, 64))

    # Planted host writes inside a capture.
    tid = ttnn.begin_trace_capture(mesh, cq_id=0)
    ttnn.deallocate(step(x, w))
    refused(
        "copy_host_to_device_tensor inside a capture is refused",
        lambda: ttnn.copy_host_to_device_tensor(x_host, x),
        "MeshCommandQueueBase::enqueue_write",
        writes,
    )
    refused(
        "from_torch(..., device=mesh) inside a capture is refused",
        lambda: upload(mesh, torch.randn(1, 1, 64, 256)),
        "MeshCommandQueueBase::enqueue_write",
        writes,
    )
    refused(
        "ttnn.Tensor(..., device=mesh) inside a capture is refused",
        lambda: ttnn.Tensor(
            torch.randn(1, 1, 64, 256),
            ttnn.bfloat16,
            mesh,
            ttnn.TILE_LAYOUT,
            ttnn.DRAM_MEMORY_CONFIG,
        ),
        "MeshCommandQueueBase::enqueue_write",
        writes,
    )
    # The other command queue is not capturing: chips take a write there.
    try:
        ttnn.copy_host_to_device_tensor(x_host, x, cq_id=1)
        check("a host write on command queue 1 while queue 0 captures goes through", True)
    except Exception as e:
        check("a host write on command queue 1 while queue 0 captures goes through", False, repr(e))
    after_refusal(mesh, tid, "after the refused writes", x, w)

    # Planted reads.
    tid = ttnn.begin_trace_capture(mesh, cq_id=0)
    refused(
        "to_torch of a device tensor inside a capture is refused",
        lambda: ttnn.to_torch(ttnn.get_device_tensors(x)[0]),
        "MeshCommandQueueBase::enqueue_read",
        reads,
    )
    refused(
        "from_device inside a capture is refused",
        lambda: ttnn.from_device(x),
        "MeshCommandQueueBase::enqueue_read",
        reads,
    )
    after_refusal(mesh, tid, "after the refused reads", x, w)

    # Planted synchronizations: an event recorded on the capturing queue, a finish. The other
    # queue is not capturing.
    tid = ttnn.begin_trace_capture(mesh, cq_id=0)
    refused(
        "record_event on the capturing queue is refused",
        lambda: ttnn.record_event(mesh, 0),
        "FDMeshCommandQueue::enqueue_record_event_helper",
        events,
    )
    refused(
        "synchronize_device inside a capture is refused",
        lambda: ttnn.synchronize_device(mesh),
        "FDMeshCommandQueue::finish_nolock",
        events,
    )
    try:
        ttnn.record_event(mesh, 1)
        ttnn.synchronize_device(mesh, cq_id=1)
        check("record_event and synchronize_device on queue 1 while queue 0 captures", True)
    except Exception as e:
        check(
            "record_event and synchronize_device on queue 1 while queue 0 captures", False, repr(e)
        )
    after_refusal(mesh, tid, "after the refused synchronizations", x, w)

    # A planted program-cache miss: a matmul at shapes never run before (a new cache entry).
    entries = mesh.num_program_cache_entries()
    tid = ttnn.begin_trace_capture(mesh, cq_id=0)
    refused(
        "a program-cache miss (matmul at new shapes) inside a capture is refused",
        lambda: ttnn.matmul(fresh, fresh_w, memory_config=ttnn.DRAM_MEMORY_CONFIG),
        "MeshWorkloadImpl::load_binaries",
        loads,
    )
    check(
        "the refused program is not left in the program cache",
        mesh.num_program_cache_entries() == entries,
        "%d entries before, %d after" % (entries, mesh.num_program_cache_entries()),
    )
    after_refusal(mesh, tid, "after the refused program load", x, w)
    # Run once outside a capture (built, cached, its binaries "sent"), it then captures.
    try:
        ttnn.deallocate(ttnn.matmul(fresh, fresh_w, memory_config=ttnn.DRAM_MEMORY_CONFIG))
        check(
            "run outside a capture, the missed program is cached",
            mesh.num_program_cache_entries() == entries + 1,
        )
        tid = ttnn.begin_trace_capture(mesh, cq_id=0)
        y = ttnn.matmul(fresh, fresh_w, memory_config=ttnn.DRAM_MEMORY_CONFIG)
        ttnn.end_trace_capture(mesh, tid, cq_id=0)
        ttnn.execute_trace(mesh, tid, cq_id=0, blocking=True)
        ttnn.release_trace(mesh, tid)
        ttnn.deallocate(y)
        check("the missed program, run once outside a capture, then captures", True)
    except Exception as e:
        check("the missed program, run once outside a capture, then captures", False, repr(e))
    # add at a shape never run: the binary op's program hash leaves the shape out, so this is
    # a cache hit (no new entry) and captures, on chips too.
    try:
        entries = mesh.num_program_cache_entries()
        tid = ttnn.begin_trace_capture(mesh, cq_id=0)
        y = ttnn.add(fresh, fresh, memory_config=ttnn.DRAM_MEMORY_CONFIG)
        ttnn.end_trace_capture(mesh, tid, cq_id=0)
        ttnn.release_trace(mesh, tid)
        ttnn.deallocate(y)
        check(
            "add at a new shape is a program-cache hit and captures",
            mesh.num_program_cache_entries() == entries,
        )
    except Exception as e:
        check("add at a new shape is a program-cache hit and captures", False, repr(e))

    # With no capture open everything works as without the kit.
    try:
        y = upload(mesh, torch.randn(1, 1, 64, 256))
        ttnn.copy_host_to_device_tensor(x_host, y)
        back = ttnn.to_torch(
            ttnn.from_device(y), mesh_composer=ttnn.ConcatMeshToTensor(mesh, dim=0)
        )
        ttnn.deallocate(ttnn.add(y, x))
        ttnn.deallocate(y)
        check("with no capture open, writes, reads and new programs work", back.shape[0] == 2)
    except Exception as e:
        check("with no capture open, writes, reads and new programs work", False, repr(e))


LATE = "--late-allocation"


def tracker_process():
    """A buffer allocated while a trace exists, in processes of their own (ttnn reads
    TT_METAL_TRACE_ALLOC_TRACKING once, at start-up): tt-metal's warning without tracking, the
    trace allocation tracker's refusal with it."""
    for tracking in ("0", "1"):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ)
            env.update(
                TT_METAL_TRACE_ALLOC_TRACKING=tracking,
                TT_LOGGER_LEVEL="warn",
                TT_LOGGER_FILE=os.path.join(d, "tt.log"),
            )
            p = subprocess.run(
                [sys.executable, os.path.abspath(__file__), LATE],
                env=env,
                cwd=d,
                capture_output=True,
                text=True,
            )
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith(("ok  ", "FAIL"))]
            for ln in lines:
                check(ln[5:], ln.startswith("ok  "))
            if p.returncode != 0 and not any(ln.startswith("FAIL") for ln in lines):
                check("the late-allocation process", False, (p.stderr or p.stdout)[-2000:])
            log = ""
            if os.path.exists(env["TT_LOGGER_FILE"]):
                with open(env["TT_LOGGER_FILE"]) as f:
                    log = f.read()
            warned = log.count("Allocating device buffers is potentially unsafe")
            if tracking == "0":
                check(
                    "tracking off: tt-metal warns (once) on a buffer allocated while a trace exists",
                    warned == 1,
                    "%d warning(s) for 2 allocations" % warned,
                )
            else:
                check("tracking on: the tracker replaces the warning", warned == 0)


def late_main():
    """Allocations after a capture, with TT_METAL_TRACE_ALLOC_TRACKING as the parent set it."""
    tracker = ttnn._trace_allocation_tracker
    on = tracker.TRACE_ALLOC_TRACKING
    prefix = "tracking %s: " % ("on" if on else "off")
    check(
        prefix + "ttnn._trace_allocation_tracker.TRACE_ALLOC_TRACKING",
        on == (os.environ.get("TT_METAL_TRACE_ALLOC_TRACKING") == "1"),
    )
    mesh = open_mesh()
    try:
        x = upload(mesh, torch.randn(1, 1, 64, 256))
        w = upload(mesh, torch.randn(1, 1, 256, 256), shard=3)
        ttnn.deallocate(step(x, w))
        tid = ttnn.begin_trace_capture(mesh, cq_id=0)
        out = step(x, w)
        ttnn.end_trace_capture(mesh, tid, cq_id=0)
        ttnn.execute_trace(mesh, tid, cq_id=0, blocking=True)
        late = ttnn.add(x, x, memory_config=ttnn.DRAM_MEMORY_CONFIG)  # allocated after the capture
        name = prefix + "execute_trace while a buffer allocated after the capture lives"
        try:
            ttnn.execute_trace(mesh, tid, cq_id=0, blocking=True)
            check(name + " runs", not on)
        except RuntimeError as e:
            msg = str(e).splitlines()[0]
            check(name + " is refused", on and "still alive before trace replay" in msg, msg)
        ttnn.deallocate(late)
        ttnn.execute_trace(mesh, tid, cq_id=0, blocking=True)
        check(prefix + "once it is freed, execute_trace runs", True)
        with tracker.corruptible_allocation_scope(mesh):
            kept = ttnn.add(x, x, memory_config=ttnn.DRAM_MEMORY_CONFIG)
        ttnn.execute_trace(mesh, tid, cq_id=0, blocking=True)
        check(prefix + "an allocation in corruptible_allocation_scope is not counted", True)
        ttnn.deallocate(kept)
        ttnn.release_trace(mesh, tid)
        ttnn.deallocate(out)
    finally:
        ttnn.close_mesh_device(mesh)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(late_main() if LATE in sys.argv[1:] else main())
