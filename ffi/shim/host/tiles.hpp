// ttnn's TILE layout on the host, written from Tenstorrent's documentation independently of
// the Rust packer (clef-device::formats), so uploads through the host shim cross-check it:
// 32x32 tiles in row-major tile order, four 16x16 faces per tile (top-left, top-right,
// bottom-left, bottom-right), each face row-major; f32 and bf16 tiles hold the elements in
// that order; bfp8_b / bfp4_b tiles hold 64 shared exponents (one per 16-element face row)
// then the sign|magnitude codes in the same order.
#pragma once

#include <cstdint>
#include <vector>

#include "clef_tt.h"

namespace clef_tt::host {

// A dense row-major f32 matrix: what the host backend's op bodies compute on.
struct Rows {
  uint32_t rows = 0;
  uint32_t cols = 0;
  std::vector<float> v;

  Rows() = default;
  Rows(uint32_t r, uint32_t c) : rows(r), cols(c), v(static_cast<size_t>(r) * c, 0.0f) {}
  float* row(uint32_t r) { return v.data() + static_cast<size_t>(r) * cols; }
  const float* row(uint32_t r) const { return v.data() + static_cast<size_t>(r) * cols; }
};

// Where element (r, c) of a matrix sits: its tile (row-major tile order over `tiles_per_row`
// tiles) and its index in the tile's face order.
struct TilePosition {
  uint64_t tile;
  uint32_t index;  // face * 256 + row-in-face * 16 + column-in-face
};
TilePosition tile_position(uint32_t r, uint32_t c, uint64_t tiles_per_row);

// f32 rows → f32 tiles (zero padding).
std::vector<uint8_t> tilize_f32(const Rows& m);
// Tiles of any dtype → f32 rows of the logical shape (padding dropped).
Rows untilize(const uint8_t* bytes, uint32_t rows, uint32_t cols, clef_tt_dtype dtype);

// bf16 bit patterns: round to nearest even, NaN → 0x7FC0 (ttnn's host conversion).
uint16_t bf16_bits(float v);
float bf16_value(uint16_t bits);
inline float round_bf16(float v) { return bf16_value(bf16_bits(v)); }

}  // namespace clef_tt::host
