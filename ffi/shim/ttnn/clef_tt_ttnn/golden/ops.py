"""The shadow of every ttnn op the package calls: the op's ttnn golden function where ttnn 0.81.1
has one, otherwise a shadow written from the op's documented semantics.

Golden functions (`ttnn.get_golden_function(op)`), called per device on the twins of the inputs:
  reshape, slice, concat, pad, permute, typecast, to_layout, clone, zeros,
  allocate_tensor_on_device (torch.empty: unset values, as on the device), linear, add, multiply,
  subtract, silu, sigmoid, neg, gelu, rms_norm, layer_norm,
  transformer.scaled_dot_product_attention (segments as cu_window_seqlens),
  transformer.chunked_scaled_dot_product_attention (paged KV, page table, chunk_start_idx),
  transformer.chunk_gated_delta_rule (the rank-3 flat layout adapted, see `delta_rule`),
  reduce_scatter, all_gather (all devices' twins at once, mesh metadata given, the composed
  result cut back per device).
The ops the device computes with f32 accumulation (linear, both attentions, rms_norm and
layer_norm: HiFi4, fp32 destination) get their bf16 twins widened to f32: their results are
rounded to the output's dtype once (`Shadow.set`), as the device rounds once. Torch's own bf16
kernels differ by CPU (oneDNN's AVX512-BF16 dot products, AVX2, generic loops), and so did the
goldens' answers: the worst bf16 media probability was 0.0417 / 0.0453 / 0.0502 under
ATEN_CPU_CAPABILITY avx512 / avx2 / default with bf16 inputs, 0.0398 / 0.0398 / 0.0361 widened
(the norms' widening moves no score under avx512 or avx2: torch's bf16 norms compute in f32).
Own shadows (the op has no golden function in ttnn 0.81.1, or is not a computation):
  Tensor               host values -> device: the numpy data, replicated or cut along dim 3 as
                       the mesh mapper does, stored in the tensor's dtype
  load_tensor          a matrix part's tile bytes as a host tensor: decoded by ttnn's own host
                       conversion (`ttnn.to_torch`; bfloat8_b / bfloat4_b unpacked)
  from_host_shards     the shards' values, one per device
  to_device            the host values (a single one replicated)
  from_device          (downloads read the twins; kept only if called)
  deallocate           drops the twin once the buffer is freed
  experimental.nlp_concat_heads      [1, H, T, D] -> [1, 1, T, H*D] (heads concatenated in order)
  experimental.rotary_embedding_hf   x * cos + rotate_half(x) * sin, rotate_half(x) =
                       concat(-x[..., D/2:], x[..., :D/2]), cos/sin [1, 1, T, D] over all heads
  experimental.paged_fill_cache      input token t -> cache[page_table[batch_idx, t // block], :,
                       t % block] (docs/ttnn-goldens.md, checked against the chunked SDPA golden)
  experimental.kda.qkv_causal_conv1d_silu   the op's docstring: over the 3 history rows then the
                       input, y[t] = tap0 x[t-3] + tap1 x[t-2] + tap2 x[t-1] + tap3 x[t], SiLU,
                       split into q, k, v widths; in f32 from the bf16 twins, rounded once to
                       the bf16 outputs (how the kernel accumulates is not documented: on chips
                       the spread can be wider, as the port measured)
                       (`_with_carry`: also the next history, the 3 rows of [history | input]
                       ending at actual_end)
  create_global_semaphore            no tensor: nothing to shadow
  experimental.nlp_create_qkv_heads   [B, 1, S, (H + 2 KV) D] cut into q, k, v heads in order
  experimental.minimal_matmul(_split) x @ w + bias, the fused activation (sigmoid, SiLU,
                       softplus), in f32, split into `chunks` equal column parts
"""

import numpy as np
import torch

# Arguments that only steer the device (configs, placement, the delta rule's constant tiles).
DEVICE_ONLY = frozenset(
    (
        "memory_config",
        "mem_config",
        "compute_kernel_config",
        "program_config",
        "device",
        "layout",
        "topology",
        "queue_id",
        "eye",
        "tril",
        "ones",
        "masks",
        "is_decode_mode",
        "num_links",
        "sub_core_grids",
    )
)

# Ops whose golden returns the device result's values in another (same-size) shape.
RESHAPED_OUTPUTS = frozenset(("transformer.chunk_gated_delta_rule",))


def _golden(sh, fn):
    return sh.ttnn.get_golden_function(fn)


def _widened(x):
    """A twin as f32 (a floating tensor, or a list of them); other values as they are."""
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.float()
    if isinstance(x, list):
        return [_widened(e) for e in x]
    return x


def per_device(keep=(), f32=False):
    """The golden of the op, once per device, on the twins of its tensor arguments; with `f32`,
    on the twins widened to f32 (the module's docs: the ops the device accumulates in f32)."""

    def body(sh, name, fn, args, kwargs, result):
        g = _golden(sh, fn)
        kw = {k: v for k, v in kwargs.items() if k not in DEVICE_ONLY or k in keep}
        arg = (lambda a, d: _widened(sh.arg(a, d))) if f32 else sh.arg
        outs = []
        for d in range(sh.n):
            outs.append(g(*[arg(a, d) for a in args], **{k: arg(v, d) for k, v in kw.items()}))
        sh.set(result, outs, name)

    return body


# -- collectives ----------------------------------------------------------------------------------
def _collective_inputs(sh, args, kwargs):
    x, dim = args[0], args[1]
    shards = [sh.twin(x, d) for d in range(sh.n)]
    kw = {
        "cluster_axis": kwargs.get("cluster_axis"),
        "_ttnn_golden_mesh_shape": (1, sh.n),
        "_ttnn_golden_mesh_shard_dims": (None, None),
    }
    return shards, dim, kw


def reduce_scatter(sh, name, fn, args, kwargs, result):
    """Sum over the line, device i keeps chunk i along dim: the golden returns the composed
    tensor (chunks concatenated along dim), cut back here."""
    shards, dim, kw = _collective_inputs(sh, args, kwargs)
    composed = _golden(sh, fn)(shards, dim, **kw)
    sh.set(result, list(torch.chunk(composed, sh.n, dim=dim)), name)


def all_gather(sh, name, fn, args, kwargs, result):
    """Every device gets the concatenation of all shards along dim (the composed result)."""
    shards, dim, kw = _collective_inputs(sh, args, kwargs)
    composed = _golden(sh, fn)(shards, dim, **kw)
    sh.set(result, [composed] * sh.n, name)


# -- the delta rule -------------------------------------------------------------------------------
def delta_rule(sh, name, fn, args, kwargs, result):
    """`transformer.chunk_gated_delta_rule`'s golden (q, k, v, g, beta; g log-space decay, beta
    post-sigmoid, state [B, HV, K, V], GQA value head hv -> key head hv // (HV/H)).

    The port's rank-3 flat layout (q/k [B, T, H*K], v [B, T, HV*V], raw q/k: the kernel
    L2-normalises them and applies `scale`) is not a layout the golden takes (docs/ttnn-goldens.md):
    here it is viewed as [B, T, H, K] / [B, T, HV, V] with K == V (the op's contract) and
    HV = beta's last dim, and the golden normalises q/k itself (`use_qk_l2norm=True`, eps 1e-6, on
    q/k in f32 as the kernel computes). The rank-4 layout (pre-normalised q/k) goes as is."""
    g = _golden(sh, fn)
    kw = {k: v for k, v in kwargs.items() if k not in DEVICE_ONLY}
    outs, states = [], []
    for d in range(sh.n):
        q, k, v, gate, beta = [sh.arg(a, d) for a in args[:5]]
        dkw = {key: sh.arg(val, d) for key, val in kw.items()}
        if q.dim() == 3:
            heads_v = beta.shape[-1]
            width = v.shape[-1] // heads_v
            b, t = q.shape[0], q.shape[1]
            q = q.float().reshape(b, t, q.shape[-1] // width, width)
            k = k.float().reshape(b, t, k.shape[-1] // width, width)
            v = v.reshape(b, t, heads_v, width)
            dkw["use_qk_l2norm"] = True
        o, s = g(q, k, v, gate, beta, **dkw)
        outs.append(o)
        states.append(s)
    o_t, s_t = result
    sh.set(o_t, outs, name)
    if s_t is not None and states[0] is not None:
        sh.set(s_t, states, name)


# -- ops without a golden function ----------------------------------------------------------------
def tensor(sh, name, fn, args, kwargs, result):
    """ttnn.Tensor(numpy data, data_type, layout, device, mesh_mapper): replicated when the data
    has the per-device shape, else cut along dim 3 (shard_tensor_to_mesh_mapper(mesh, 3))."""
    data = np.array(args[0], copy=True)
    shape = tuple(int(x) for x in result.shape)
    if data.shape == shape:
        parts = [data] * sh.n
    else:
        parts = np.split(data, sh.n, axis=3)
    sh.set(result, [torch.from_numpy(np.ascontiguousarray(p)) for p in parts], name)


def load_tensor(sh, name, fn, args, kwargs, result):
    """A host TILE tensor holding a matrix part's bytes: its values as ttnn decodes them."""
    sh._host[id(result)] = (result, [sh.ttnn.to_torch(result)])


def from_host_shards(sh, name, fn, args, kwargs, result):
    hosts = args[0]
    values = [sh.twins(h)[0] for h in hosts]
    for h in hosts:
        sh.forget_host(h)
    sh._host[id(result)] = (result, values)


def to_device(sh, name, fn, args, kwargs, result):
    host = args[0]
    values = list(sh.twins(host))
    sh.forget_host(host)
    if len(values) == 1:
        values = values * sh.n
    sh._dev[sh.key(result)] = [v.contiguous() for v in values]
    if tuple(values[0].shape) != tuple(int(x) for x in result.shape):
        raise RuntimeError(
            "golden shadow: to_device of %s into %s" % (list(values[0].shape), list(result.shape))
        )


def from_device(sh, name, fn, args, kwargs, result):
    """Only downloads read a device tensor back, and in this mode they read the twins; a shard
    read back otherwise has no twin to carry."""


def deallocate(sh, name, fn, args, kwargs, result):
    """Nothing to compute. The twin is dropped by key once the buffer is gone (the key needs the
    address, which a deallocated tensor no longer has: Shadow.before keeps it)."""
    key = sh.pending_free.pop(id(args[0]), None)
    if key is not None and not args[0].is_allocated():
        sh._dev.pop(key, None)


def nlp_concat_heads(sh, name, fn, args, kwargs, result):
    """[1, H, T, D] -> [1, 1, T, H*D]: token-major, heads concatenated in order."""
    outs = []
    for d in range(sh.n):
        x = sh.twin(args[0], d)
        b, h, t, dd = x.shape
        outs.append(x.permute(0, 2, 1, 3).reshape(b, 1, t, h * dd))
    sh.set(result, outs, name)


def rotary_embedding_hf(sh, name, fn, args, kwargs, result):
    """HF rotate-half rotary embedding (prefill): x [B, H, T, D], cos/sin [1, 1, T, D]:
    x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x2, x1) of the halves of D."""
    outs = []
    for d in range(sh.n):
        x, cos, sin = [sh.twin(a, d).float() for a in args[:3]]
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        outs.append(x * cos + rot * sin)
    sh.set(result, outs, name)


def paged_fill_cache(sh, name, fn, args, kwargs, result):
    """In place: input [1, NKV, S, D] token t -> cache[page_table[batch_idx, t // block], :,
    t % block]; cache [blocks, NKV, block, D]. The new twin is a copy (earlier slices of the cache
    keep their values)."""
    cache_t, inp_t, table_t = args[:3]
    batch = int(kwargs.get("batch_idx", args[3] if len(args) > 3 else 0))
    outs = []
    for d in range(sh.n):
        cache = sh.twin(cache_t, d).clone()
        x = sh.twin(inp_t, d)
        table = sh.twin(table_t, d).long().reshape(-1, sh.twin(table_t, d).shape[-1])
        block = cache.shape[2]
        s = x.shape[2]
        pos = torch.arange(s)
        pages = table[batch, pos // block]
        cache[pages, :, pos % block] = x[0].permute(1, 0, 2).to(cache.dtype)
        outs.append(cache)
    sh.set(cache_t, outs, name)
    if result is not None and sh.is_tensor(result) and sh.key(result) != sh.key(cache_t):
        sh.set(result, outs, name)


def qkv_causal_conv1d_silu(sh, name, fn, args, kwargs, result):
    """Four-tap causal depthwise conv + SiLU over [history | input], split in q, k, v (see the
    module docstring)."""
    x_t, hist_t, taps_t = args[0], args[1], args[2:6]
    widths = [int(w) for w in args[6:9]]
    col0 = int(kwargs.get("input_column_offset", 0))
    width = sum(widths)
    outs = [[], [], []]
    if name.endswith("_with_carry"):
        outs.append([])
    for d in range(sh.n):
        x = sh.twin(x_t, d).float()
        x = x.reshape(1, x.shape[-2], x.shape[-1])[..., col0 : col0 + width]
        ext = torch.cat([sh.twin(hist_t, d).float().reshape(1, -1, width), x], dim=1)
        taps = [sh.twin(t, d).float().reshape(-1) for t in taps_t]
        rows = x.shape[1]
        y = sum(taps[j] * ext[:, j : j + rows] for j in range(len(taps)))
        for i, part in enumerate(torch.split(torch.nn.functional.silu(y), widths, dim=-1)):
            outs[i].append(part.contiguous())
        if name.endswith("_with_carry"):
            # The next history: the 3 rows ending at actual_end (history rows in front).
            end = int(sh.twin(kwargs["actual_end"], d).reshape(-1)[0])
            outs[3].append(ext[:, end : end + 3].reshape(1, 3, width).contiguous())
    for r, values in zip(result, outs):
        sh.set(r, values, name)


def copy(sh, name, fn, args, kwargs, result):
    """ttnn.copy(a, b): b's buffer takes a's values, in b's dtype (in place)."""
    src, dst = args[:2]
    sh.set(dst, [sh.twin(src, d) for d in range(sh.n)], name)


def copy_host_to_device_tensor(sh, name, fn, args, kwargs, result):
    """A host tensor's values written into a device tensor's buffer (in place)."""
    host, dst = args[:2]
    values = list(sh.twins(host))
    sh.forget_host(host)
    if len(values) == 1:
        values = values * sh.n
    sh.set(dst, values, name)


def not_a_tensor(sh, name, fn, args, kwargs, result):
    """A call that makes no tensor (a global semaphore): nothing to shadow."""


def nlp_create_qkv_heads(sh, name, fn, args, kwargs, result):
    """[B, 1, S, (H + 2 KV) D] -> q [B, H, S, D], k [B, KV, S, D] (transposed to [B, KV, D, S]
    unless transpose_k_heads=False), v [B, KV, S, D]: the fused columns cut into heads in
    order."""
    h = int(kwargs["num_heads"])
    kv = int(kwargs.get("num_kv_heads") or h)
    outs = [[], [], []]
    for d in range(sh.n):
        x = sh.twin(args[0], d)
        b, _, s, width = x.shape
        heads = x.reshape(b, s, h + 2 * kv, width // (h + 2 * kv)).permute(0, 2, 1, 3)
        k = heads[:, h : h + kv]
        if kwargs.get("transpose_k_heads", True):
            k = k.transpose(-2, -1)
        for i, part in enumerate((heads[:, :h], k, heads[:, h + kv :])):
            outs[i].append(part.contiguous())
    for r, values in zip(result, outs):
        sh.set(r, values, name)


def _activation(x, act):
    """A fused UnaryWithParam (the ones the package fuses into matmuls) on a torch tensor."""
    kind = str(act.op_type).rsplit(".", 1)[-1]
    if kind == "SIGMOID":
        return torch.sigmoid(x)
    if kind == "SILU":
        return torch.nn.functional.silu(x)
    if kind == "SOFTPLUS":
        beta, threshold = act.params
        return torch.nn.functional.softplus(x, beta=beta, threshold=threshold)
    raise ValueError("no shadow for the fused activation %s" % kind)


def minimal_matmul(sh, name, fn, args, kwargs, result):
    """x @ w, + bias_tensor, the fused_activation: in f32 from the widened twins (HiFi4, f32
    accumulation), rounded once to the output; `chunks` equal parts along the last dim for
    minimal_matmul_split."""
    chunks = int(kwargs.get("chunks", 1)) if name.endswith("_split") else 1
    outs = [[] for _ in range(chunks)]
    for d in range(sh.n):
        y = sh.twin(args[0], d).float() @ sh.twin(args[1], d).float().reshape(
            sh.twin(args[1], d).shape[-2:]
        )
        if kwargs.get("bias_tensor") is not None:
            y = y + sh.twin(kwargs["bias_tensor"], d).float().reshape(-1)
        if kwargs.get("fused_activation") is not None:
            y = _activation(y, kwargs["fused_activation"])
        for i, part in enumerate(torch.chunk(y, chunks, dim=-1)):
            outs[i].append(part.contiguous())
    results = result if chunks > 1 else [result]
    for r, values in zip(results, outs):
        sh.set(r, values, name)


HANDLERS = {
    # golden functions
    "reshape": ("golden", per_device()),
    "slice": ("golden", per_device()),
    "concat": ("golden", per_device()),
    "pad": ("golden", per_device()),
    "permute": ("golden", per_device()),
    "typecast": ("golden", per_device()),
    "to_layout": ("golden", per_device()),
    "clone": ("golden", per_device()),
    "zeros": ("golden", per_device()),
    "allocate_tensor_on_device": ("golden", per_device()),
    "linear": ("golden", per_device(keep=("program_config",), f32=True)),
    "add": ("golden", per_device()),
    "multiply": ("golden", per_device()),
    "subtract": ("golden", per_device()),
    "silu": ("golden", per_device()),
    "sigmoid": ("golden", per_device()),
    "neg": ("golden", per_device()),
    "gelu": ("golden", per_device()),
    "rms_norm": ("golden", per_device(f32=True)),
    "layer_norm": ("golden", per_device(f32=True)),
    "transformer.scaled_dot_product_attention": ("golden", per_device(f32=True)),
    "transformer.chunked_scaled_dot_product_attention": ("golden", per_device(f32=True)),
    "transformer.chunk_gated_delta_rule": ("golden", delta_rule),
    "reduce_scatter": ("golden", reduce_scatter),
    "all_gather": ("golden", all_gather),
    # own shadows
    "Tensor": ("own", tensor),
    "load_tensor": ("own", load_tensor),
    "from_host_shards": ("own", from_host_shards),
    "to_device": ("own", to_device),
    "from_device": ("own", from_device),
    "deallocate": ("own", deallocate),
    "copy": ("own", copy),
    "copy_host_to_device_tensor": ("own", copy_host_to_device_tensor),
    "experimental.nlp_concat_heads": ("own", nlp_concat_heads),
    "experimental.rotary_embedding_hf": ("own", rotary_embedding_hf),
    "experimental.paged_fill_cache": ("own", paged_fill_cache),
    "experimental.kda.qkv_causal_conv1d_silu": ("own", qkv_causal_conv1d_silu),
    "experimental.kda.qkv_causal_conv1d_silu_with_carry": ("own", qkv_causal_conv1d_silu),
    "create_global_semaphore": ("own", not_a_tensor),
    "experimental.nlp_create_qkv_heads": ("own", nlp_create_qkv_heads),
    "experimental.minimal_matmul": ("own", minimal_matmul),
    "experimental.minimal_matmul_split": ("own", minimal_matmul),
}
