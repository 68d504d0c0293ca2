// The TILE layout and the tile dtypes of the host backend (see tiles.hpp).
#include "tiles.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/tile_format.hpp"

namespace clef_tt::host {

namespace {

uint32_t load_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

float f32_of_bits(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// Value of one block-float code: sign bit above W magnitude bits (no hidden bit), scaled by
// the block's shared exponent: ±m · 2^(exp − 127 − (W − 1)). A block whose exponent is 255
// held an Inf or NaN: the lone top bit reads as ±Inf, any other magnitude as NaN.
float block_value(uint8_t exp, uint8_t code, int w) {
  uint32_t m = code & ((1u << w) - 1);
  bool negative = (code >> w) & 1;
  float magnitude;
  if (exp == 255 && m != 0) {
    magnitude = m == (1u << (w - 1)) ? std::numeric_limits<float>::infinity()
                                     : std::numeric_limits<float>::quiet_NaN();
  } else {
    magnitude = std::ldexp(static_cast<float>(m), static_cast<int>(exp) - 127 - (w - 1));
  }
  return negative ? -magnitude : magnitude;
}

// The `index`-th element (face order) of one tile.
float tile_element(const uint8_t* tile, uint32_t index, clef_tt_dtype dtype) {
  switch (dtype) {
    case CLEF_TT_F32:
      return f32_of_bits(load_u32(tile + 4 * index));
    case CLEF_TT_BF16:
      return bf16_value(static_cast<uint16_t>(tile[2 * index] | tile[2 * index + 1] << 8));
    case CLEF_TT_BFP8_B:
      return block_value(tile[index / 16], tile[64 + index], 7);
    case CLEF_TT_BFP4_B: {
      uint8_t byte = tile[64 + index / 2];
      uint8_t code = index % 2 == 0 ? (byte & 0x0F) : (byte >> 4);
      return block_value(tile[index / 16], code, 3);
    }
  }
  return 0.0f;
}

}  // namespace

TilePosition tile_position(uint32_t r, uint32_t c, uint64_t tiles_per_row) {
  uint32_t tr = r / kTile, tc = c / kTile;
  uint32_t ir = r % kTile, ic = c % kTile;
  uint32_t face = (ir / kFace) * 2 + ic / kFace;
  return TilePosition{static_cast<uint64_t>(tr) * tiles_per_row + tc,
                      face * kFace * kFace + (ir % kFace) * kFace + ic % kFace};
}

std::vector<uint8_t> tilize_f32(const Rows& m) {
  uint64_t per_row = tiles_for(m.cols);
  std::vector<uint8_t> out(packed_bytes(m.rows, m.cols, CLEF_TT_F32), 0);
  const uint64_t tile = tile_bytes(CLEF_TT_F32);
  for (uint32_t r = 0; r < m.rows; ++r) {
    const float* row = m.row(r);
    for (uint32_t c = 0; c < m.cols; ++c) {
      TilePosition p = tile_position(r, c, per_row);
      std::memcpy(out.data() + p.tile * tile + 4 * p.index, &row[c], 4);
    }
  }
  return out;
}

Rows untilize(const uint8_t* bytes, uint32_t rows, uint32_t cols, clef_tt_dtype dtype) {
  Rows m(rows, cols);
  uint64_t per_row = tiles_for(cols);
  const uint64_t tile = tile_bytes(dtype);
  for (uint32_t r = 0; r < rows; ++r) {
    float* row = m.row(r);
    for (uint32_t c = 0; c < cols; ++c) {
      TilePosition p = tile_position(r, c, per_row);
      row[c] = tile_element(bytes + p.tile * tile, p.index, dtype);
    }
  }
  return m;
}

uint16_t bf16_bits(float v) {
  if (std::isnan(v)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float bf16_value(uint16_t bits) { return f32_of_bits(static_cast<uint32_t>(bits) << 16); }

}  // namespace clef_tt::host
