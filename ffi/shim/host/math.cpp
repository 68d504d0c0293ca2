// The host backend's op bodies (see math.hpp).
#include "math.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace clef_tt::host::math {

namespace {

// Subnormals flushed to zero while alive (strong DeltaNet decays and masked softmax tails
// otherwise run many times slower); the device flushes them too.
class FlushDenormals {
 public:
  FlushDenormals() {
#if defined(__SSE__) || defined(__x86_64__)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | 0x8040);
#endif
  }
  ~FlushDenormals() {
#if defined(__SSE__) || defined(__x86_64__)
    _mm_setcsr(saved_);
#endif
  }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_ = 0;
};

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

float masked(float v, uint32_t mask) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits &= mask;
  std::memcpy(&v, &bits, 4);
  return v;
}

// Keys [first, last) of the head at column `col`, transposed to [d][last - first], so a
// query's scores over consecutive keys are independent sums the compiler vectorises (each
// still added up in channel order).
std::vector<float> transposed_keys(const Rows& k, uint32_t col, uint32_t d, uint32_t first,
                                   uint32_t last) {
  const uint32_t n = last - first;
  std::vector<float> kt(static_cast<size_t>(d) * n);
  for (uint32_t j = 0; j < n; ++j) {
    const float* kr = k.row(first + j) + col;
    for (uint32_t c = 0; c < d; ++c) kt[static_cast<size_t>(c) * n + j] = kr[c];
  }
  return kt;
}

// out[0..d) = Σ_j p[j] · v[first + j][vcol..], summed over j in order. Whole groups of
// kGroup channels are summed in a local array the compiler keeps in registers (summing into
// `out` itself made every step wait on the previous step's store).
void weighted_values(const float* p, uint32_t visible, const Rows& v, uint32_t vcol, uint32_t first,
                     uint32_t d, float* out) {
  constexpr uint32_t kGroup = 32;
  uint32_t c0 = 0;
  for (; c0 + kGroup <= d; c0 += kGroup) {
    float acc[kGroup] = {};
    for (uint32_t j = 0; j < visible; ++j) {
      const float* vr = v.row(first + j) + vcol + c0;
      for (uint32_t c = 0; c < kGroup; ++c) acc[c] += p[j] * vr[c];
    }
    std::copy(acc, acc + kGroup, out + c0);
  }
  std::fill(out + c0, out + d, 0.0f);
  for (uint32_t j = 0; j < visible; ++j) {
    const float* vr = v.row(first + j) + vcol;
    for (uint32_t c = c0; c < d; ++c) out[c] += p[j] * vr[c];
  }
}

// A query row, how many keys it sees and where its output goes.
struct QueryRow {
  const float* q;
  uint32_t visible;
  float* out;
};

// Query rows scored in one pass over the transposed keys.
constexpr uint32_t kRowBlock = 4;

// softmax(q · kᵀ · d^-0.5) · v for up to kRowBlock query rows, each against the first
// `visible` of the `n` transposed keys `kt`, whose values are rows `first..` of `v` at column
// `vcol`. The rows share each load of `kt` (a long context's keys were streamed from memory
// once per row); every score is still added up in channel order, so a row gets the bits it
// would get alone. `scores` is scratch.
void attend_rows(const QueryRow* rows, uint32_t count, const std::vector<float>& kt, uint32_t n,
                 const Rows& v, uint32_t vcol, uint32_t first, uint32_t d,
                 std::vector<float>& scores) {
  const float scale = std::pow(static_cast<float>(d), -0.5f);
  uint32_t widest = 0;
  for (uint32_t r = 0; r < count; ++r) widest = std::max(widest, rows[r].visible);
  scores.assign(static_cast<size_t>(kRowBlock) * widest, 0.0f);
  float* __restrict s0 = scores.data();
  float* __restrict s1 = s0 + widest;
  float* __restrict s2 = s1 + widest;
  float* __restrict s3 = s2 + widest;
  for (uint32_t c = 0; c < d; ++c) {
    float qc[kRowBlock] = {};
    for (uint32_t r = 0; r < count; ++r) qc[r] = rows[r].q[c];
    const float* __restrict kc = kt.data() + static_cast<size_t>(c) * n;
    for (uint32_t j = 0; j < widest; ++j) {
      const float key = kc[j];
      s0[j] += qc[0] * key;
      s1[j] += qc[1] * key;
      s2[j] += qc[2] * key;
      s3[j] += qc[3] * key;
    }
  }
  for (uint32_t r = 0; r < count; ++r) {
    float* row = scores.data() + static_cast<size_t>(r) * widest;
    const uint32_t visible = rows[r].visible;
    float max = -std::numeric_limits<float>::infinity();
    for (uint32_t j = 0; j < visible; ++j) {
      row[j] *= scale;
      max = std::max(max, row[j]);
    }
    float sum = 0.0f;
    for (uint32_t j = 0; j < visible; ++j) {
      row[j] = std::exp(row[j] - max);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (uint32_t j = 0; j < visible; ++j) row[j] *= inv;
    weighted_values(row, visible, v, vcol, first, d, rows[r].out);
  }
}

// Query rows `begin..end` of head column `qcol` in blocks of kRowBlock; row `i` sees
// `visible(i)` keys.
template <typename Visible>
void attend_all(const Rows& q, uint32_t qcol, uint32_t begin, uint32_t end, Visible visible,
                const std::vector<float>& kt, uint32_t n, const Rows& v, uint32_t vcol,
                uint32_t first, uint32_t d, std::vector<float>& scores, Rows& out) {
  for (uint32_t i0 = begin; i0 < end; i0 += kRowBlock) {
    QueryRow rows[kRowBlock];
    const uint32_t count = std::min(kRowBlock, end - i0);
    for (uint32_t r = 0; r < count; ++r) {
      rows[r] = {q.row(i0 + r) + qcol, visible(i0 + r), out.row(i0 + r) + qcol};
    }
    attend_rows(rows, count, kt, n, v, vcol, first, d, scores);
  }
}

}  // namespace

Rows linear(const Rows& x, const Rows& w, const MatmulConfig& config) {
  const bool imitate = config.fidelity != CLEF_TT_EXACT;
  const bool bf16_in = config.bf16_activations != 0 || imitate;
  // Mantissa bits the multipliers see (Tenstorrent's documentation): srcB (activations) 1 + 6 at
  // LoFi and HiFi2, all from HiFi3; srcA (weights) 1 + 4 at LoFi, all from HiFi2.
  const uint32_t six_bits = 0xFFFE0000u, four_bits = 0xFFF80000u, all = 0xFFFFFFFFu;
  const uint32_t act_mask =
      (config.fidelity == CLEF_TT_LOFI || config.fidelity == CLEF_TT_HIFI2) ? six_bits : all;
  const uint32_t weight_mask = config.fidelity == CLEF_TT_LOFI ? four_bits : all;
  const uint32_t k_dim = x.cols, n = w.cols;
  Rows wm = w;
  if (weight_mask != all) {
    for (float& v : wm.v) v = masked(v, weight_mask);
  }
  Rows y(x.rows, n);
  std::vector<float> xr(k_dim);
  const uint32_t step = config.fp32_dest_acc ? k_dim : 32;
  for (uint32_t t = 0; t < x.rows; ++t) {
    const float* src = x.row(t);
    for (uint32_t kk = 0; kk < k_dim; ++kk) {
      float v = bf16_in ? round_bf16(src[kk]) : src[kk];
      xr[kk] = masked(v, act_mask);
    }
    float* out = y.row(t);
    for (uint32_t k0 = 0; k0 < k_dim; k0 += step) {
      const uint32_t k1 = std::min(k_dim, k0 + step);
      for (uint32_t kk = k0; kk < k1; ++kk) {
        const float a = xr[kk];
        const float* wr = wm.row(kk);
        for (uint32_t j = 0; j < n; ++j) out[j] += a * wr[j];
      }
      if (!config.fp32_dest_acc) {
        for (uint32_t j = 0; j < n; ++j) out[j] = round_bf16(out[j]);
      }
    }
  }
  return y;
}

Rows add(const Rows& a, const Rows& b) {
  Rows out = a;
  for (size_t i = 0; i < out.v.size(); ++i) out.v[i] += b.v[i];
  return out;
}

Rows rms_norm(const Rows& x, const std::vector<float>& w, uint32_t group, float eps,
              bool one_plus) {
  std::vector<float> scale(w);
  if (one_plus) {
    for (float& s : scale) s += 1.0f;
  }
  Rows out = x;
  for (size_t g0 = 0; g0 < out.v.size(); g0 += group) {
    float* g = out.v.data() + g0;
    float ms = 0.0f;
    for (uint32_t i = 0; i < group; ++i) ms += g[i] * g[i];
    ms /= static_cast<float>(group);
    const float inv = 1.0f / std::sqrt(ms + eps);
    for (uint32_t i = 0; i < group; ++i) g[i] = g[i] * inv * scale[i];
  }
  return out;
}

Rows swiglu(const Rows& gate_up) {
  const uint32_t half = gate_up.cols / 2;
  Rows out(gate_up.rows, half);
  for (uint32_t r = 0; r < gate_up.rows; ++r) {
    const float* row = gate_up.row(r);
    float* o = out.row(r);
    for (uint32_t j = 0; j < half; ++j) o[j] = silu(row[j]) * row[half + j];
  }
  return out;
}

Rows pick_half(const Rows& qg, uint32_t heads, uint32_t d, uint32_t half) {
  Rows out(qg.rows, heads * d);
  for (uint32_t r = 0; r < qg.rows; ++r) {
    for (uint32_t h = 0; h < heads; ++h) {
      const float* src = qg.row(r) + h * 2 * d + half * d;
      std::copy(src, src + d, out.row(r) + h * d);
    }
  }
  return out;
}

Rows rope(const Rows& x, const RopeTables& t, uint32_t head_dim) {
  Rows out = x;
  const uint32_t half = t.half;
  for (uint32_t r = 0; r < out.rows; ++r) {
    const float* c = t.cos.data() + static_cast<size_t>(r) * half;
    const float* s = t.sin.data() + static_cast<size_t>(r) * half;
    for (uint32_t h0 = 0; h0 < out.cols; h0 += head_dim) {
      float* head = out.row(r) + h0;
      for (uint32_t j = 0; j < half; ++j) {
        const float a = head[j], b = head[j + half];
        head[j] = a * c[j] - b * s[j];
        head[j + half] = b * c[j] + a * s[j];
      }
    }
  }
  return out;
}

Rows causal_attention(const Rows& q, const Rows& k, const Rows& v, uint32_t heads,
                      uint32_t kv_heads, uint32_t d) {
  FlushDenormals ftz;
  const uint32_t t = q.rows, start = k.rows - q.rows, group = heads / kv_heads;
  Rows out(t, heads * d);
  std::vector<float> scores;
  for (uint32_t kvh = 0; kvh < kv_heads; ++kvh) {
    const uint32_t kv_col = kvh * d, n = k.rows;
    const std::vector<float> kt = transposed_keys(k, kv_col, d, 0, n);
    for (uint32_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      attend_all(
          q, h * d, 0, t, [start](uint32_t i) { return start + i + 1; }, kt, n, v, kv_col, 0, d,
          scores, out);
    }
  }
  return out;
}

Rows mul_sigmoid(const Rows& x, const Rows& gate) {
  Rows out = x;
  for (size_t i = 0; i < out.v.size(); ++i) out.v[i] = x.v[i] * sigmoid(gate.v[i]);
  return out;
}

std::pair<Rows, Rows> causal_conv1d_silu(const Rows& x, const std::vector<float>& taps,
                                         const Rows& carry, uint32_t kernel) {
  const uint32_t ch = x.cols, keep = kernel - 1, t = x.rows;
  // Row `i` of the input extended in time by the carried rows.
  auto ext = [&](uint32_t i) -> const float* { return i < keep ? carry.row(i) : x.row(i - keep); };
  Rows out(t, ch);
  for (uint32_t r = 0; r < t; ++r) {
    float* o = out.row(r);
    for (uint32_t j = 0; j < kernel; ++j) {
      const float* src = ext(r + j);
      for (uint32_t c = 0; c < ch; ++c) o[c] += taps[static_cast<size_t>(c) * kernel + j] * src[c];
    }
    for (uint32_t c = 0; c < ch; ++c) o[c] = silu(o[c]);
  }
  Rows next(keep, ch);
  for (uint32_t i = 0; i < keep; ++i) {
    const float* src = ext(t + i);
    std::copy(src, src + ch, next.row(i));
  }
  return {std::move(out), std::move(next)};
}

Rows decay_gate(const Rows& a, const std::vector<float>& a_log, const std::vector<float>& dt_bias) {
  Rows g = a;
  for (uint32_t r = 0; r < g.rows; ++r) {
    float* row = g.row(r);
    for (uint32_t h = 0; h < g.cols; ++h) {
      row[h] = -std::exp(a_log[h]) * softplus(row[h] + dt_bias[h]);
    }
  }
  return g;
}

Rows sigmoid_all(const Rows& b) {
  Rows out = b;
  for (float& v : out.v) v = sigmoid(v);
  return out;
}

std::pair<Rows, Rows> gated_delta_rule(const Rows& qkv, const Rows& g, const Rows& beta,
                                       const Rows& state, const DeltaSpec& spec) {
  FlushDenormals ftz;
  const uint32_t nk = spec.key_heads, nv = spec.value_heads, dk = spec.key_dim, dv = spec.value_dim,
                 t = qkv.rows, ratio = nv / nk;
  const float q_scale = std::pow(static_cast<float>(dk), -0.5f);
  // q and k of every key head, L2-normalised (q scaled), [head][t][dk].
  auto normalised = [&](uint32_t offset, float scale) {
    std::vector<float> m(static_cast<size_t>(nk) * t * dk);
    for (uint32_t h = 0; h < nk; ++h) {
      for (uint32_t r = 0; r < t; ++r) {
        const float* x = qkv.row(r) + offset + h * dk;
        float ss = 0.0f;
        for (uint32_t i = 0; i < dk; ++i) ss += x[i] * x[i];
        const float inv = 1.0f / std::sqrt(ss + 1e-6f);
        float* dst = m.data() + (static_cast<size_t>(h) * t + r) * dk;
        for (uint32_t i = 0; i < dk; ++i) dst[i] = x[i] * inv * scale;
      }
    }
    return m;
  };
  const std::vector<float> qs = normalised(0, q_scale);
  const std::vector<float> ks = normalised(nk * dk, 1.0f);
  const uint32_t v_off = 2 * nk * dk;
  Rows out(t, nv * dv);
  Rows next = state;
  std::vector<float> u(dv);
  for (uint32_t h = 0; h < nv; ++h) {
    const uint32_t kh = h / ratio;
    float* s = next.row(h * dk);  // [dk, dv]
    for (uint32_t r = 0; r < t; ++r) {
      const float decay = std::exp(g.row(r)[h]);
      for (size_t i = 0; i < static_cast<size_t>(dk) * dv; ++i) s[i] *= decay;
      const float* kt = ks.data() + (static_cast<size_t>(kh) * t + r) * dk;
      const float* vt = qkv.row(r) + v_off + h * dv;
      std::copy(vt, vt + dv, u.begin());
      for (uint32_t i = 0; i < dk; ++i) {
        for (uint32_t j = 0; j < dv; ++j) u[j] -= kt[i] * s[i * dv + j];
      }
      const float b = beta.row(r)[h];
      for (float& x : u) x *= b;
      for (uint32_t i = 0; i < dk; ++i) {
        for (uint32_t j = 0; j < dv; ++j) s[i * dv + j] += kt[i] * u[j];
      }
      const float* qt = qs.data() + (static_cast<size_t>(kh) * t + r) * dk;
      float* o = out.row(r) + h * dv;
      for (uint32_t i = 0; i < dk; ++i) {
        for (uint32_t j = 0; j < dv; ++j) o[j] += qt[i] * s[i * dv + j];
      }
    }
  }
  return {std::move(out), std::move(next)};
}

Rows gated_rms_norm(const Rows& x, const Rows& z, const std::vector<float>& w, uint32_t group,
                    float eps) {
  Rows out = x;
  for (size_t g0 = 0; g0 < out.v.size(); g0 += group) {
    float* g = out.v.data() + g0;
    const float* zg = z.v.data() + g0;
    float ms = 0.0f;
    for (uint32_t i = 0; i < group; ++i) ms += g[i] * g[i];
    ms /= static_cast<float>(group);
    const float inv = 1.0f / std::sqrt(ms + eps);
    for (uint32_t i = 0; i < group; ++i) g[i] = w[i] * (g[i] * inv) * silu(zg[i]);
  }
  return out;
}

Rows layer_norm(const Rows& x, const std::vector<float>& w, const std::vector<float>& b,
                float eps) {
  Rows out = x;
  const uint32_t n = x.cols;
  for (uint32_t r = 0; r < out.rows; ++r) {
    float* row = out.row(r);
    float mean = 0.0f;
    for (uint32_t i = 0; i < n; ++i) mean += row[i];
    mean /= static_cast<float>(n);
    float var = 0.0f;
    for (uint32_t i = 0; i < n; ++i) var += (row[i] - mean) * (row[i] - mean);
    var /= static_cast<float>(n);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (uint32_t i = 0; i < n; ++i) row[i] = (row[i] - mean) * inv * w[i] + b[i];
  }
  return out;
}

Rows add_bias(const Rows& x, const std::vector<float>& b) {
  Rows out = x;
  for (uint32_t r = 0; r < out.rows; ++r) {
    float* row = out.row(r);
    for (uint32_t i = 0; i < out.cols; ++i) row[i] += b[i];
  }
  return out;
}

Rows gelu(const Rows& x, clef_tt_gelu_kind kind) {
  Rows out = x;
  const float c = std::sqrt(2.0f / static_cast<float>(M_PI));
  for (float& v : out.v) {
    if (kind == CLEF_TT_GELU_TANH) {
      // x/2 · (1 + tanh(u)) written as x · sigmoid(2u).
      v = v / (1.0f + std::exp(-2.0f * c * (v + 0.044715f * v * v * v)));
    } else {
      v = static_cast<float>(0.5 * v * (1.0 + std::erf(static_cast<double>(v) / M_SQRT2)));
    }
  }
  return out;
}

Rows rotary(const Rows& x, const Rows& cos, const Rows& sin, uint32_t head_dim) {
  Rows out = x;
  const uint32_t half = head_dim / 2;
  for (uint32_t r = 0; r < out.rows; ++r) {
    const float* c = cos.row(r);
    const float* s = sin.row(r);
    for (uint32_t h0 = 0; h0 < out.cols; h0 += head_dim) {
      float* head = out.row(r) + h0;
      for (uint32_t j = 0; j < half; ++j) {
        const float a = head[j], b = head[j + half];
        head[j] = a * c[j] - b * s[j];
        head[j + half] = b * c[j + half] + a * s[j + half];
      }
    }
  }
  return out;
}

Rows segment_attention(const Rows& q, const Rows& k, const Rows& v, uint32_t heads, uint32_t d,
                       const std::vector<Segment>& segments) {
  FlushDenormals ftz;
  Rows out(q.rows, heads * d);
  std::vector<float> scores;
  for (uint32_t h = 0; h < heads; ++h) {
    for (const Segment& seg : segments) {
      const uint32_t n = seg.end - seg.start;
      const std::vector<float> kt = transposed_keys(k, h * d, d, seg.start, seg.end);
      attend_all(
          q, h * d, seg.start, seg.end, [n](uint32_t) { return n; }, kt, n, v, h * d, seg.start, d,
          scores, out);
    }
  }
  return out;
}

}  // namespace clef_tt::host::math
