// Rotary tables computed on the host for every backend (rope.cpp).
#pragma once

#include "backend.hpp"

namespace clef_tt {

// The cos/sin [rows, rotary_dim/2] of the angles of `positions` ((t, h, w) per row), computed in
// f32 as PyTorch and the CPU mesh compute them. The last tables a mesh computed are reused while
// the spec's rotary part and the positions are the same: every attention layer of a chunk rotates
// by the same tables (16 of them in Clef 27B), and computing them is 2 x rows x rotary_dim/2
// transcendentals (~2 ms at 1,024 rows). Each recomputation gets a new `generation`, so a backend
// can keep what it derived from them. A text row (its three axes at one position) is computed
// once per position and copied after (`TEXT_ROWS` positions at most): a whole pass, one call per
// chunk, meets new positions on every call, and each row comes out exactly as computed.
class RopeCache {
 public:
  const RopeTables& get(const clef_tt_rope_spec& spec, const uint32_t* positions, uint32_t rows);

  static constexpr uint32_t TEXT_ROWS = 1u << 16;

 private:
  RopeTables compute(const clef_tt_rope_spec& spec, const uint32_t* positions, uint32_t rows);

  bool valid_ = false;
  uint32_t rotary_dim_ = 0;
  uint32_t sections_[3] = {0, 0, 0};
  double theta_ = 0.0;
  std::vector<uint32_t> positions_;
  RopeTables tables_;
  uint64_t generation_ = 0;
  // cos / sin rows of text positions 0.. for the spec of the last tables.
  std::vector<float> text_cos_, text_sin_;
};

}  // namespace clef_tt
