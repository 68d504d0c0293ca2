/*
 * clef_tt.h — the C ABI between clef-tt and its Tenstorrent shim (crate clef-tt-abi).
 *
 * clef-tt loads a shim library at run time (libloading) and drives a mesh of devices through
 * these functions only. Two shims implement it over one shared C++ core (ffi/shim/core):
 *   - libclef_tt_host.so: the host backend, every op as plain loops over per-device buffers in
 *     ttnn's TILE layout; built by `cargo build` everywhere (with a C++ compiler);
 *   - libclef_tt_ttnn.so: the ttnn backend, every op as the ttnn 0.81.1 op the Tenstorrent port
 *     uses, through ttnn's Python API in an embedded CPython (shim/ttnn); built by `cargo build`
 *     where a CPython 3.12 or 3.10 with pybind11 is found (ffi/README.md).
 *
 * Conventions
 *   - Every function but the version, name and error getters returns a clef_tt_status; on
 *     failure clef_tt_last_error() holds a message for the calling thread (naming the op and the
 *     argument) until its next failing call, and no output handle was written.
 *   - Handles are opaque and owned by the caller: every tensor a call returns is freed with
 *     clef_tt_tensor_free exactly once; a mesh is closed with clef_tt_mesh_close after all of its
 *     tensors were freed (closing refuses while any is alive).
 *   - A mesh tensor has one per-device shape [rows, cols] and a placement: REPLICATED (the same
 *     values on every device), SHARDED (a different part per device) or PARTIAL (per-device
 *     partial sums, completed by the op all_reduce). Ops give results the placement
 *     clef-device's MeshOps documents (device/src/ops.rs).
 *   - Weights are uploaded already split per device and, for matrices, already packed by the host
 *     as `[in, out]` tiles: 32x32 tiles in row-major tile order, four 16x16 faces per tile,
 *     padded with zeros (bf16, bfp8_b or bfp4_b exactly as ttnn's host conversion writes them,
 *     or f32). Vectors (norm weights, biases, conv taps, gates) are row-major f32.
 *   - Activations go up and come back as row-major f32 rows; on the device they are held in
 *     TILE layout.
 *   - Calls on one mesh are serialised by the shim; different meshes may be driven from
 *     different threads at once. A tensor may be freed from any thread.
 *
 * ABI version: bump CLEF_TT_ABI_VERSION on any incompatible change; clef-tt refuses a shim whose
 * clef_tt_abi_version() differs, naming both versions.
 */
#ifndef CLEF_TT_H
#define CLEF_TT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CLEF_TT_ABI_VERSION 6

/* Most devices a mesh of this ABI can hold. */
#define CLEF_TT_MAX_DEVICES 8

typedef struct clef_tt_mesh clef_tt_mesh;
typedef struct clef_tt_tensor clef_tt_tensor;

typedef enum clef_tt_status {
  CLEF_TT_OK = 0,
  /* A null or foreign handle, or a shape, dtype, role or placement the op refuses. */
  CLEF_TT_INVALID_ARGUMENT = 1,
  /* The device or its runtime failed (a TT_THROW, a fabric timeout, an injected fault). */
  CLEF_TT_DEVICE_ERROR = 2,
  CLEF_TT_OUT_OF_MEMORY = 3,
  /* Anything else the shim caught (a bug in the shim). */
  CLEF_TT_INTERNAL = 4,
  /* A layer op the backend does not run for these arguments (clef_tt_layer_op): nothing was
   * computed, and the caller composes the layer from the ops. */
  CLEF_TT_UNSUPPORTED = 5,
} clef_tt_status;

/* Element formats. */
typedef enum clef_tt_dtype {
  CLEF_TT_F32 = 0,
  CLEF_TT_BF16 = 1,
  CLEF_TT_BFP8_B = 2,
  CLEF_TT_BFP4_B = 3,
} clef_tt_dtype;

/* How the bytes of a tensor are laid out. */
typedef enum clef_tt_layout {
  CLEF_TT_ROW_MAJOR = 0,
  CLEF_TT_TILE = 1,
} clef_tt_layout;

/* What a tensor is for, which decides how the device holds it and which ops take it. */
typedef enum clef_tt_role {
  /* Rows of tokens (or patches); uploaded as row-major f32, held in TILE layout. */
  CLEF_TT_ACTIVATION = 0,
  /* The right-hand side of the op linear: [in, out] tiles in the dtype uploaded. */
  CLEF_TT_MATRIX = 1,
  /* Values read elementwise by an op (norm weights, biases, gates, conv taps): row-major f32. */
  CLEF_TT_VECTOR = 2,
} clef_tt_role;

typedef enum clef_tt_placement {
  CLEF_TT_REPLICATED = 0,
  CLEF_TT_SHARDED = 1,
  CLEF_TT_PARTIAL = 2,
} clef_tt_placement;

/* Math fidelity of a matmul (tech_reports/matrix_engine: phases of the 5b x 7b multipliers).
 * EXACT: the host backend multiplies in f32 without truncation; the ttnn backend runs HiFi4. */
typedef enum clef_tt_fidelity {
  CLEF_TT_EXACT = 0,
  CLEF_TT_LOFI = 1,
  CLEF_TT_HIFI2 = 2,
  CLEF_TT_HIFI3 = 3,
  CLEF_TT_HIFI4 = 4,
} clef_tt_fidelity;

typedef enum clef_tt_gelu_kind {
  CLEF_TT_GELU_TANH = 0,
  CLEF_TT_GELU_ERF = 1,
} clef_tt_gelu_kind;

/* ---- the library ------------------------------------------------------------------------ */

uint32_t clef_tt_abi_version(void);
/* "host" or "ttnn". */
const char *clef_tt_backend(void);
/* The calling thread's last error message ("" when none). Valid until its next call. */
const char *clef_tt_last_error(void);
/* Devices this process can open (chips for ttnn; CLEF_TT_HOST_DEVICES, default 4, for host). */
int clef_tt_visible_devices(uint32_t *out);

/* Facts as JSON text. Each writes the text and a NUL into `out` when `capacity` holds both, and
 * its length (without the NUL) into `*len` either way; a short `out` is refused
 * (CLEF_TT_INVALID_ARGUMENT) and the caller retries with `*len + 1` bytes. */
/* The backend: {"backend": "host"|"ttnn", "hardware": what runs the ops ("host", "mock" for
 * tt-metal's mock cluster, "silicon"), "runtime": e.g. "ttnn 0.81.1", "devices": visible}. */
int clef_tt_describe(char *out, size_t capacity, size_t *len);

/* ---- meshes ----------------------------------------------------------------------------- */

typedef struct clef_tt_mesh_config {
  /* Devices of the 1xN mesh (1 or 2; 4 as a parent). */
  uint32_t cols;
  /* 0: open the 1x`cols` mesh directly. Otherwise open (or share, if this process has it open
   * already) a 1x`parent_cols` parent and take the 1x`cols` submesh at column `submesh_offset`. */
  uint32_t parent_cols;
  uint32_t submesh_offset;
  /* Device open parameters (Tenstorrent's documentation; the port: 24576, 0 eager, 2). */
  uint32_t num_command_queues;
  uint64_t l1_small_size;
  uint64_t trace_region_size;
  /* How the device holds activations between ops: CLEF_TT_BF16 (the port) or CLEF_TT_F32.
   * The host backend always holds f32 (a bf16 profile imitates the rounding in its matmuls). */
  clef_tt_dtype activation_dtype;
  /* What the mesh keeps, CLEF_TT_F32 or CLEF_TT_BF16 each: the KV cache (the K and V rows
   * attention reads), the DeltaNet gates g and beta as the delta rule reads them, and the
   * DeltaNet recurrent state between calls. The host backend keeps f32 and rounds what is
   * kept as bf16; a backend that cannot keep a dtype refuses the open, naming it (ttnn: bf16
   * KV, f32 gates and state). */
  clef_tt_dtype kv_dtype;
  clef_tt_dtype gdn_gate_dtype;
  clef_tt_dtype gdn_state_dtype;
} clef_tt_mesh_config;

int clef_tt_mesh_open(const clef_tt_mesh_config *config, clef_tt_mesh **out);
/* Refused (the mesh stays open) while any of its tensors is alive. */
int clef_tt_mesh_close(clef_tt_mesh *mesh);
int clef_tt_mesh_devices(const clef_tt_mesh *mesh, uint32_t *out);
/* The physical ids of the mesh's devices, in mesh order; `capacity` entries of `out`. */
int clef_tt_mesh_device_ids(const clef_tt_mesh *mesh, uint32_t *out, uint32_t capacity);
/* Bytes of device memory the mesh's tensors hold, per device. */
int clef_tt_mesh_memory(const clef_tt_mesh *mesh, uint64_t *bytes_per_device, uint32_t capacity);
/* Tensors of the mesh not freed yet. */
int clef_tt_mesh_live_tensors(const clef_tt_mesh *mesh, uint64_t *out);
/* An open mesh as JSON (see clef_tt_describe for `out`/`len`): devices, device ids, compute
 * grid, device memory per device, activation dtype, and what else the backend knows. */
int clef_tt_mesh_describe(const clef_tt_mesh *mesh, char *out, size_t capacity, size_t *len);
/* The calls the backend made to its runtime (ttnn ops for the ttnn backend) since the last
 * take, per op name, with their host time: JSON {"name": [calls, seconds], ...}; then zeroes
 * them. "{}" for the host backend. */
int clef_tt_mesh_take_op_stats(clef_tt_mesh *mesh, char *out, size_t capacity, size_t *len);

/* A request to the mesh's backend that is not an op, as a JSON object; its answer as JSON (see
 * clef_tt_describe for `out`/`len`). The ttnn backend takes {"graph_capture": "begin"} and
 * {"graph_capture": "end"} (ttnn's graph capture around the calls in between: the answer
 * counts the device operations, per program, with the data-movement ops and their bytes).
 * CLEF_TT_UNSUPPORTED for a request the backend does not know (the host backend knows none).
 * The request runs once: a too-small `out` gets the answer's length, but the answer is lost. */
int clef_tt_mesh_command(clef_tt_mesh *mesh, const char *request_json, char *out, size_t capacity,
                         size_t *len);
/* ---- tensors ---------------------------------------------------------------------------- */

typedef struct clef_tt_tensor_desc {
  /* Per-device shape. */
  uint32_t rows;
  uint32_t cols;
  /* Of the bytes given: ROW_MAJOR f32, or TILE bytes of `dtype` (matrices). */
  clef_tt_dtype dtype;
  clef_tt_layout layout;
  clef_tt_role role;
  clef_tt_placement placement;
} clef_tt_tensor_desc;

typedef struct clef_tt_host_part {
  const void *data;
  size_t bytes;
} clef_tt_host_part;

/* Upload host data: one part copied to every device (REPLICATED) or one part per device, in mesh
 * order. The bytes are copied before the call returns. */
int clef_tt_tensor_upload(clef_tt_mesh *mesh, const clef_tt_tensor_desc *desc,
                          const clef_tt_host_part *parts, uint32_t n_parts, clef_tt_tensor **out);

/* A tensor of `desc`'s per-device shape, format, role and placement on every device, its
 * values unset: device memory only, no host data moves (placement plans, memory checks). The
 * device holds it as an upload of the same descriptor would be held. */
int clef_tt_tensor_allocate(clef_tt_mesh *mesh, const clef_tt_tensor_desc *desc,
                            clef_tt_tensor **out);

typedef struct clef_tt_tensor_info {
  uint32_t rows;
  uint32_t cols;
  uint32_t devices;
  clef_tt_dtype dtype;
  clef_tt_layout layout;
  clef_tt_role role;
  clef_tt_placement placement;
  /* Device memory of all parts together. */
  uint64_t device_bytes;
  /* Bytes clef_tt_tensor_read_stored writes for one device. */
  uint64_t stored_bytes;
} clef_tt_tensor_info;

int clef_tt_tensor_info_get(const clef_tt_tensor *t, clef_tt_tensor_info *out);
/* Device `device`'s part as row-major f32 [rows, cols] (matrices decoded); `capacity` floats.
   On success every one of the rows * cols values is written. */
int clef_tt_tensor_download(const clef_tt_tensor *t, uint32_t device, float *out, size_t capacity);
/* Device `device`'s part as uploaded (tile bytes of a matrix, f32 rows otherwise), for a
 * tensor cache; `capacity` bytes. */
int clef_tt_tensor_read_stored(const clef_tt_tensor *t, uint32_t device, void *out,
                               size_t capacity);
/* A new tensor with its own device buffers holding the same values (prefix-cache slots: KV
 * and DeltaNet states are copied on the device, never through the host). */
int clef_tt_tensor_copy(clef_tt_mesh *mesh, const clef_tt_tensor *t, clef_tt_tensor **out);
/* Null is accepted and does nothing. */
int clef_tt_tensor_free(clef_tt_tensor *t);

/* ---- ops ---------------------------------------------------------------------------------- */

/* The fine ops (a matmul, a norm, an attention, ...) are declared once, in the shim's op table
 * (ffi/shim/core/op_table.cpp): each op's name, its tensor operands in order (an activation, a
 * vector or matrix weight; optional ones may be null), its numeric parameters in order with
 * their types, the one list of numbers it may take, its results, and the shape rules the core
 * checks. clef_tt_op_table() gives the table as JSON; clef-device's MeshOps documents what each
 * op computes (device/src/ops.rs). */

/* The op table as JSON (see clef_tt_describe for `out`/`len`): [{"name": ..., "inputs":
 * [{"name", "kind": "activation"|"vector"|"matrix", "optional": bool}], "params": [{"name",
 * "type": "u32"|"f32"|"f64"|"flag"|"fidelity"|"gelu_kind"}], "list": its name or null,
 * "results": [names], "results_per_list_entry": bool}]. */
int clef_tt_op_table(char *out, size_t capacity, size_t *len);

/* Run the fine op `op` of the table: `inputs` are its tensors in the declared order (`n_inputs`
 * of them, a null entry for an absent optional one); `params` its parameters in the declared
 * order, each as a double (u32, flags 0/1 and enum values exactly); `list` its list of numbers
 * if it declares one (`n_list` of them), else null and 0; `outs` receives its results in the
 * declared order (`n_outs` of them: one per list entry for an op whose results are per list
 * entry). Every argument is checked against the table and the op's shape rules before the
 * backend computes; on failure nothing is written to `outs`. */
int clef_tt_op(clef_tt_mesh *mesh, const char *op, const clef_tt_tensor *const *inputs,
               uint32_t n_inputs, const double *params, uint32_t n_params, const uint32_t *list,
               uint32_t n_list, clef_tt_tensor **outs, uint32_t n_outs);

typedef struct clef_tt_rope_spec {
  uint32_t heads;
  uint32_t head_dim;
  /* Leading channels of each head that rotate (rotate-half layout). */
  uint32_t rotary_dim;
  /* Interleaved M-RoPE: slot j uses h if j%3==1 && j<3*s[1], w if j%3==2 && j<3*s[2], else t. */
  uint32_t mrope_section[3];
  double theta;
} clef_tt_rope_spec;

/* The shape a caller gives one result of clef_tt_layer_op: an activation of `rows` x `cols` per
 * device (in the mesh's activation dtype or f32) with `placement`. */
typedef struct clef_tt_result_spec {
  uint32_t rows;
  uint32_t cols;
  clef_tt_placement placement;
} clef_tt_result_spec;

/* A layer op: a fixed sequence of fine ops that always runs together (a whole attention,
 * DeltaNet or MLP sublayer of the text backbone, or a whole prefill chunk), run by the backend
 * in one call and in its own layouts. `op` names it; `inputs` are its tensors in the op's order,
 * a null entry for an absent optional one (a cache or state at the sequence start);
 * `params_json` is a JSON object of its sizes and settings; `rope`, `positions` and `rows` are
 * the rope of its rows, or null. The caller gives each result's shape in `results`; the
 * backend's results are checked against them. The ops, their inputs and results are listed
 * where they are implemented (ffi/shim/ttnn/clef_tt_ttnn/layers.py) and called (clef-device's
 * MeshOps layer methods).
 * CLEF_TT_UNSUPPORTED: the backend does not run `op` for these arguments (nothing computed). */
int clef_tt_layer_op(clef_tt_mesh *mesh, const char *op, const clef_tt_tensor *const *inputs,
                     uint32_t n_inputs, const char *params_json, const clef_tt_rope_spec *rope,
                     const uint32_t *positions, uint32_t rows, const clef_tt_result_spec *results,
                     uint32_t n_results, clef_tt_tensor **outs);

#ifdef __cplusplus
}
#endif

#endif /* CLEF_TT_H */
