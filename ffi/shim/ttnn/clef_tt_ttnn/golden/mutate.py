"""Deliberate convention changes in the op mapping (`CLEF_TT_GOLDEN_MUTATE=NAME`, golden-shadow mode
only): each wraps one ABI op of the mesh so that it calls ttnn with a convention the op does not
have, as a mapping bug would. The golden shadow must then move the answers out of the bf16 band
(tests/tt_golden.rs). The host backend cannot see such a change: it implements our own reading of
each op, not ttnn's.

- gate_sign:  delta_gates hands the delta rule +exp(A_log) * softplus(a + dt_bias) (the sign of
              the log-space decay flipped: g >= 0, a growing state) — ttnn.neg on the g it made.
- raw_gamma:  rms_norm uses the raw weight w where the zero-centred norm needs 1 + w (and
              1 + w where the raw weight is meant).
"""
import types


def _gate_sign(mesh):
    plain = mesh.delta_gates

    def delta_gates(self, a, b, a_log, dt_bias):
        g, beta = plain(a, b, a_log, dt_bias)
        flipped = self.tt.call("neg", self.ttnn.neg, g.t, memory_config=self.dram)
        return self.wrap(flipped), beta

    mesh.delta_gates = types.MethodType(delta_gates, mesh)


def _raw_gamma(mesh):
    plain = mesh.gamma

    def gamma(self, w, group, one_plus):
        return plain(w, group, not one_plus)

    mesh.gamma = types.MethodType(gamma, mesh)


MUTATIONS = {"gate_sign": _gate_sign, "raw_gamma": _raw_gamma}


def apply(mesh, name):
    if name not in MUTATIONS:
        raise ValueError("CLEF_TT_GOLDEN_MUTATE=%s: one of %s" % (name, ", ".join(MUTATIONS)))
    MUTATIONS[name](mesh)
