/*
 * clef_tt.h — the C ABI of clef-tt's Tenstorrent shim (tt-metal-sys).
 *
 * A C++ shim over the ttnn C++ API implements these functions and is built only where tt-metal
 * is installed (feature `tt`); clef-tt loads it at run time, so the project builds, tests and
 * runs everywhere without it. Every function returns a status (0 = ok); on failure
 * clef_tt_last_error() describes the error of the calling thread. Handles are opaque.
 *
 * ABI version: bump CLEF_TT_ABI_VERSION on any incompatible change; the Rust side refuses a
 * shim whose clef_tt_abi_version() differs.
 */
#ifndef CLEF_TT_H
#define CLEF_TT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CLEF_TT_ABI_VERSION 1

typedef struct clef_tt_mesh clef_tt_mesh;
typedef struct clef_tt_tensor clef_tt_tensor;

/* Element formats of device tensors. */
typedef enum {
  CLEF_TT_F32 = 0,
  CLEF_TT_BF16 = 1,
  CLEF_TT_BFP8_B = 2,
  CLEF_TT_BFP4_B = 3,
} clef_tt_dtype;

/* How a host tensor is laid over the mesh. */
typedef enum {
  CLEF_TT_REPLICATE = 0,
  CLEF_TT_SHARD_LAST_DIM = 1,
} clef_tt_placement;

/* Math fidelity of a matmul. */
typedef enum {
  CLEF_TT_LOFI = 0,
  CLEF_TT_HIFI2 = 1,
  CLEF_TT_HIFI3 = 2,
  CLEF_TT_HIFI4 = 3,
} clef_tt_fidelity;

uint32_t clef_tt_abi_version(void);
const char *clef_tt_last_error(void);

/* Open `cols` devices as a 1xN mesh (FABRIC_1D); with more chips visible, open a 1x`parent_cols`
 * parent and take the 1x`cols` submesh at `submesh_offset`. */
int clef_tt_mesh_open(uint32_t cols, uint32_t parent_cols, uint32_t submesh_offset,
                      clef_tt_mesh **out);
int clef_tt_mesh_close(clef_tt_mesh *mesh);
int clef_tt_mesh_devices(const clef_tt_mesh *mesh, uint32_t *out);

/* Upload row-major host data (already packed in `dtype` for bfp formats: tiles as tt-metal
 * lays them out), one buffer per device. */
int clef_tt_tensor_upload(clef_tt_mesh *mesh, const void *const *per_device, const size_t *bytes,
                          uint32_t rows, uint32_t cols, clef_tt_dtype dtype,
                          clef_tt_placement placement, clef_tt_tensor **out);
int clef_tt_tensor_download(const clef_tt_tensor *t, float *out, size_t capacity);
int clef_tt_tensor_free(clef_tt_tensor *t);

/* y = x · wᵀ per device (w uploaded as [in, out] tiles). */
int clef_tt_linear(clef_tt_mesh *mesh, const clef_tt_tensor *x, const clef_tt_tensor *w,
                   clef_tt_fidelity fidelity, int fp32_accumulate, clef_tt_tensor **out);
/* Sum of per-device partial results, replicated (reduce-scatter + all-gather). */
int clef_tt_all_reduce(clef_tt_mesh *mesh, const clef_tt_tensor *x, clef_tt_tensor **out);

#ifdef __cplusplus
}
#endif

#endif /* CLEF_TT_H */
