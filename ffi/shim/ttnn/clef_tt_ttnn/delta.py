"""The Gated DeltaNet ops (a mesh mixin): causal_conv1d_silu, delta_gates, gated_delta_rule,
gated_rms_norm.

- causal_conv1d_silu: ttnn's native four-tap conv (`experimental.kda.qkv_causal_conv1d_silu`:
  depthwise conv + SiLU in one program, reading the carried rows as its `history`, a ROW_MAJOR
  bf16 [1, 3, channels] tensor) wherever it applies: bf16 activations, 4 taps, channels a
  multiple of 32 (at least 96: the op splits its output in three tile-aligned parts, joined
  again here by one concat) and at least 3 rows. The rows are padded to a multiple of 32 for
  it (a fill of the pad, no data movement) and its output cut back; the new carry is the input's
  last 3 rows, taken from the last one or two 32-row tiles (a small untilize of <= 64 rows,
  never of the activation), and stays ROW_MAJOR bf16, the form the next chunk's call reads. 5-7
  device ops instead of the FIR's 25. The op computes in bf16; the port measured it 8% faster
  than its FIR but with a wider parity spread (max |dp| 0.108 vs 0.072, housTT
  cloudflare_clef doc/optimized), so `CLEF_TT_GDN_CONV=fir` keeps the FIR below (for comparison
  on chips).
  Elsewhere (f32 activations, other kernels or widths, 1-2 rows) the port's FIR form
  (QWEN_GDN_CONV=fir): the input extended by the carried kernel-1 rows (zeros without a carry),
  each tap a shifted multiply by a per-channel [1, 1, 1, channels] row, summed, then SiLU; in f32
  (the port accumulates in bf16; the ABI's reference is f32), the output in the activation dtype;
  the new carry is the extended input's last kernel-1 rows. Works for any row count (also fewer
  rows than the carry).
- delta_gates: in f32 (the port's GDN_GATE_FP32): g = -exp(A_log) * softplus(a + dt_bias), the
  softplus fused into the add as the port does (UnaryWithParam(SOFTPLUS, 1, 20)), -exp(A_log) a
  row computed once per weight; beta = sigmoid(b), the sigmoid as a binary op's activation (one
  program, and a third of a unary op's host cost on the mock). a and b come in bf16 and are not
  typecast: each add is against an f32 row (dt_bias; zeros for beta) with dtype f32, so the op
  widens and writes f32 itself (one device op each, checked with graph capture).
- gated_delta_rule: `transformer.chunk_gated_delta_rule` with chunk 32, f32 initial/final state
  [1, value_heads, key_dim, value_dim], head-major output, the constant tiles passed (made once per
  mesh). With key_dim == value_dim (after padding both to multiples of 32) the port's rank-3 flat
  layout is used (raw q/k/v, L2 norm and scale in the kernel); otherwise the rank-4 layout with
  q/k L2-normalised here (rms_norm with eps 1e-6/K times K^-0.5 equals x / sqrt(sum x^2 + 1e-6)).
  T is padded to a multiple of 32 with zero rows, g = 0 and beta = 0 (identity state updates, as
  the port masks padded buckets). One call takes the whole chunk (the port's engine calls it
  once per chunk of up to 2,048 rows); longer inputs go in pieces of 2,048 rows with the state
  carried. Head dims not multiples of 32 are zero-padded (the op
  refuses them; zero channels change neither norms nor products), and sliced off after.
- gated_rms_norm: rms_norm per group with the raw weight, times silu(z) (the SiLU as the
  multiply's input activation, one program; not ttnn's fused gated norm: the port found that
  form overflows for large z).
"""

import os

import numpy as np

from .meta import TILE_SIZE, f32, round_up
from .programs import precise

# Rows per chunk_gated_delta_rule call: the port's largest prefill chunk.
DELTA_PIECE = 2048
DELTA_CHUNK = 32
# Taps of ttnn's native causal conv (experimental.kda.qkv_causal_conv1d_silu).
NATIVE_CONV_TAPS = 4
# CLEF_TT_GDN_CONV=fir keeps the FIR form everywhere (read once, at import).
CONV_FORM = os.environ.get("CLEF_TT_GDN_CONV", "native")
# Where the DeltaNet layer op takes the conv's next history: from the kernel ("kernel", one op:
# qkv_causal_conv1d_silu_with_carry), or cut from the input rows ("slices": a tile slice, a
# <= 64-row untilize and a row-major slice, as the fine conv op does). Read once, at import.
CARRY_FORM = os.environ.get("CLEF_TT_GDN_CARRY", "kernel")


class DeltaOps:
    """DeltaNet ops (mesh mixin)."""

    def causal_conv1d_silu(self, x, w, carry, kernel):
        mx = x[0]
        if kernel < 2:
            raise ValueError("causal_conv1d_silu: kernel %d (at least 2 taps)" % kernel)
        if self.native_conv(mx.rows, mx.cols, kernel):
            return self._conv_native(x, w, carry)
        return self._conv_fir(x, w, carry, kernel)

    def native_conv(self, rows, channels, kernel):
        """Whether causal_conv1d_silu takes ttnn's native conv (see the module docstring)."""
        return (
            CONV_FORM != "fir"
            and kernel == NATIVE_CONV_TAPS
            and self.act_dtype == self.ttnn.bfloat16
            and channels % TILE_SIZE == 0
            and channels >= 3 * TILE_SIZE
            and rows >= NATIVE_CONV_TAPS - 1
        )

    def _conv_history(self, carry, ch):
        """The conv's ROW_MAJOR bf16 [1, 3, ch] history: the carry as the native conv left it,
        an uploaded or FIR-made TILE carry converted, or zeros (made once per width)."""
        ttnn, keep = self.ttnn, NATIVE_CONV_TAPS - 1
        if carry is None:
            return self.internal_once(
                ("conv_zero_history", ch),
                lambda: self.host_rows(
                    [np.zeros((1, keep, ch), np.float32)], ttnn.bfloat16, ttnn.ROW_MAJOR_LAYOUT
                ),
            ), []
        made = []
        h = carry[1].t
        if h.layout != ttnn.ROW_MAJOR_LAYOUT:
            h = self.tt.call(
                "to_layout", ttnn.to_layout, h, ttnn.ROW_MAJOR_LAYOUT, memory_config=self.dram
            )
            made.append(h)
        if h.dtype != ttnn.bfloat16:
            h = self.typecast(h, ttnn.bfloat16)
            made.append(h)
        h3 = self.reshape(h, (1, keep, ch))
        if h3 is not h:
            made.append(h3)
        return h3, made

    def _conv_start(self):
        """The native conv's `actual_start`: a replicated UINT32 [0] (every chunk reads its
        history: the carry, or zeros at the sequence start), made once per mesh."""
        return self.internal_once(
            ("conv_actual_start",),
            lambda: self.host_rows(
                [np.zeros((1,), np.float32)], self.ttnn.uint32, self.ttnn.ROW_MAJOR_LAYOUT
            ),
        )

    def _conv_native(self, x, w, carry):
        mx, xo = x
        t, ch = mx.rows, mx.cols
        q, k, v = self.conv_parts(xo.t, t, w, carry, (TILE_SIZE, TILE_SIZE, ch - 2 * TILE_SIZE))
        y = self.concat([q, k, v], 2)
        y4 = self.reshape(y, (1, 1, self.shape(y)[1], ch))
        out = self.rows(y4, 0, t)
        new_carry = self.conv_carry(xo.t, t, ch)
        self.drop(*[m for m in (q, k, v, y, y4) if m is not out])
        return self.wrap(out), self.wrap(new_carry)

    def conv_parts(self, xt, t, w, carry, widths, with_carry=False):
        """ttnn's native conv + SiLU over the first sum(widths) columns of xt [1, 1, t, W] (read
        in place: a fused projection needs no slice), split in three parts of `widths`:
        q, k, v [1, tp, width] with tp = t padded to a multiple of 32. with_carry: also the next
        history, ROW_MAJOR bf16 [1, 1, 3, ch], written by the kernel itself
        (`qkv_causal_conv1d_silu_with_carry`, the interval ending at row t; its sequence-parallel
        exchange has no peer on a 1xN mesh's axis 0)."""
        ttnn, taps = self.ttnn, NATIVE_CONV_TAPS
        ch = sum(widths)
        tp = round_up(t, TILE_SIZE)
        hist, made = self._conv_history(carry, ch)
        tap_rows = [
            self.row_of(
                w[1], ("tap", j, taps), ttnn.bfloat16, lambda v, j=j: v.reshape(-1, taps)[:, j]
            )
            for j in range(taps)
        ]
        xp = self.pad_end(xt, 2, tp)
        x3 = self.reshape(xp, (1, tp, self.shape(xp)[3]))
        chunk = next(c for c in (512, 256, 128, 64, 32) if all(p % c == 0 for p in widths))
        config = ttnn.QkvCausalConv1dSiluProgramConfig(channel_chunk_size=chunk)
        kda = ttnn.experimental.kda
        if with_carry:
            buffer, semaphores = self._conv_exchange(ch)
            q, k, v, nxt = self.tt.call(
                "experimental.kda.qkv_causal_conv1d_silu_with_carry",
                kda.qkv_causal_conv1d_silu_with_carry,
                x3,
                hist,
                *tap_rows,
                *widths,
                program_config=config,
                actual_start=self._conv_start(),
                exchange_buffer=buffer,
                exchange_semaphores=semaphores,
                actual_end=self._conv_end(t),
                memory_config=self.dram,
            )
            parts = (q, k, v, self.reshape(nxt, (1, 1, NATIVE_CONV_TAPS - 1, ch)))
        else:
            parts = self.tt.call(
                "experimental.kda.qkv_causal_conv1d_silu",
                kda.qkv_causal_conv1d_silu,
                x3,
                hist,
                *tap_rows,
                *widths,
                program_config=config,
                actual_start=self._conv_start(),
                predecessor_carry=hist,
                memory_config=self.dram,
            )
        self.drop(*[m for m in made + [xp, x3] if m is not xt])
        return parts

    def _conv_exchange(self, ch):
        """The persistent exchange buffer ([1, 12, ch] ROW_MAJOR bf16 zeros) and the three global
        semaphores (on `qkv_causal_conv1d_silu_exchange_core`, zero) the carry-returning conv
        takes, made once per mesh and width."""
        ttnn = self.ttnn
        buffer = self.internal_once(
            ("conv_exchange", ch),
            lambda: self.host_rows(
                [np.zeros((1, 12, ch), np.float32)], ttnn.bfloat16, ttnn.ROW_MAJOR_LAYOUT
            ),
        )
        sems = self.conv_semaphores
        if sems is None:
            kda = ttnn._ttnn.operations.experimental.kda
            core = kda.qkv_causal_conv1d_silu_exchange_core(
                self.device.compute_with_storage_grid_size()
            )
            cores = ttnn.CoreRangeSet({ttnn.CoreRange(core, core)})
            sems = self.conv_semaphores = [
                self.tt.call(
                    "create_global_semaphore", ttnn.create_global_semaphore, self.device, cores, 0
                )
                for _ in range(3)
            ]
        return buffer, sems

    def _conv_end(self, t):
        """The carry-returning conv's `actual_end`: a replicated UINT32 [t] (per row count; in
        a pass, passes.py, the pass's input holding its real rows)."""
        if self.pass_ctx is not None:
            return self.pass_ctx.actual_end
        return self.internal_once(
            ("conv_actual_end", t),
            lambda: self.host_rows(
                [np.full((1,), t, np.float32)], self.ttnn.uint32, self.ttnn.ROW_MAJOR_LAYOUT
            ),
        )

    def conv_carry(self, xt, t, ch):
        """The native conv's next history: the last 3 of `t` rows of xt's first `ch` columns,
        ROW_MAJOR bf16 [1, 1, 3, ch], from the last one or two 32-row tiles (a small untilize of
        <= 64 rows, never of the activation)."""
        ttnn, keep = self.ttnn, NATIVE_CONV_TAPS - 1
        r0 = (t - keep) // TILE_SIZE * TILE_SIZE
        block = self.slice(xt, (0, 0, r0, 0), (1, 1, t, ch))
        block_rm = self.tt.call(
            "to_layout", ttnn.to_layout, block, ttnn.ROW_MAJOR_LAYOUT, memory_config=self.dram
        )
        carry = self.rows(block_rm, t - keep - r0, t - r0)
        self.drop(*[m for m in (block, block_rm) if m is not carry and m is not xt])
        return carry

    def _conv_fir(self, x, w, carry, kernel):
        mx, xo = x
        t, ch, keep = mx.rows, mx.cols, kernel - 1
        call, ttnn, dram = self.tt.call, self.ttnn, self.dram
        act = xo.t.dtype
        prev = self.zeros((1, 1, keep, ch), act) if carry is None else carry[1].t
        if carry is not None and prev.layout != ttnn.TILE_LAYOUT:
            # A carry the native conv left (ROW_MAJOR bf16), read by a chunk it does not take.
            tiled = self.to_tile(prev)
            prev = self.typecast(tiled, act)
            if prev is not tiled:
                self.drop(tiled)
        ext = self.concat([prev, xo.t], 2)
        ext32 = self.typecast(ext, ttnn.float32)
        acc = None
        for j in range(kernel):
            tap = self.row_of(
                w[1], ("tap", j, kernel), ttnn.float32, lambda v, j=j: v.reshape(-1, kernel)[:, j]
            )
            shifted = self.rows(ext32, j, j + t)
            term = call("multiply", ttnn.multiply, shifted, tap, memory_config=dram)
            if shifted is not ext32:
                self.drop(shifted)
            if acc is None:
                acc = term
            else:
                total = call("add", ttnn.add, acc, term, memory_config=dram)
                self.drop(acc, term)
                acc = total
        y = call("silu", ttnn.silu, acc, memory_config=dram)
        out = self.typecast(y, act)
        self.drop(acc, *[v for v in (y, ext32) if v is not out and v is not ext])
        new_carry = self.rows(ext, t, t + keep)
        if new_carry is ext:
            new_carry = call("clone", ttnn.clone, ext, memory_config=dram)
        self.drop(ext)
        if carry is None or prev is not carry[1].t:
            self.drop(prev)
        return self.wrap(out), self.wrap(new_carry)

    def delta_gates(self, a, b, a_log, dt_bias):
        call, ttnn, dram = self.tt.call, self.ttnn, self.dram
        # The gates in f32 from bf16 a and b without a typecast: a binary op against an f32 row
        # (dt_bias; zeros for beta) computes and writes f32 (one device op each).
        fp32 = ttnn.float32
        bias = self.row_of(dt_bias[1], "row_f32", fp32)
        zeros = self.row_of(dt_bias[1], "zeros_f32", fp32, np.zeros_like)
        neg_exp = self.row_of(a_log[1], "neg_exp_f32", fp32, lambda v: -np.exp(v))
        softplus = ttnn.UnaryWithParam(ttnn.UnaryOpType.SOFTPLUS, 1.0, 20.0)
        sp = call(
            "add", ttnn.add, a[1].t, bias, activations=[softplus], dtype=fp32, memory_config=dram
        )
        g = call("multiply", ttnn.multiply, sp, neg_exp, memory_config=dram)
        beta = call(
            "add",
            ttnn.add,
            b[1].t,
            zeros,
            activations=[self.unary("SIGMOID")],
            dtype=fp32,
            memory_config=dram,
        )
        self.drop(sp)
        return self.wrap(g), self.wrap(beta)

    def delta_constants(self):
        """eye, tril, ones [1, 1, 32, 32] and the quadrant masks [1, 1, 32, 96], f32, per mesh."""

        def make():
            c = DELTA_CHUNK
            i, j = np.arange(32)[:, None], np.arange(32)[None, :]
            lo_i, lo_j = i < 16, j < 16
            masks = np.concatenate([(lo_i & lo_j), (~lo_i & ~lo_j), (~lo_i & lo_j)], axis=1)
            arrays = [np.eye(c), np.tril(np.ones((c, c))), np.ones((c, c)), masks]
            return tuple(
                self.host_rows(
                    [a.astype(np.float32).reshape(1, 1, *a.shape)],
                    self.ttnn.float32,
                    self.ttnn.TILE_LAYOUT,
                )
                for a in arrays
            )

        return self.internal_once(("delta_constants",), make)

    def _pad_heads(self, t, rows, heads, d, dp):
        """[1, 1, rows, heads*d] -> [1, 1, rows, heads*dp] with zero channels."""
        if d == dp:
            return t
        v = self.reshape(t, (1, rows, heads, d))
        p = self.pad_end(v, 3, dp)
        out = self.reshape(p, (1, 1, rows, heads * dp))
        self.drop(*[x for x in (v, p) if x is not t and x is not out])
        return out

    def _l2(self, t, d_real, scale):
        """x / sqrt(sum(x^2) + 1e-6) * scale over the last dim (width dp) of t."""
        dp = self.shape(t)[-1]
        n = self.tt.call(
            "rms_norm",
            self.ttnn.rms_norm,
            t,
            epsilon=f32(1e-6 / dp),
            compute_kernel_config=precise(self.ttnn),
            memory_config=self.dram,
        )
        out = self.tt.call(
            "multiply", self.ttnn.multiply, n, f32(scale * dp**-0.5), memory_config=self.dram
        )
        self.drop(n)
        return out

    def chunk_delta_rule(self, q, k, v, g, beta, scale, s):
        """`transformer.chunk_gated_delta_rule` from state s (None: zeros), its output head-major,
        with the f32 final state: (output, final state)."""
        eye, tril, ones, masks = self.delta_constants()
        return self.tt.call(
            "transformer.chunk_gated_delta_rule",
            self.ttnn.transformer.chunk_gated_delta_rule,
            q,
            k,
            v,
            g,
            beta,
            scale=f32(scale),
            initial_state=s,
            output_final_state=True,
            chunk_size=DELTA_CHUNK,
            output_head_major=True,
            eye=eye,
            tril=tril,
            ones=ones,
            masks=masks,
        )

    def gated_delta_rule(self, qkv, g, beta, state, spec):
        mx, xo = qkv
        nk, nv = int(spec["key_heads"]), int(spec["value_heads"])
        dk, dv = int(spec["key_dim"]), int(spec["value_dim"])
        t = mx.rows
        if nk <= 0 or nv % nk or mx.cols != 2 * nk * dk + nv * dv:
            raise ValueError(
                "gated_delta_rule: qkv %dx%d for %d key heads x %d, %d value heads"
                " x %d" % (mx.rows, mx.cols, nk, dk, nv, dv)
            )
        fp32 = self.ttnn.float32
        dkp, dvp = round_up(dk, TILE_SIZE), round_up(dv, TILE_SIZE)
        flat = dkp == dvp
        tp = round_up(t, TILE_SIZE)
        made = []

        def keep(x):
            made.append(x)
            return x

        x = keep(self.pad_end(xo.t, 2, tp))
        kd = nk * dk
        q = keep(self._pad_heads(keep(self.cols(x, 0, kd)), tp, nk, dk, dkp))
        k = keep(self._pad_heads(keep(self.cols(x, kd, 2 * kd)), tp, nk, dk, dkp))
        v = keep(self._pad_heads(keep(self.cols(x, 2 * kd, 2 * kd + nv * dv)), tp, nv, dv, dvp))
        gates = []
        for gt in (g[1].t, beta[1].t):
            g32 = keep(self.typecast(gt, fp32))
            gates.append(keep(self.reshape(keep(self.pad_end(g32, 2, tp)), (1, tp, nv))))
        if flat:
            scale = dk**-0.5
            q = keep(self.reshape(q, (1, tp, nk * dkp)))
            k = keep(self.reshape(k, (1, tp, nk * dkp)))
            v = keep(self.reshape(v, (1, tp, nv * dvp)))
        else:
            scale = 1.0
            q = keep(self._l2(keep(self.reshape(q, (1, tp, nk, dkp))), dk, dk**-0.5))
            k = keep(self._l2(keep(self.reshape(k, (1, tp, nk, dkp))), dk, 1.0))
            v = keep(self.reshape(v, (1, tp, nv, dvp)))
        s = None
        if state is not None:
            s0 = self.typecast(state[1].t, fp32)
            if s0 is not state[1].t:
                keep(s0)
            s = keep(self.reshape(s0, (1, nv, dk, dv)))
            s = keep(self.pad_end(keep(self.pad_end(s, 2, dkp)), 3, dvp))
        outs = []
        for p0 in range(0, tp, DELTA_PIECE):
            p1 = min(tp, p0 + DELTA_PIECE)
            parts = [keep(self.rows3(a, p0, p1)) for a in (q, k, v)]
            gp, bp = [keep(self.rows3(a, p0, p1)) for a in gates]
            o, s_next = self.chunk_delta_rule(*parts, gp, bp, scale, s)
            outs.append(keep(o))
            s = keep(s_next)
        o = keep(self.concat(outs, 1))
        o4 = keep(self.reshape(o, (1, nv, tp, dvp)))
        o4 = keep(self.slice(o4, (0, 0, 0, 0), (1, nv, t, dv)))
        flat_o = self.heads_last(o4)
        out = self.typecast(flat_o, self.act_dtype)
        if out is not flat_o:
            keep(flat_o)
        s_real = self.slice(s, (0, 0, 0, 0), (1, nv, dk, dv))
        s_out = self.reshape(s_real, (1, 1, nv * dk, dv))
        if s_real is not s_out:
            keep(s_real)
        inputs = {id(xo.t), id(g[1].t), id(beta[1].t)}
        if state is not None:
            inputs.add(id(state[1].t))
        seen = set()
        for m in made:
            if id(m) in inputs or id(m) in seen or m is out or m is s_out:
                continue
            seen.add(id(m))
            self.drop(m)
        return self.wrap(out), self.wrap(s_out)

    def rows3(self, t, r0, r1):
        """Rows (dim 1) [r0, r1) of a rank-3 [1, T, X] or rank-4 [1, T, H, D] tensor."""
        s = self.shape(t)
        return self.slice(t, (0, r0) + (0,) * (len(s) - 2), (s[0], r1) + s[2:])

    def gated_rms_norm(self, x, z, w, group, eps):
        mx, xo = x
        if group <= 0 or mx.cols % group:
            raise ValueError("gated_rms_norm: %d columns in groups of %d" % (mx.cols, group))
        gamma = self.gamma(w[1], group, False)
        y = self.norm_groups(xo.t, mx.rows, mx.cols, group, eps, gamma)
        out = self.tt.call(
            "multiply",
            self.ttnn.multiply,
            y,
            z[1].t,
            input_tensor_b_activations=[self.unary("SILU")],
            memory_config=self.dram,
        )
        self.drop(y)
        return self.wrap(out)
