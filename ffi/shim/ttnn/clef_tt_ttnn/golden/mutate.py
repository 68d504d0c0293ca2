"""Deliberate convention changes in the op mapping (`CLEF_TT_GOLDEN_MUTATE=NAME`, golden-shadow mode
only): each wraps one ABI op of the mesh so that it calls ttnn with a convention the op does not
have, as a mapping bug would. The golden shadow must then move the answers out of the bf16 band
(tests/tt_golden.rs). The host backend cannot see such a change: it implements our own reading of
each op, not ttnn's.

- gate_sign:  the delta rule gets +exp(A_log) * softplus(a + dt_bias) (the sign of the
              log-space decay flipped: g >= 0, a growing state): the -exp(A_log) row both
              delta_gates and the DeltaNet layer op multiply by is made as +exp(A_log).
- raw_gamma:  rms_norm uses the raw weight w where the zero-centred norm needs 1 + w (and
              1 + w where the raw weight is meant).

Three more reach only the paths of Clef 27B's per-head geometry (tiny-clef-g27), which tiny-clef
never takes:
- rope_swap:  the fused rope (`experimental.rotary_embedding_hf`, rotary dims 32 or a multiple of
              64) gets sin where it takes cos and cos where it takes sin.
- qk_swap:    the delta rule's rank-3 flat layout (key dim == value dim) gets k where it takes q
              and q where it takes k.
- vision_pad: the vision tower's attention, whose heads of 72 are padded to 96 for SDPA, keeps
              the last 72 of the 96 channels (24 of them padding) instead of the first 72.
              (Splitting the heads as 2 x 36, or scaling by 96^-0.5, stays in the band: the tiny
              tower's attention is near uniform, so neither reaches the answers.)
- keep_unmasked: a batched pass keeping a prefix's recurrent state (a prefix-cache miss) masks
              the gates of the whole block, not only after the prefix: the state kept is the
              block's final one. Only a hit of that state sees it; the tiny model's answers move
              ~1e-3, inside the bf16 band, so tests/tt_golden.rs holds these to a tolerance of
              their own (`KEPT_TOLERANCE`).
- drop_silu:  the MLP's SwiGLU multiplies gate and up without the SiLU on the gate (a
              dropped activation; the layer op and the fine `swiglu`).
- qg_order:   the attention's fused query|gate heads read in the wrong order: the gate
              heads taken as queries and the queries as gates (the layer op and the fine
              `split_query_gate`).
- rope_channels: the fused rope (rotary dims 32 or a multiple of 64, so tiny-clef-g27's paths)
              rotates the last rotary-dims channels of each head and passes the first ones
              through, instead of the reverse.
- carry_row:  the native conv's carry is taken one row early (the rows before the last
              kernel-1 ones: `actual_end` t - 1, or the slices ending there), so the state kept
              for the next chunk is at the wrong row. Only a continuation reads it.
- stale_input: a traced pass (passes.py) does not write its rows into the persistent input
              before a replay: the trace reads the rows of the pass before. Only replays see
              it (the first pass of a bucket runs eagerly, the second is captured).
"""

import types

import numpy as np


def _gate_sign(mesh):
    plain = mesh.row_of

    def row_of(self, vec, key, dtype, transform=None):
        if key == "neg_exp_f32":
            return plain(vec, "pos_exp_f32", dtype, np.exp)
        return plain(vec, key, dtype, transform)

    mesh.row_of = types.MethodType(row_of, mesh)


def _raw_gamma(mesh):
    plain = mesh.gamma

    def gamma(self, w, group, one_plus):
        return plain(w, group, not one_plus)

    mesh.gamma = types.MethodType(gamma, mesh)


def _rope_swap(mesh):
    plain = mesh.rope_tables

    def rope_tables(self, tables, full):
        cos, sin = plain(tables, full)
        return (sin, cos) if full else (cos, sin)

    mesh.rope_tables = types.MethodType(rope_tables, mesh)


def _qk_swap(mesh):
    dispatcher = mesh.tt
    plain = dispatcher.call

    def call(self, name, fn, *args, **kwargs):
        if name == "transformer.chunk_gated_delta_rule" and len(args[0].shape) == 3:
            args = (args[1], args[0]) + tuple(args[2:])
        return plain(name, fn, *args, **kwargs)

    dispatcher.call = types.MethodType(call, dispatcher)


def _vision_pad(mesh):
    plain = mesh._heads_out

    def heads_out(self, o, r0, r1, d):
        if d == 72:
            s = self.shape(o)
            part = self.slice(o, (0, 0, r0, s[3] - d), (s[0], s[1], r1, s[3]))
            flat = self.heads_last(part)
            return self.typecast(flat, self.act_dtype)
        return plain(o, r0, r1, d)

    mesh._heads_out = types.MethodType(heads_out, mesh)


def _keep_unmasked(mesh):
    plain = mesh._keep_mask

    def keep_mask(self, each, width, keep):
        return plain(each, width, [each if n else 0 for n in keep])

    mesh._keep_mask = types.MethodType(keep_mask, mesh)


def _stale_input(mesh):
    plain = mesh._write

    def write(self, t, array, dtype, layout):
        ctx = self.pass_writing
        if ctx is not None and ctx.replaying and t is ctx.rows_in:
            return
        plain(t, array, dtype, layout)

    mesh._write = types.MethodType(write, mesh)


def _drop_silu(mesh):
    dispatcher = mesh.tt
    plain = dispatcher.call
    silu = mesh.ttnn.UnaryOpType.SILU

    def call(self, name, fn, *args, **kwargs):
        acts = kwargs.get("input_tensor_a_activations")
        if name == "multiply" and acts and all(a.op_type == silu for a in acts):
            kwargs = {k: v for k, v in kwargs.items() if k != "input_tensor_a_activations"}
        return plain(name, fn, *args, **kwargs)

    dispatcher.call = types.MethodType(call, dispatcher)


def _qg_order(mesh):
    plain_heads, plain_split = mesh.query_gate_heads, mesh.split_query_gate

    def query_gate_heads(self, qg, hb, heads, he, d):
        q, gate = plain_heads(qg, hb, heads, he, d)
        return gate, q

    def split_query_gate(self, qg, heads, head_dim):
        q, gate = plain_split(qg, heads, head_dim)
        return gate, q

    mesh.query_gate_heads = types.MethodType(query_gate_heads, mesh)
    mesh.split_query_gate = types.MethodType(split_query_gate, mesh)


def _rope_channels(mesh):
    plain = mesh.rope_heads

    def rope_heads(self, xh, tables, rot, d):
        if rot >= d:
            return plain(xh, tables, rot, d)
        head, tail = self.cols(xh, 0, d - rot), self.cols(xh, d - rot, d)
        return self.concat([head, plain(tail, tables, rot, rot)], 3)

    mesh.rope_heads = types.MethodType(rope_heads, mesh)


def _carry_row(mesh):
    plain_end, plain_carry = mesh._conv_end, mesh.conv_carry

    def conv_end(self, t):
        return plain_end(t - 1)

    def conv_carry(self, xt, t, ch):
        return plain_carry(xt, t - 1, ch)

    mesh._conv_end = types.MethodType(conv_end, mesh)
    mesh.conv_carry = types.MethodType(conv_carry, mesh)


MUTATIONS = {
    "gate_sign": _gate_sign,
    "raw_gamma": _raw_gamma,
    "rope_swap": _rope_swap,
    "qk_swap": _qk_swap,
    "vision_pad": _vision_pad,
    "keep_unmasked": _keep_unmasked,
    "drop_silu": _drop_silu,
    "qg_order": _qg_order,
    "rope_channels": _rope_channels,
    "carry_row": _carry_row,
    "stale_input": _stale_input,
}


def apply(mesh, name):
    if name not in MUTATIONS:
        raise ValueError("CLEF_TT_GOLDEN_MUTATE=%s: one of %s" % (name, ", ".join(MUTATIONS)))
    MUTATIONS[name](mesh)
