"""The text prefill's dense ops (a mesh mixin): linear, all_reduce, split_cols, add, rms_norm,
swiglu, split_query_gate, rope, mul_sigmoid.

- linear: `ttnn.linear` with the profile's compute kernel config and the port's program config
  (programs.py); every result is in the activation dtype, a row-parallel projection's partial
  sums too (bf16 under bf16 activations: the port's bf16 collectives, half the Ethernet bytes
  and no casts around them); `bf16_activations` casts f32 activations to bf16 first.
- all_reduce: the port's composite all-reduce in the partial sums' dtype: `reduce_scatter` then
  `all_gather` on the last dim over the mesh line (cluster axis 1; the reduce-scatter with
  `ccl_options`): two device ops.
- rms_norm (and gated_rms_norm in delta.py): `ttnn.rms_norm` over the last dim, per group via a
  [1, T, groups, group] view, epsilon as given, the gamma a [1, 1, 1, group] f32 TILE row (1 + w
  for the zero-centred norms, made once per weight), HiFi4 / fp32 accumulation.
- rope: partial interleaved M-RoPE with the core's host tables (cos/sin [T, half], uploaded once
  for the q and k of a layer: a small per-mesh cache keyed by the tables' bytes). As the port:
  heads first, `experimental.rotary_embedding_hf` (HF rotate-half, tables [1, 1, T, 2*half]) on
  the leading 2*half channels of each head, the rest passed through, heads concatenated back.
  Rotary widths that op refuses (not 32 or a multiple of 64) take a token-major form: cos/sin
  rows [1, T, 1, half] broadcast over heads, rotate-half by slices.
"""

import hashlib
import os

import numpy as np

from .meta import BF16, F32, f32, tile_bytes
from .programs import kernel_config, matmul_program, precise


def ccl_options(ttnn):
    """reduce_scatter's topology and links: Linear (a P150x2 line) unless CLEF_TT_RING=1 (Ring,
    as the port ran on a P300x2); CLEF_TT_NUM_LINKS fixes the Ethernet links (2 on a single
    QSFP-DD cable), else ttnn picks. (all_gather chooses both itself in ttnn 0.81.)"""
    out = {
        "topology": ttnn.Topology.Ring
        if os.environ.get("CLEF_TT_RING") == "1"
        else ttnn.Topology.Linear
    }
    links = os.environ.get("CLEF_TT_NUM_LINKS", "")
    if links.isdigit() and int(links) > 0:
        out["num_links"] = int(links)
    return out


class TextOps:
    """Dense text ops (mesh mixin)."""

    _ccl = None

    def linear(self, x, w, config):
        (mx, xo), mw = x, w[0]
        if mx.cols != mw.rows:
            raise ValueError(
                "linear: input width %d vs weight [in %d, out %d]" % (mx.cols, mw.rows, mw.cols)
            )
        return self.wrap(self.matmul(xo.t, mx.rows, w, config))

    def matmul(self, xt, rows, w, config):
        """x [1, 1, rows, in] times a matrix weight (meta, obj) -> a ttnn tensor in the
        activation dtype, with the profile's kernel config and the port's program config."""
        mw, wo = w
        ttnn = self.ttnn
        ckc = kernel_config(
            ttnn,
            int(config.get("fidelity", 0)),
            config.get("fp32_dest_acc", 1),
            config.get("packer_l1_acc", 0),
        )
        cast = None
        if config.get("bf16_activations", 0) and xt.dtype == ttnn.float32:
            xt = cast = self.typecast(xt, ttnn.bfloat16)
        out_dtype = self.act_dtype
        pc = matmul_program(
            ttnn,
            rows,
            mw.rows,
            mw.cols,
            self.grid,
            in0_tile=tile_bytes(BF16 if xt.dtype == ttnn.bfloat16 else F32),
            in1_tile=tile_bytes(mw.dtype),
            out_tile=tile_bytes(BF16 if out_dtype == ttnn.bfloat16 else F32),
        )
        y = self.tt.call(
            "linear",
            ttnn.linear,
            xt,
            wo.t,
            compute_kernel_config=ckc,
            program_config=pc,
            memory_config=self.dram,
            dtype=out_dtype,
        )
        self.drop(cast)
        return y

    def ccl_options(self):
        """`ccl_options` as the environment says at the mesh's first collective (read once:
        environment look-ups on every call were ~1% of a chunk's host time)."""
        if self._ccl is None:
            self._ccl = ccl_options(self.ttnn)
        return self._ccl

    def all_reduce(self, x):
        return self.wrap(self.reduced(x[1].t))

    def reduced(self, t):
        """The all-reduce of partial sums `t` over the mesh, in the activation dtype."""
        ttnn = self.ttnn
        if self.n == 1:
            total = self.tt.call("clone", ttnn.clone, t, memory_config=self.dram)
        else:
            ccl = self.ccl_options()
            scattered = self.tt.call(
                "reduce_scatter",
                ttnn.reduce_scatter,
                t,
                3,
                cluster_axis=1,
                memory_config=self.dram,
                **ccl,
            )
            # all_gather takes no topology or links in 0.81 (deprecated and ignored, with a
            # warning per call): it picks them from the fabric itself.
            total = self.tt.call(
                "all_gather", ttnn.all_gather, scattered, 3, cluster_axis=1, memory_config=self.dram
            )
            self.drop(scattered)
        out = self.typecast(total, self.act_dtype)
        if out is not total:
            self.drop(total)
        return out

    def split_cols(self, x, widths):
        mx, xo = x
        if sum(widths) != mx.cols or any(w <= 0 for w in widths):
            raise ValueError("split_cols: %d columns split as %s" % (mx.cols, list(widths)))
        out, start = [], 0
        for w in widths:
            part = self.cols(xo.t, start, start + w)
            if part is xo.t:
                part = self.tt.call("clone", self.ttnn.clone, part, memory_config=self.dram)
            out.append(self.wrap(part))
            start += w
        return out

    def add(self, a, b):
        return self.wrap(
            self.tt.call("add", self.ttnn.add, a[1].t, b[1].t, memory_config=self.dram)
        )

    def gamma(self, w, group, one_plus):
        """The [1, 1, 1, group] TILE gamma of a norm weight (1 + w when one_plus)."""
        return self.row_of(
            w, ("gamma", one_plus), self.ttnn.float32, (lambda v: v + 1.0) if one_plus else None
        )

    def norm_groups(self, xt, rows, cols, group, eps, gamma, ckc=None):
        """ttnn.rms_norm over each `group` columns of [1, 1, rows, cols] -> same shape (HiFi4
        unless the kernel config `ckc` is given)."""
        groups = cols // group
        view = xt if groups == 1 else self.reshape(xt, (1, rows, groups, group))
        y = self.tt.call(
            "rms_norm",
            self.ttnn.rms_norm,
            view,
            epsilon=f32(eps),
            weight=gamma,
            compute_kernel_config=ckc or precise(self.ttnn),
            memory_config=self.dram,
        )
        if view is not xt:
            self.drop(view)
        out = self.reshape(y, (1, 1, rows, cols))
        if out is not y:
            self.drop(y)
        return out

    def rms_norm(self, x, w, group, eps, one_plus):
        mx, xo = x
        if group <= 0 or mx.cols % group:
            raise ValueError("rms_norm: %d columns in groups of %d" % (mx.cols, group))
        gamma = self.gamma(w[1], group, bool(one_plus))
        return self.wrap(self.norm_groups(xo.t, mx.rows, mx.cols, group, eps, gamma))

    def swiglu(self, gate_up):
        mx, xo = gate_up
        half = mx.cols // 2
        gate = self.cols(xo.t, 0, half)
        up = self.cols(xo.t, half, 2 * half)
        out = self.tt.call(
            "multiply",
            self.ttnn.multiply,
            gate,
            up,
            input_tensor_a_activations=[self.unary("SILU")],
            memory_config=self.dram,
        )
        self.drop(gate, up)
        return self.wrap(out)

    def split_query_gate(self, qg, heads, head_dim):
        mx, xo = qg
        if heads * 2 * head_dim != mx.cols:
            raise ValueError(
                "split_query_gate: %d columns for %d heads of [query | gate] x %d"
                % (mx.cols, heads, head_dim)
            )
        per_head = self.reshape(xo.t, (1, mx.rows, heads, 2 * head_dim))
        outs = []
        for c0 in (0, head_dim):
            part = self.cols(per_head, c0, c0 + head_dim)
            flat = self.reshape(part, (1, 1, mx.rows, heads * head_dim))
            if flat is not part:
                self.drop(part)
            outs.append(self.wrap(flat))
        if per_head is not xo.t:
            self.drop(per_head)
        return outs[0], outs[1]

    def rope_tables(self, tables, full):
        """Device cos and sin of the core's host tables [T, half] (cached for the next call with
        the same tables: the q and k of one layer). full: HF form [1, 1, T, 2*half] (each table
        twice, as rotary_embedding_hf takes it); else [1, T, 1, half] rows broadcast over heads.
        In a pass (passes.py): the pass's input tables."""
        if self.pass_ctx is not None and full:
            return self.pass_ctx.rope
        last = self._rope_last.get(full)
        if last is not None and last[0] is tables and all(t.is_allocated() for t in last[1]):
            # The bridge passes the same tables object while they are the same (its cache).
            return last[1]
        rows, half, cos, sin = tables
        key = (
            "rope",
            full,
            rows,
            half,
            hashlib.sha1(bytes(cos)).digest(),
            hashlib.sha1(bytes(sin)).digest(),
        )
        hit = self.internal.get(key)
        if hit is not None:
            self._rope_last[full] = (tables, hit)
            return hit
        for old in [k for k in self.internal if k[0] == "rope"]:
            self.drop_internal(old)
        made = []
        for data in (cos, sin):
            a = np.frombuffer(bytes(data), dtype=np.float32).reshape(rows, half)
            a = (
                np.concatenate([a, a], axis=1).reshape(1, 1, rows, 2 * half)
                if full
                else a.reshape(1, rows, 1, half)
            )
            made.append(self.host_rows([a], self.act_dtype, self.ttnn.TILE_LAYOUT))
        self.keep_internal(key, tuple(made))
        self._rope_last[full] = (tables, tuple(made))
        return tuple(made)

    def rope(self, x, tables, heads, head_dim):
        mx, xo = x
        rows, half = int(tables[0]), int(tables[1])
        if rows != mx.rows or heads * head_dim != mx.cols or 2 * half > head_dim:
            raise ValueError(
                "rope: %dx%d for %d heads x %d with tables of %d rows x %d"
                % (mx.rows, mx.cols, heads, head_dim, rows, half)
            )
        if half == 0:
            return self.wrap(self.tt.call("clone", self.ttnn.clone, xo.t, memory_config=self.dram))
        rot = 2 * half
        if rot == 32 or rot % 64 == 0:
            return self.wrap(self._rope_hf(xo.t, tables, rows, heads, head_dim, rot))
        return self.wrap(self._rope_rows(xo.t, tables, rows, heads, head_dim, half))

    def _rope_hf(self, xt, tables, rows, heads, d, rot):
        """The port's partial rope on token-major rows: heads first, then `rope_heads`."""
        xh = self.heads_first(xt, heads, d)
        joined = self.rope_heads(xh, tables, rot, d)
        out = self.heads_last(joined)
        self.drop(*[t for t in (xh, joined) if t is not out and t is not xt])
        return out

    def rope_heads(self, xh, tables, rot, d):
        """Heads-first [1, H, T, d]: `experimental.rotary_embedding_hf` on the leading `rot`
        channels of each head, the rest passed through (rot == 32 or a multiple of 64)."""
        cos, sin = self.rope_tables(tables, True)
        part = self.cols(xh, 0, rot)
        roped = self.tt.call(
            "experimental.rotary_embedding_hf",
            self.ttnn.experimental.rotary_embedding_hf,
            part,
            cos,
            sin,
            is_decode_mode=False,
            memory_config=self.dram,
        )
        rest = self.cols(xh, rot, d) if rot < d else None
        joined = self.concat([roped, rest], 3)
        self.drop(*[t for t in (part, roped, rest) if t is not joined and t is not xh])
        return joined

    def _rope_rows(self, xt, tables, rows, heads, d, half):
        """Rotary dims the fused op refuses (not 32 or a multiple of 64): token-major, cos/sin
        rows broadcast over heads, rotate-half by slices."""
        cos, sin = self.rope_tables(tables, False)
        ttnn, call, dram = self.ttnn, self.tt.call, self.dram
        xs = self.reshape(xt, (1, rows, heads, d))
        a = self.cols(xs, 0, half)
        b = self.cols(xs, half, 2 * half)
        ac = call("multiply", ttnn.multiply, a, cos, memory_config=dram)
        bs = call("multiply", ttnn.multiply, b, sin, memory_config=dram)
        ra = call("subtract", ttnn.subtract, ac, bs, memory_config=dram)
        bc = call("multiply", ttnn.multiply, b, cos, memory_config=dram)
        as_ = call("multiply", ttnn.multiply, a, sin, memory_config=dram)
        rb = call("add", ttnn.add, bc, as_, memory_config=dram)
        rest = self.cols(xs, 2 * half, d) if 2 * half < d else None
        joined = self.concat([ra, rb, rest], 3)
        out = self.reshape(joined, (1, 1, rows, heads * d))
        self.drop(
            *[
                t
                for t in (xs, a, b, ac, bs, bc, as_, ra, rb, rest, joined)
                if t is not out and t is not xt
            ]
        )
        return out

    def mul_sigmoid(self, x, gate):
        return self.wrap(
            self.tt.call(
                "multiply",
                self.ttnn.multiply,
                x[1].t,
                gate[1].t,
                input_tensor_b_activations=[self.unary("SIGMOID")],
                memory_config=self.dram,
            )
        )
