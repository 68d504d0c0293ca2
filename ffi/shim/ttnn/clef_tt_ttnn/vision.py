"""The vision tower's ops (a mesh mixin): layer_norm, add_bias, gelu, rotary, fold_rows.
(segment_attention is in attention.py.)

- layer_norm: `ttnn.layer_norm` over each row with gamma and beta as [1, 1, 1, cols] f32 TILE rows
  (made once per weight), epsilon as given, HiFi4 / fp32 accumulation.
- add_bias: `ttnn.add` of a [1, 1, 1, cols] row in the activation dtype (broadcast over rows).
- gelu: `ttnn.gelu` with GeluVariant.Accurate (erf) or GeluVariant.Tanh (the tanh formula in fp32).
- rotary: x * cos + rotate_half(x) * sin per head with cos/sin [rows, head_dim] activations:
  `experimental.rotary_embedding_hf` on heads-first x when head_dim is 32 or a multiple of 64
  (what that op takes), otherwise token-major with cos/sin viewed as [1, rows, 1, head_dim]
  broadcast over the heads and rotate_half = concat(-x2, x1).
- fold_rows: a reshape [rows, cols] -> [rows/group, cols*group] (row-major order is the ABI's).
"""

from .meta import GELU_TANH, f32
from .programs import precise


class VisionOps:
    """Vision ops (mesh mixin)."""

    def layer_norm(self, x, w, b, eps):
        mx, xo = x
        gamma = self.row_of(w[1], "ln_row", self.ttnn.float32)
        beta = self.row_of(b[1], "ln_row", self.ttnn.float32)
        y = self.tt.call(
            "layer_norm",
            self.ttnn.layer_norm,
            xo.t,
            epsilon=f32(eps),
            weight=gamma,
            bias=beta,
            compute_kernel_config=precise(self.ttnn),
            memory_config=self.dram,
        )
        return self.wrap(y)

    def add_bias(self, x, b):
        mx, xo = x
        row = self.row_of(b[1], ("bias", str(xo.t.dtype)), xo.t.dtype)
        return self.wrap(self.tt.call("add", self.ttnn.add, xo.t, row, memory_config=self.dram))

    def gelu(self, x, kind):
        ttnn = self.ttnn
        variant = ttnn.GeluVariant.Tanh if int(kind) == GELU_TANH else ttnn.GeluVariant.Accurate
        return self.wrap(
            self.tt.call("gelu", ttnn.gelu, x[1].t, variant=variant, memory_config=self.dram)
        )

    def rotary(self, x, cos, sin, heads, head_dim):
        mx, xo = x
        rows, d = mx.rows, head_dim
        if heads * d != mx.cols or d % 2:
            raise ValueError("rotary: %dx%d for %d heads x %d" % (mx.rows, mx.cols, heads, d))
        half = d // 2
        call, ttnn, dram = self.tt.call, self.ttnn, self.dram
        if d == 32 or d % 64 == 0:
            # The fused HF rotate-half on heads-first x; cos/sin are already [1, 1, rows, d].
            xh = self.heads_first(xo.t, heads, d)
            roped = call(
                "experimental.rotary_embedding_hf",
                ttnn.experimental.rotary_embedding_hf,
                xh,
                cos[1].t,
                sin[1].t,
                is_decode_mode=False,
                memory_config=dram,
            )
            out = self.heads_last(roped)
            self.drop(*[t for t in (xh, roped) if t is not out and t is not xo.t])
            return self.wrap(out)
        xs = self.reshape(xo.t, (1, rows, heads, d))
        c = self.reshape(cos[1].t, (1, rows, 1, d))
        s = self.reshape(sin[1].t, (1, rows, 1, d))
        x1 = self.cols(xs, 0, half)
        x2 = self.cols(xs, half, d)
        neg = call("neg", ttnn.neg, x2, memory_config=dram)
        rot = self.concat([neg, x1], 3)
        xc = call("multiply", ttnn.multiply, xs, c, memory_config=dram)
        rs = call("multiply", ttnn.multiply, rot, s, memory_config=dram)
        y = call("add", ttnn.add, xc, rs, memory_config=dram)
        out = self.reshape(y, (1, 1, rows, mx.cols))
        self.drop(x1, x2, neg, rot, xc, rs)
        for tmp, src in ((c, cos[1].t), (s, sin[1].t), (xs, xo.t), (y, out)):
            if tmp is not src:
                self.drop(tmp)
        return self.wrap(out)

    def fold_rows(self, x, group):
        mx, xo = x
        if group <= 0 or mx.rows % group:
            raise ValueError("fold_rows: %d rows in groups of %d" % (mx.rows, group))
        out = self.reshape(xo.t, (1, 1, mx.rows // group, mx.cols * group))
        if out is xo.t:
            out = self.tt.call("clone", self.ttnn.clone, out, memory_config=self.dram)
        return self.wrap(out)
