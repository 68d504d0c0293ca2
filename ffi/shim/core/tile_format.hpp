// Tile geometry shared by the core's size checks and the backends (Tenstorrent's documentation):
// 32x32 tiles in row-major tile order, four 16x16 faces each; bytes per tile by dtype.
#pragma once

#include <cstdint>

#include "backend.hpp"

namespace clef_tt {

constexpr uint32_t kTile = 32;
constexpr uint32_t kFace = 16;

inline uint64_t tiles_for(uint64_t n) { return (n + kTile - 1) / kTile; }

// fp32 4096, bf16 2048, bfp8_b 64 exponents + 1024 codes, bfp4_b 64 + 512.
inline uint64_t tile_bytes(clef_tt_dtype dtype) {
  switch (dtype) {
    case CLEF_TT_F32:
      return kTile * kTile * 4;
    case CLEF_TT_BF16:
      return kTile * kTile * 2;
    case CLEF_TT_BFP8_B:
      return 64 + kTile * kTile;
    case CLEF_TT_BFP4_B:
      return 64 + kTile * kTile / 2;
  }
  return 0;
}

inline uint64_t packed_bytes(uint64_t rows, uint64_t cols, clef_tt_dtype dtype) {
  return tiles_for(rows) * tiles_for(cols) * tile_bytes(dtype);
}

inline const char* dtype_name(clef_tt_dtype dtype) {
  switch (dtype) {
    case CLEF_TT_F32:
      return "f32";
    case CLEF_TT_BF16:
      return "bf16";
    case CLEF_TT_BFP8_B:
      return "bfp8_b";
    case CLEF_TT_BFP4_B:
      return "bfp4_b";
  }
  return "unknown dtype";
}

}  // namespace clef_tt
