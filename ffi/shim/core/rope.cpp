// Host-side rotary tables of a chunk: the cos/sin of every row's interleaved M-RoPE angles,
// computed in f32 as PyTorch (and clef-device's CPU mesh) compute them, so every backend
// rotates by the same numbers (the ttnn backend uploads them; Tenstorrent's documentation).
#include "rope.hpp"

#include <cmath>
#include <cstring>

namespace clef_tt {

namespace {

// The inverse frequency and the M-RoPE axis of each rotary pair.
void frequencies(const clef_tt_rope_spec& spec, std::vector<float>& inv,
                 std::vector<uint32_t>& axis) {
  uint32_t half = spec.rotary_dim / 2;
  inv.resize(half);
  axis.resize(half);
  for (uint32_t j = 0; j < half; ++j) {
    float exponent = static_cast<float>(2 * j) / static_cast<float>(spec.rotary_dim);
    inv[j] = 1.0f / std::pow(static_cast<float>(spec.theta), exponent);
    if (j % 3 == 1 && j < 3 * spec.mrope_section[1]) {
      axis[j] = 1;
    } else if (j % 3 == 2 && j < 3 * spec.mrope_section[2]) {
      axis[j] = 2;
    } else {
      axis[j] = 0;
    }
  }
}

// Row `r` of the tables: the cos / sin of the angles of row `r` of `positions`.
void row(const std::vector<float>& inv, const std::vector<uint32_t>& axis,
         const uint32_t* positions, uint32_t r, float* cos, float* sin) {
  for (size_t j = 0; j < inv.size(); ++j) {
    float angle = static_cast<float>(positions[3 * r + axis[j]]) * inv[j];
    cos[j] = std::cos(angle);
    sin[j] = std::sin(angle);
  }
}

}  // namespace

RopeTables RopeCache::compute(const clef_tt_rope_spec& spec, const uint32_t* positions,
                              uint32_t rows) {
  RopeTables t;
  t.rows = rows;
  t.half = spec.rotary_dim / 2;
  std::vector<float> inv;
  std::vector<uint32_t> axis;
  frequencies(spec, inv, axis);
  t.cos.resize(static_cast<size_t>(rows) * t.half);
  t.sin.resize(static_cast<size_t>(rows) * t.half);
  for (uint32_t r = 0; r < rows; ++r) {
    size_t at = static_cast<size_t>(r) * t.half;
    uint32_t p = positions[3 * r];
    bool text = positions[3 * r + 1] == p && positions[3 * r + 2] == p && p < TEXT_ROWS;
    if (!text || t.half == 0) {
      row(inv, axis, positions, r, t.cos.data() + at, t.sin.data() + at);
      continue;
    }
    size_t known = text_cos_.size() / t.half;
    if (p >= known) {
      text_cos_.resize(static_cast<size_t>(p + 1) * t.half);
      text_sin_.resize(static_cast<size_t>(p + 1) * t.half);
      for (uint32_t q = static_cast<uint32_t>(known); q <= p; ++q) {
        uint32_t at_q[3] = {q, q, q};
        size_t to = static_cast<size_t>(q) * t.half;
        row(inv, axis, at_q, 0, text_cos_.data() + to, text_sin_.data() + to);
      }
    }
    size_t from = static_cast<size_t>(p) * t.half;
    std::memcpy(t.cos.data() + at, text_cos_.data() + from, t.half * sizeof(float));
    std::memcpy(t.sin.data() + at, text_sin_.data() + from, t.half * sizeof(float));
  }
  return t;
}

const RopeTables& RopeCache::get(const clef_tt_rope_spec& spec, const uint32_t* positions,
                                 uint32_t rows) {
  size_t n = static_cast<size_t>(rows) * 3;
  bool same = valid_ && rotary_dim_ == spec.rotary_dim && theta_ == spec.theta &&
              std::memcmp(sections_, spec.mrope_section, sizeof(sections_)) == 0 &&
              positions_.size() == n &&
              (n == 0 || std::memcmp(positions_.data(), positions, n * sizeof(uint32_t)) == 0);
  if (!same) {
    bool same_spec = valid_ && rotary_dim_ == spec.rotary_dim && theta_ == spec.theta &&
                     std::memcmp(sections_, spec.mrope_section, sizeof(sections_)) == 0;
    if (!same_spec) {
      text_cos_.clear();
      text_sin_.clear();
    }
    tables_ = compute(spec, positions, rows);
    tables_.generation = ++generation_;
    rotary_dim_ = spec.rotary_dim;
    theta_ = spec.theta;
    std::memcpy(sections_, spec.mrope_section, sizeof(sections_));
    positions_.assign(positions, positions + n);
    valid_ = true;
  }
  return tables_;
}

}  // namespace clef_tt
