// Rotary tables computed on the host for every backend (rope.cpp).
#pragma once

#include "backend.hpp"

namespace clef_tt {

// cos/sin [rows, rotary_dim/2] of the angles of `positions` ((t, h, w) per row).
RopeTables rope_tables(const clef_tt_rope_spec& spec, const uint32_t* positions, uint32_t rows);

// The last tables a mesh computed, reused while the spec's rotary part and the positions are
// the same: every attention layer of a chunk rotates by the same tables (16 of them in Clef
// 27B), and computing them is 2 x rows x rotary_dim/2 transcendentals (~2 ms at 1,024 rows).
// Each recomputation gets a new `generation`, so a backend can keep what it derived from them.
class RopeCache {
 public:
  const RopeTables& get(const clef_tt_rope_spec& spec, const uint32_t* positions, uint32_t rows);

 private:
  bool valid_ = false;
  uint32_t rotary_dim_ = 0;
  uint32_t sections_[3] = {0, 0, 0};
  double theta_ = 0.0;
  std::vector<uint32_t> positions_;
  RopeTables tables_;
  uint64_t generation_ = 0;
};

}  // namespace clef_tt
