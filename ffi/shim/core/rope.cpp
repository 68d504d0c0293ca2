// Host-side rotary tables of a chunk: the cos/sin of every row's interleaved M-RoPE angles,
// computed in f32 as PyTorch (and clef-device's CPU mesh) compute them, so every backend
// rotates by the same numbers (the ttnn backend uploads them; Tenstorrent's documentation).
#include "rope.hpp"

#include <cmath>
#include <cstring>

namespace clef_tt {

RopeTables rope_tables(const clef_tt_rope_spec& spec, const uint32_t* positions, uint32_t rows) {
  RopeTables t;
  t.rows = rows;
  t.half = spec.rotary_dim / 2;
  std::vector<float> inv(t.half);
  std::vector<uint32_t> axis(t.half);
  for (uint32_t j = 0; j < t.half; ++j) {
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
  t.cos.resize(static_cast<size_t>(rows) * t.half);
  t.sin.resize(static_cast<size_t>(rows) * t.half);
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t j = 0; j < t.half; ++j) {
      float angle = static_cast<float>(positions[3 * r + axis[j]]) * inv[j];
      t.cos[static_cast<size_t>(r) * t.half + j] = std::cos(angle);
      t.sin[static_cast<size_t>(r) * t.half + j] = std::sin(angle);
    }
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
    tables_ = rope_tables(spec, positions, rows);
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
