// Rotary tables computed on the host for every backend (rope.cpp).
#pragma once

#include "backend.hpp"

namespace clef_tt {

// cos/sin [rows, rotary_dim/2] of the angles of `positions` ((t, h, w) per row).
RopeTables rope_tables(const clef_tt_rope_spec& spec, const uint32_t* positions, uint32_t rows);

}  // namespace clef_tt
