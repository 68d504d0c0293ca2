// The op bodies of the host backend on one device's rows: plain loops in f32, written from the
// op definitions (clef_tt.h, device/src/ops.rs) as PyTorch computes them. They exist to test
// the device boundary, not to be fast.
#pragma once

#include <vector>

#include "backend.hpp"
#include "tiles.hpp"

namespace clef_tt::host::math {

// x [T, K] · w [K, N] with the matrix engine's fidelity and accumulation imitated: activations
// rounded to bf16 (and to 1 + 6 mantissa bits at LoFi / HiFi2), weights to 1 + 4 bits at LoFi,
// the running sum rounded to bf16 after every 32 input channels without fp32_dest_acc.
Rows linear(const Rows& x, const Rows& w, const MatmulConfig& config);
Rows add(const Rows& a, const Rows& b);
Rows rms_norm(const Rows& x, const std::vector<float>& w, uint32_t group, float eps, bool one_plus);
Rows swiglu(const Rows& gate_up);
// Column `half` (0 query, 1 gate) of every head's [query | gate].
Rows pick_half(const Rows& qg, uint32_t heads, uint32_t d, uint32_t half);
Rows rope(const Rows& x, const RopeTables& t, uint32_t head_dim);
Rows causal_attention(const Rows& q, const Rows& k, const Rows& v, uint32_t heads,
                      uint32_t kv_heads, uint32_t d);
Rows mul_sigmoid(const Rows& x, const Rows& gate);
// Returns {out, carry}. `taps` is [channels, kernel] row-major; `carry` [kernel-1, channels].
std::pair<Rows, Rows> causal_conv1d_silu(const Rows& x, const std::vector<float>& taps,
                                         const Rows& carry, uint32_t kernel);
Rows decay_gate(const Rows& a, const std::vector<float>& a_log, const std::vector<float>& dt_bias);
Rows sigmoid_all(const Rows& b);
// Returns {out [T, nv*dv], state [nv*dk, dv]}; the token-by-token recurrence.
std::pair<Rows, Rows> gated_delta_rule(const Rows& qkv, const Rows& g, const Rows& beta,
                                       const Rows& state, const DeltaSpec& spec);
Rows gated_rms_norm(const Rows& x, const Rows& z, const std::vector<float>& w, uint32_t group,
                    float eps);

Rows layer_norm(const Rows& x, const std::vector<float>& w, const std::vector<float>& b, float eps);
Rows add_bias(const Rows& x, const std::vector<float>& b);
Rows gelu(const Rows& x, clef_tt_gelu_kind kind);
Rows rotary(const Rows& x, const Rows& cos, const Rows& sin, uint32_t head_dim);
Rows segment_attention(const Rows& q, const Rows& k, const Rows& v, uint32_t heads, uint32_t d,
                       const std::vector<Segment>& segments);

}  // namespace clef_tt::host::math
