// The interface between the shim's core (ffi/shim/core: handles, checks, placements, errors)
// and an op backend (ffi/shim/host: plain loops over tiles; ffi/shim/ttnn: ttnn calls).
//
// The core validates every argument and computes every result's shape and placement before it
// calls the backend, so a backend only computes: it receives tensors whose metadata is known
// to fit the op and returns the storage of the results. A backend reports failures by throwing
// clef_tt::Error (device_failure for the device, invalid for what only it can know).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "clef_tt.h"

namespace clef_tt {

// What the core knows of a tensor: one per-device shape, format, role and placement.
struct Meta {
  uint32_t rows = 0;
  uint32_t cols = 0;
  uint32_t devices = 0;
  clef_tt_dtype dtype = CLEF_TT_F32;
  clef_tt_layout layout = CLEF_TT_TILE;
  clef_tt_role role = CLEF_TT_ACTIVATION;
  clef_tt_placement placement = CLEF_TT_REPLICATED;
};

// A backend's data of one tensor on all devices of its mesh.
class Storage {
 public:
  virtual ~Storage() = default;
  // Told the Meta the core gives the result (before the caller sees it); a backend that can
  // check its result against it throws when they disagree.
  virtual void bind(const Meta&) {}
};
using StoragePtr = std::unique_ptr<Storage>;
using StoragePair = std::pair<StoragePtr, StoragePtr>;

// A tensor as a backend sees it.
struct TensorView {
  const Meta& meta;
  const Storage& storage;
};

// Host bytes of one device's part (already checked against the Meta's size by the core).
struct HostBytes {
  const uint8_t* data;
  size_t bytes;
};

// cos/sin of every row's rotary angles, computed on the host by the core (rope.cpp):
// `half` frequencies per row, [rows, half] each.
struct RopeTables {
  uint32_t rows = 0;
  uint32_t half = 0;
  std::vector<float> cos;
  std::vector<float> sin;
  // Set by the mesh's RopeCache (core/rope.hpp): the same generation means the same tables.
  uint64_t generation = 0;
};

struct Segment {
  uint32_t start;
  uint32_t end;
};

// One opened mesh of a backend. Calls are serialised by the core (one at a time per mesh).
class DeviceMesh {
 public:
  virtual ~DeviceMesh() = default;

  virtual std::vector<uint32_t> device_ids() const = 0;
  // Bytes the mesh's tensors hold per device.
  virtual std::vector<uint64_t> memory() const = 0;
  // A JSON object of facts about the open mesh (grid, device memory, ...).
  virtual std::string describe() = 0;
  // The calls the backend made to its runtime since the last take, per op name, as a JSON
  // object {"name": [calls, host seconds]} ("{}" for a backend without a runtime).
  virtual std::string take_op_stats() { return "{}"; }
  // A request that is not an op (clef_tt_mesh_command), JSON in and out; throws
  // CLEF_TT_UNSUPPORTED for one the backend does not know.
  virtual std::string command(const std::string& request_json) = 0;

  // One HostBytes per device (the core repeats a replicated upload's part).
  virtual StoragePtr upload(const Meta& meta, const std::vector<HostBytes>& parts) = 0;
  // Device memory for `meta` on every device, values unset.
  virtual StoragePtr allocate(const Meta& meta) = 0;
  // Device `device`'s part as row-major f32 [rows, cols].
  virtual void download(const TensorView& t, uint32_t device, float* out) = 0;
  // Device `device`'s part in its stored bytes (stored_bytes(meta) of them).
  virtual void read_stored(const TensorView& t, uint32_t device, uint8_t* out) = 0;
  virtual uint64_t device_bytes(const TensorView& t) = 0;
  virtual StoragePtr copy(const TensorView& t) = 0;

  virtual StoragePtr linear(const TensorView& x, const TensorView& w,
                            const clef_tt_matmul_config& config) = 0;
  virtual StoragePtr all_reduce(const TensorView& x) = 0;
  virtual std::vector<StoragePtr> split_cols(const TensorView& x,
                                             const std::vector<uint32_t>& widths) = 0;
  virtual StoragePtr add(const TensorView& a, const TensorView& b) = 0;
  virtual StoragePtr rms_norm(const TensorView& x, const TensorView& w, uint32_t group, float eps,
                              bool one_plus) = 0;
  virtual StoragePtr swiglu(const TensorView& gate_up) = 0;
  virtual StoragePair split_query_gate(const TensorView& qg, uint32_t heads, uint32_t head_dim) = 0;
  virtual StoragePtr rope(const TensorView& x, const RopeTables& tables, uint32_t heads,
                          uint32_t head_dim) = 0;
  // `cache` may be null; the rows hold `heads` heads (a KV cache).
  virtual StoragePtr append_rows(const TensorView* cache, const TensorView& rows,
                                 uint32_t heads) = 0;
  virtual StoragePtr causal_attention(const TensorView& q, const TensorView& keys,
                                      const TensorView& values, uint32_t heads, uint32_t kv_heads,
                                      uint32_t head_dim) = 0;
  virtual StoragePtr mul_sigmoid(const TensorView& x, const TensorView& gate) = 0;
  // `carry` may be null (zeros). Returns the output and the new carry.
  virtual StoragePair causal_conv1d_silu(const TensorView& x, const TensorView& w,
                                         const TensorView* carry, uint32_t kernel) = 0;
  // Returns g and beta.
  virtual StoragePair delta_gates(const TensorView& a, const TensorView& b, const TensorView& a_log,
                                  const TensorView& dt_bias) = 0;
  // `state` may be null (zeros). Returns the core output and the final state.
  virtual StoragePair gated_delta_rule(const TensorView& qkv, const TensorView& g,
                                       const TensorView& beta, const TensorView* state,
                                       const clef_tt_delta_spec& spec) = 0;
  virtual StoragePtr gated_rms_norm(const TensorView& x, const TensorView& z, const TensorView& w,
                                    uint32_t group, float eps) = 0;

  virtual StoragePtr layer_norm(const TensorView& x, const TensorView& w, const TensorView& b,
                                float eps) = 0;
  virtual StoragePtr add_bias(const TensorView& x, const TensorView& b) = 0;
  virtual StoragePtr gelu(const TensorView& x, clef_tt_gelu_kind kind) = 0;
  virtual StoragePtr rotary(const TensorView& x, const TensorView& cos, const TensorView& sin,
                            uint32_t heads, uint32_t head_dim) = 0;
  virtual StoragePtr segment_attention(const TensorView& q, const TensorView& k,
                                       const TensorView& v, uint32_t heads, uint32_t head_dim,
                                       const std::vector<Segment>& segments) = 0;
  virtual StoragePtr fold_rows(const TensorView& x, uint32_t group) = 0;

  // A layer op (clef_tt_layer_op): the results in the caller's order. `inputs` holds the op's
  // tensors (empty for an absent optional one), `rope` the tables of the positions or null. A
  // backend without the op, or without a form for these shapes, throws CLEF_TT_UNSUPPORTED
  // before computing anything (the host backend has none: it composes nothing itself).
  virtual std::vector<StoragePtr> layer_op(const std::string& op,
                                           const std::vector<std::optional<TensorView>>& inputs,
                                           const std::string& params_json,
                                           const RopeTables* rope) = 0;
};

// A parent mesh that submeshes are taken from (a 1x4 box serving two 1x2 groups).
class ParentMesh {
 public:
  virtual ~ParentMesh() = default;
};

// The backend of this library build.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual uint32_t visible_devices() = 0;
  // Whether a device can belong to one open mesh (or parent) at a time in a process: true on
  // chips, whose runtime aborts on a second open; the host backend simulates any number.
  virtual bool exclusive_devices() const { return false; }
  // A JSON object: {"backend", "hardware" (what runs the ops: "host", "mock", "silicon"),
  // "runtime", "devices"}.
  virtual std::string describe() = 0;
  // A 1x`cols` mesh opened directly.
  virtual std::unique_ptr<DeviceMesh> open(const clef_tt_mesh_config& config) = 0;
  virtual std::shared_ptr<ParentMesh> open_parent(const clef_tt_mesh_config& config) = 0;
  // The 1x`cols` submesh at `config.submesh_offset` of `parent` (the core keeps the parent
  // alive while the submesh is open).
  virtual std::unique_ptr<DeviceMesh> open_submesh(const std::shared_ptr<ParentMesh>& parent,
                                                   const clef_tt_mesh_config& config) = 0;
};

// Defined once per library: the host backend or the ttnn backend.
Backend& backend();

// Bytes one device's part of `meta` takes as uploaded and as read back by read_stored: packed
// tiles for a TILE matrix, f32 rows otherwise.
uint64_t stored_bytes(const Meta& meta);

}  // namespace clef_tt
