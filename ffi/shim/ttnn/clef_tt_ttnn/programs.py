"""Compute kernel and program configs, chosen as the Tenstorrent port chooses them.

- Matmuls (`linear`): the profile's fidelity (EXACT runs HiFi4), fp32 destination accumulation
  and packer L1 accumulation as the ABI config says, approx mode off. Prefill-sized matmuls
  (more than one tile of rows) get the port's 2-D multicast program config
  (housTT/tt-metal qwen36 tt/tp_common.py `create_prefill_mlp_matmul_program_config` with the
  device's grid width, TP<=4 tuning): the grid width that maximises the output subblock
  (ties to more columns), up to 10 grid rows, one-row subblocks at most 4 tiles wide,
  in0_block_w the largest divisor of K's tiles not above min(4, K tiles / columns) whose
  circular buffers fit MATMUL_CB_BUDGET. Single-tile M, and shapes no in0_block_w fits (ttnn
  refuses them: "Statically allocated ... buffers ... beyond max L1 size"), are left to ttnn's
  own choice, as the port does for decode-sized calls.
- Attention (SDPA): q/k chunks as the port's paged prefill picks them (`sdpa_chunks`), fp32
  accumulation; HiFi4 in the fine ops (the ABI's fp32 attention), the profile's fidelity but
  at least HiFi2 in the layer ops (`sublayer`: the port runs SDPA and its norms at HiFi2,
  "HiFi4 was slower"; `selected` and `stage1` are HiFi2 profiles, `bf16` HiFi4, `f32` exact).
- Norms: as attention.
- Elementwise binary ops of the layer ops (residual adds, gate products): the first
  ELTWISE_GRID cores (`eltwise_cores`), not the whole grid. ttnn's binary op writes runtime
  arguments for every core it runs on at each call, ~0.2 us of host time per core on the mock
  (29 us on the 11x10 grid, 13 us on 8x4), and the layer ops make ~300 of them per chunk. On
  the device these ops are DRAM-bound: a 1,024-token residual add moves 31 MB per device (61 us
  at Blackhole's 512 GB/s), 1 MB per core on 32 cores (16 GB/s per core, a fifth of a core's
  NoC bandwidth), so 32 cores keep them at DRAM speed. To be confirmed on chips.
"""

import functools
import math

from .meta import EXACT, HIFI2, HIFI3, LOFI, TILE_SIZE


def math_fidelity(ttnn, fidelity):
    return {
        LOFI: ttnn.MathFidelity.LoFi,
        HIFI2: ttnn.MathFidelity.HiFi2,
        HIFI3: ttnn.MathFidelity.HiFi3,
    }.get(fidelity, ttnn.MathFidelity.HiFi4)


# The configs are pure functions of their arguments, asked for on every op call: made once.
@functools.lru_cache(maxsize=None)
def kernel_config(ttnn, fidelity, fp32_dest_acc, packer_l1_acc):
    return ttnn.WormholeComputeKernelConfig(
        math_fidelity=math_fidelity(ttnn, fidelity),
        math_approx_mode=False,
        fp32_dest_acc_en=bool(fp32_dest_acc),
        packer_l1_acc=bool(packer_l1_acc),
    )


def precise(ttnn):
    """HiFi4, fp32 accumulation: attention and norms of the fine ops, and exact products."""
    return kernel_config(ttnn, EXACT, True, False)


def sublayer(ttnn, config):
    """The layer ops' SDPA and norms: the profile's fidelity (`config` as `linear` takes it),
    LoFi raised to HiFi2, fp32 accumulation."""
    fidelity = int(config.get("fidelity", EXACT))
    return kernel_config(ttnn, HIFI2 if fidelity == LOFI else fidelity, True, False)


def _subblock_w(per_core_n, subblock_h=1):
    for w in range(min(per_core_n, 4 // subblock_h), 0, -1):
        if per_core_n % w == 0:
            return w
    return 1


def _best_cols(n_tiles, max_cols):
    best_cols, best_key = 1, None
    for cols in range(1, max_cols + 1):
        key = (_subblock_w(math.ceil(n_tiles / cols)), cols)
        if best_key is None or key > best_key:
            best_key, best_cols = key, cols
    return best_cols


# Bytes of circular buffers a matmul program may take per core (of Blackhole's 1.5 MiB L1; the
# rest stays for other buffers, as the port found L1 outputs and CBs competing).
MATMUL_CB_BUDGET = 1024 * 1024


def matmul_cb_bytes(per_core_m, per_core_n, in0_block_w, in0_tile, in1_tile, out_tile):
    """Estimated circular-buffer bytes per core of the 2-D multicast matmul: double-buffered
    in0/in1 blocks, the output block and an fp32 partial-sum block."""
    return (
        2 * per_core_m * in0_block_w * in0_tile
        + 2 * in0_block_w * per_core_n * in1_tile
        + per_core_m * per_core_n * (out_tile + 4096)
    )


def matmul_blocks(m, k, n, grid, in0_tile=2048, in1_tile=1088, out_tile=2048):
    """The port's 2-D prefill blocking of [m, k] x [k, n] (m > one tile): dict of cols, rows,
    per_core_m, per_core_n, in0_block_w (None when no in0_block_w keeps the circular buffers
    within MATMUL_CB_BUDGET) and cb_bytes (the estimate at the chosen in0_block_w, else at 1)."""
    m_tiles = math.ceil(m / TILE_SIZE)
    k_tiles = math.ceil(k / TILE_SIZE)
    n_tiles = math.ceil(n / TILE_SIZE)
    grid_x, grid_y = int(grid[0]), min(10, int(grid[1]))
    cols = _best_cols(n_tiles, grid_x)
    per_core_m = max(1, math.ceil(m_tiles / grid_y))
    per_core_n = max(1, math.ceil(n_tiles / cols))
    cap = min(4, max(1, k_tiles // cols))
    out = dict(
        cols=cols,
        rows=grid_y,
        per_core_m=per_core_m,
        per_core_n=per_core_n,
        in0_block_w=None,
        cb_bytes=matmul_cb_bytes(per_core_m, per_core_n, 1, in0_tile, in1_tile, out_tile),
    )
    for in0_block_w in range(cap, 0, -1):
        if k_tiles % in0_block_w:
            continue
        cb = matmul_cb_bytes(per_core_m, per_core_n, in0_block_w, in0_tile, in1_tile, out_tile)
        if cb <= MATMUL_CB_BUDGET:
            out.update(in0_block_w=in0_block_w, cb_bytes=cb)
            break
    return out


@functools.lru_cache(maxsize=None)
def matmul_program(ttnn, m, k, n, grid, in0_tile=2048, in1_tile=1088, out_tile=2048):
    """The port's 2-D prefill program config for [m, k] x [k, n]; None (ttnn's own choice) for
    single-tile m, or when no in0_block_w keeps its circular buffers within MATMUL_CB_BUDGET
    (very wide outputs such as a fused gate|up of 17408 columns per device)."""
    if m <= TILE_SIZE:
        return None
    b = matmul_blocks(m, k, n, grid, in0_tile, in1_tile, out_tile)
    if b["in0_block_w"] is None:
        return None
    return ttnn.MatmulMultiCoreReuseMultiCastProgramConfig(
        compute_with_storage_grid_size=(b["cols"], b["rows"]),
        in0_block_w=b["in0_block_w"],
        out_subblock_h=1,
        out_subblock_w=_subblock_w(b["per_core_n"]),
        per_core_M=b["per_core_m"],
        per_core_N=b["per_core_n"],
        transpose_mcast=False,
        fused_activation=None,
        fuse_batch=False,
    )


def lowbit(n):
    return n & -n


# Columns x rows of the cores the layer ops' elementwise binary ops run on (module docstring).
ELTWISE_GRID = (8, 4)


def eltwise_cores(ttnn, grid):
    """The CoreRangeSet of the first ELTWISE_GRID cores of a compute grid (cols, rows)."""
    cols, rows = min(ELTWISE_GRID[0], int(grid[0])), min(ELTWISE_GRID[1], int(grid[1]))
    return ttnn.CoreRangeSet(
        {ttnn.CoreRange(ttnn.CoreCoord(0, 0), ttnn.CoreCoord(cols - 1, rows - 1))}
    )


def sdpa_chunks(q_len, start):
    """(q_chunk, k_chunk) of the port's chunked prefill SDPA for `q_len` queries at 32-aligned
    `start`: 128 for q_len >= 2048 else 64, capped by start's alignment; 64-row q chunks for a
    2048-row chunk."""
    cap = 128 if q_len >= 2048 else 64
    qk = cap if start == 0 else min(cap, lowbit(start))
    q_chunk = 64 if q_len == 2048 else qk
    return q_chunk, qk


@functools.lru_cache(maxsize=None)
def sdpa_program(ttnn, grid, q_chunk, k_chunk):
    return ttnn.SDPAProgramConfig(
        compute_with_storage_grid_size=(int(grid[0]), int(grid[1])),
        q_chunk_size=q_chunk,
        k_chunk_size=k_chunk,
        exp_approx_mode=False,
    )
