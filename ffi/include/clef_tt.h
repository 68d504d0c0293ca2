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
 *     partial sums, completed by clef_tt_all_reduce). Ops give results the placement
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

#define CLEF_TT_ABI_VERSION 5

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
  /* The right-hand side of clef_tt_linear: [in, out] tiles in the dtype uploaded. */
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

/* ---- ops: the Qwen3.5 text prefill -------------------------------------------------------- */

typedef struct clef_tt_matmul_config {
  clef_tt_fidelity fidelity;
  /* 0: a bf16 destination register (the sum is rounded to bf16 after every 32 input channels). */
  uint32_t fp32_dest_acc;
  /* Activations are rounded to bf16 before the product (the device holds bf16 tiles). */
  uint32_t bf16_activations;
  /* Packer L1 accumulation (a ttnn speed knob; no effect on the host backend's numbers). */
  uint32_t packer_l1_acc;
} clef_tt_matmul_config;

/* x · w per device (w: a MATRIX [in, out]). REPLICATED x → SHARDED (REPLICATED on one device),
 * SHARDED x → PARTIAL. */
int clef_tt_linear(clef_tt_mesh *mesh, const clef_tt_tensor *x, const clef_tt_tensor *w,
                   const clef_tt_matmul_config *config, clef_tt_tensor **out);
/* Sum of PARTIAL parts, REPLICATED (reduce-scatter then all-gather). The parts are held in the
 * activation dtype (the ttnn backend: bf16 under bf16 activations, the port's bf16 collectives;
 * the host backend: f32). */
int clef_tt_all_reduce(clef_tt_mesh *mesh, const clef_tt_tensor *x, clef_tt_tensor **out);
/* Consecutive column blocks of the given widths (summing to cols); `outs` has `n` entries. */
int clef_tt_split_cols(clef_tt_mesh *mesh, const clef_tt_tensor *x, const uint32_t *widths,
                       uint32_t n, clef_tt_tensor **outs);
int clef_tt_add(clef_tt_mesh *mesh, const clef_tt_tensor *a, const clef_tt_tensor *b,
                clef_tt_tensor **out);
/* RMSNorm over groups of `group` columns: x / rms(x) * (w + one_plus); w has `group` values. */
int clef_tt_rms_norm(clef_tt_mesh *mesh, const clef_tt_tensor *x, const clef_tt_tensor *w,
                     uint32_t group, float eps, uint32_t one_plus, clef_tt_tensor **out);
/* silu(gate) * up of [gate | up] halves. */
int clef_tt_swiglu(clef_tt_mesh *mesh, const clef_tt_tensor *gate_up, clef_tt_tensor **out);
/* Per head [query(d) | gate(d)] → query and gate. */
int clef_tt_split_query_gate(clef_tt_mesh *mesh, const clef_tt_tensor *qg, uint32_t heads,
                             uint32_t head_dim, clef_tt_tensor **query, clef_tt_tensor **gate);

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

/* A layer op: a fixed sequence of the ops below that always runs together (a whole attention,
 * DeltaNet or MLP sublayer of the text backbone), run by the backend in one call and in its
 * own layouts. `op` names it; `inputs` are its tensors in the op's order, a null entry for an
 * absent optional one (a cache or state at the sequence start); `params_json` is a JSON object
 * of its sizes and settings; `rope`, `positions` and `rows` are the rope of its rows, or null.
 * The caller gives each result's shape in `results`; the backend's results are checked against
 * them. The ops, their inputs and results are listed where they are implemented
 * (ffi/shim/ttnn/clef_tt_ttnn/layers.py) and called (clef-device's MeshOps layer methods).
 * CLEF_TT_UNSUPPORTED: the backend does not run `op` for these arguments (nothing computed). */
int clef_tt_layer_op(clef_tt_mesh *mesh, const char *op, const clef_tt_tensor *const *inputs,
                     uint32_t n_inputs, const char *params_json, const clef_tt_rope_spec *rope,
                     const uint32_t *positions, uint32_t rows, const clef_tt_result_spec *results,
                     uint32_t n_results, clef_tt_tensor **outs);

/* Partial M-RoPE; `positions` holds (t, h, w) for each of the `rows` rows (the shim computes
 * the cos/sin tables of these positions on the host). */
int clef_tt_rope(clef_tt_mesh *mesh, const clef_tt_tensor *x, const clef_tt_rope_spec *spec,
                 const uint32_t *positions, uint32_t rows, clef_tt_tensor **out);
/* `cache` rows followed by `rows` rows (a KV cache of `heads` heads of cols/heads channels,
 * which a backend may hold paged per head); a null cache starts one from `rows`. */
int clef_tt_append_rows(clef_tt_mesh *mesh, const clef_tt_tensor *cache, const clef_tt_tensor *rows,
                        uint32_t heads, clef_tt_tensor **out);
/* Causal GQA softmax attention, fp32, scale head_dim^-0.5: the q rows are the last positions of
 * keys/values. */
int clef_tt_causal_attention(clef_tt_mesh *mesh, const clef_tt_tensor *q,
                             const clef_tt_tensor *keys, const clef_tt_tensor *values,
                             uint32_t heads, uint32_t kv_heads, uint32_t head_dim,
                             clef_tt_tensor **out);
/* x * sigmoid(gate). */
int clef_tt_mul_sigmoid(clef_tt_mesh *mesh, const clef_tt_tensor *x, const clef_tt_tensor *gate,
                        clef_tt_tensor **out);
/* Causal depthwise conv over time + SiLU; w: [channels, kernel] taps; carry: the last kernel-1
 * inputs of the previous chunk (null = zeros). Writes the output and the new carry. */
int clef_tt_causal_conv1d_silu(clef_tt_mesh *mesh, const clef_tt_tensor *x, const clef_tt_tensor *w,
                               const clef_tt_tensor *carry, uint32_t kernel, clef_tt_tensor **out,
                               clef_tt_tensor **carry_out);
/* beta = sigmoid(b); g = -exp(a_log) * softplus(a + dt_bias), fp32. */
int clef_tt_delta_gates(clef_tt_mesh *mesh, const clef_tt_tensor *a, const clef_tt_tensor *b,
                        const clef_tt_tensor *a_log, const clef_tt_tensor *dt_bias,
                        clef_tt_tensor **g, clef_tt_tensor **beta);

typedef struct clef_tt_delta_spec {
  uint32_t key_heads;
  uint32_t value_heads;
  uint32_t key_dim;
  uint32_t value_dim;
} clef_tt_delta_spec;

/* The gated delta rule over [q | k | v] (q, k L2-normalised inside, q scaled key_dim^-0.5),
 * with the fp32 state [value_heads * key_dim, value_dim] (null = zeros). Writes the core output
 * [rows, value_heads * value_dim] and the final state. */
int clef_tt_gated_delta_rule(clef_tt_mesh *mesh, const clef_tt_tensor *qkv, const clef_tt_tensor *g,
                             const clef_tt_tensor *beta, const clef_tt_tensor *state,
                             const clef_tt_delta_spec *spec, clef_tt_tensor **out,
                             clef_tt_tensor **state_out);
/* w * x / rms(x) * silu(z) per group. */
int clef_tt_gated_rms_norm(clef_tt_mesh *mesh, const clef_tt_tensor *x, const clef_tt_tensor *z,
                           const clef_tt_tensor *w, uint32_t group, float eps,
                           clef_tt_tensor **out);

/* ---- ops: the vision tower ---------------------------------------------------------------- */

/* (x - mean) / sqrt(var + eps) * w + b over each row. */
int clef_tt_layer_norm(clef_tt_mesh *mesh, const clef_tt_tensor *x, const clef_tt_tensor *w,
                       const clef_tt_tensor *b, float eps, clef_tt_tensor **out);
int clef_tt_add_bias(clef_tt_mesh *mesh, const clef_tt_tensor *x, const clef_tt_tensor *b,
                     clef_tt_tensor **out);
int clef_tt_gelu(clef_tt_mesh *mesh, const clef_tt_tensor *x, clef_tt_gelu_kind kind,
                 clef_tt_tensor **out);
/* x * cos + rotate_half(x) * sin per head; cos, sin: REPLICATED [rows, head_dim]. */
int clef_tt_rotary(clef_tt_mesh *mesh, const clef_tt_tensor *x, const clef_tt_tensor *cos,
                   const clef_tt_tensor *sin, uint32_t heads, uint32_t head_dim,
                   clef_tt_tensor **out);
/* Bidirectional attention inside each segment; `segments` holds n (start, end) row pairs that
 * cover the rows in order. */
int clef_tt_segment_attention(clef_tt_mesh *mesh, const clef_tt_tensor *q, const clef_tt_tensor *k,
                              const clef_tt_tensor *v, uint32_t heads, uint32_t head_dim,
                              const uint32_t *segments, uint32_t n, clef_tt_tensor **out);
/* Every `group` consecutive rows joined into one: [rows, cols] → [rows/group, cols*group]. */
int clef_tt_fold_rows(clef_tt_mesh *mesh, const clef_tt_tensor *x, uint32_t group,
                      clef_tt_tensor **out);

#ifdef __cplusplus
}
#endif

#endif /* CLEF_TT_H */
