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

// What an operand of a fine op must be: a complete activation (replicated or sharded), the
// per-device partial sums of one (or a replicated one: all_reduce), a vector or a matrix weight.
enum class OperandKind { Activation, PartialSums, Vector, Matrix };

// A fine op's numeric parameter types (each crosses the C ABI as a double).
enum class ParamType { U32, F32, F64, Flag, Fidelity, GeluKind };

struct Operand {
  const char* name;
  OperandKind kind;
  bool optional = false;
};

struct Param {
  const char* name;
  ParamType type;
  // Set by the calling mesh from its profile (linear's matmul numerics), not an argument of
  // the op's MeshOps method: the Rust method generated from this table leaves it out.
  bool from_profile = false;
};

struct OpArgs;
class Call;

// One fine op as the op table (core/op_table.cpp) declares it. `rule` checks the shapes the
// declaration cannot say (refusing with Call::refuse), may set the rope tables, and returns
// each result's metadata.
struct OpDecl {
  const char* name;
  // What the op computes, for the MeshOps method generated from this table.
  const char* doc;
  std::vector<Operand> inputs;
  std::vector<Param> params;
  // The name of the op's list of numbers, or null when it takes none.
  const char* list;
  std::vector<const char*> results;
  // One result per list entry (a split), named by `results[0]`.
  bool results_per_list_entry;
  std::vector<Meta> (*rule)(Call& call, OpArgs& args);
};

// The arguments of one fine op call, checked by the core (backends read them by name).
struct OpArgs {
  const OpDecl& op;
  // In the declared order; empty for an absent optional operand.
  std::vector<std::optional<TensorView>> inputs;
  // In the declared order.
  std::vector<double> params;
  std::vector<uint32_t> list;
  // The rope of the rows, for an op whose rule computes it from its positions.
  const RopeTables* rope = nullptr;
  // The result is a copy of input 0 (an all_reduce of a replicated tensor): the core copies
  // it and does not ask the backend.
  bool identity = false;

  const TensorView& in(size_t i) const;
  // An optional operand: null when absent.
  const TensorView* maybe(size_t i) const;
  double param(const char* name) const;
  uint32_t u32(const char* name) const { return static_cast<uint32_t>(param(name)); }
  float f32(const char* name) const { return static_cast<float>(param(name)); }
  bool flag(const char* name) const { return param(name) != 0.0; }
};

// A matmul's numerics (the op linear's parameters).
struct MatmulConfig {
  clef_tt_fidelity fidelity = CLEF_TT_HIFI4;
  // false: a bf16 destination register (the sum rounded to bf16 after every 32 channels).
  bool fp32_dest_acc = true;
  // Activations rounded to bf16 before the product (the device holds bf16 tiles).
  bool bf16_activations = false;
  // Packer L1 accumulation (a ttnn speed knob; no effect on the host backend's numbers).
  bool packer_l1_acc = true;
};

// The gated delta rule's sizes (the op gated_delta_rule's parameters).
struct DeltaSpec {
  uint32_t key_heads = 0;
  uint32_t value_heads = 0;
  uint32_t key_dim = 0;
  uint32_t value_dim = 0;
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

  // A fine op of the op table (clef_tt_op): the results in the declared order. The core has
  // checked every operand, parameter and shape against the declaration and the op's rules.
  virtual std::vector<StoragePtr> op(const OpArgs& args) = 0;

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
