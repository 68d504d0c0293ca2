// C ABI entry points of the library, meshes and tensors (clef_tt.h): version and backend,
// mesh open/close with shared parents, upload, download, stored bytes, copy, free. Every entry
// point is noexcept: failures become a status and the thread's last error (call.hpp).
#include <cstring>
#include <string>
#include <utility>

#include "call.hpp"
#include "op_table.hpp"
#include "tile_format.hpp"

using namespace clef_tt;

namespace clef_tt {

uint64_t stored_bytes(const Meta& meta) {
  if (meta.role == CLEF_TT_MATRIX) return packed_bytes(meta.rows, meta.cols, meta.dtype);
  return static_cast<uint64_t>(meta.rows) * meta.cols * 4;
}

}  // namespace clef_tt

namespace {

void check_mesh_config(const clef_tt_mesh_config& c, uint32_t visible) {
  auto text = [](uint32_t n) { return "1x" + std::to_string(n); };
  const std::pair<const char*, clef_tt_dtype> kept[] = {{"activations", c.activation_dtype},
                                                        {"the KV cache", c.kv_dtype},
                                                        {"the DeltaNet gates", c.gdn_gate_dtype},
                                                        {"the DeltaNet state", c.gdn_state_dtype}};
  for (const auto& [what, dtype] : kept) {
    if (dtype != CLEF_TT_F32 && dtype != CLEF_TT_BF16) {
      invalid(std::string(what) + " can be kept in f32 or bf16 only, not " + dtype_name(dtype));
    }
  }
  if (c.cols == 0 || c.cols > CLEF_TT_MAX_DEVICES) {
    invalid("cols " + std::to_string(c.cols) + ": a mesh has 1 to " +
            std::to_string(CLEF_TT_MAX_DEVICES) + " devices");
  }
  uint32_t needed = c.parent_cols == 0 ? c.cols : c.parent_cols;
  if (c.parent_cols != 0) {
    if (c.parent_cols > CLEF_TT_MAX_DEVICES || c.parent_cols % c.cols != 0) {
      invalid("a " + text(c.cols) + " submesh cannot be taken from a " + text(c.parent_cols) +
              " parent");
    }
    if (c.submesh_offset % c.cols != 0 || c.submesh_offset + c.cols > c.parent_cols) {
      invalid("submesh offset " + std::to_string(c.submesh_offset) + " of a " + text(c.cols) +
              " submesh is outside the " + text(c.parent_cols) + " parent");
    }
  } else if (c.submesh_offset != 0) {
    invalid("submesh offset " + std::to_string(c.submesh_offset) + " without a parent mesh");
  }
  if (needed > visible) {
    invalid("a " + text(needed) + " mesh needs " + std::to_string(needed) +
            " devices; this process sees " + std::to_string(visible) + " (" + backend().name() +
            " backend)");
  }
}

// The bytes of one part an upload must carry.
uint64_t upload_bytes(const clef_tt_tensor_desc& d) {
  if (d.layout == CLEF_TT_TILE) return packed_bytes(d.rows, d.cols, d.dtype);
  return static_cast<uint64_t>(d.rows) * d.cols * 4;
}

Meta upload_meta(const clef_tt_tensor_desc& d, uint32_t devices, uint32_t n_parts) {
  if (d.rows == 0 || d.cols == 0) invalid("rows and cols must be positive");
  if (d.dtype > CLEF_TT_BFP4_B) invalid("unknown dtype " + std::to_string(d.dtype));
  if (d.layout > CLEF_TT_TILE) invalid("unknown layout " + std::to_string(d.layout));
  if (d.placement > CLEF_TT_PARTIAL) invalid("unknown placement " + std::to_string(d.placement));
  switch (d.role) {
    case CLEF_TT_MATRIX:
      if (d.layout != CLEF_TT_TILE) invalid("a matrix is uploaded as TILE bytes");
      if (d.placement == CLEF_TT_PARTIAL) invalid("a matrix cannot be partial");
      break;
    case CLEF_TT_ACTIVATION:
    case CLEF_TT_VECTOR:
      if (d.layout != CLEF_TT_ROW_MAJOR || d.dtype != CLEF_TT_F32) {
        invalid(std::string("a ") + role_name(d.role) + " is uploaded as row-major f32, not " +
                dtype_name(d.dtype) + (d.layout == CLEF_TT_TILE ? " tiles" : " rows"));
      }
      if (d.role == CLEF_TT_VECTOR && d.placement == CLEF_TT_PARTIAL) {
        invalid("a vector cannot be partial");
      }
      break;
    default:
      invalid("unknown role " + std::to_string(d.role));
  }
  uint32_t want = d.placement == CLEF_TT_REPLICATED ? 1 : devices;
  if (n_parts != want) {
    invalid(std::to_string(n_parts) + " parts for a " + placement_name(d.placement) +
            " tensor on a mesh of " + std::to_string(devices) + " devices (expected " +
            std::to_string(want) + ")");
  }
  Meta m;
  m.rows = d.rows;
  m.cols = d.cols;
  m.devices = devices;
  m.dtype = d.dtype;
  m.layout = d.role == CLEF_TT_VECTOR ? CLEF_TT_ROW_MAJOR : CLEF_TT_TILE;
  m.role = d.role;
  m.placement = d.placement;
  return m;
}

// `text` and a NUL into `out` (see clef_tt_describe).
void write_text(const std::string& text, char* out, size_t capacity, size_t* len) {
  if (len == nullptr) invalid("output len is null");
  *len = text.size();
  if (out == nullptr || capacity < text.size() + 1) {
    invalid("the output holds " + std::to_string(capacity) + " bytes, the text needs " +
            std::to_string(text.size() + 1));
  }
  std::memcpy(out, text.c_str(), text.size() + 1);
}

// Resolves the device index of a read, checking the capacity.
void check_read(const clef_tt_tensor& t, uint32_t device, const void* out, uint64_t need,
                uint64_t capacity, const char* unit) {
  if (device >= t.meta.devices) {
    invalid("device " + std::to_string(device) + " of a mesh of " + std::to_string(t.meta.devices));
  }
  if (out == nullptr) invalid("output buffer is null");
  if (capacity < need) {
    invalid("the output holds " + std::to_string(capacity) + " " + unit + ", the part needs " +
            std::to_string(need));
  }
}

}  // namespace

extern "C" {

uint32_t clef_tt_abi_version(void) { return CLEF_TT_ABI_VERSION; }

const char* clef_tt_backend(void) { return backend().name(); }

const char* clef_tt_last_error(void) { return last_error(); }

int clef_tt_visible_devices(uint32_t* out) {
  return guarded("visible_devices", [&] {
    if (out == nullptr) invalid("output is null");
    *out = backend().visible_devices();
  });
}

int clef_tt_describe(char* out, size_t capacity, size_t* len) {
  return guarded("describe", [&] { write_text(backend().describe(), out, capacity, len); });
}

int clef_tt_op_table(char* out, size_t capacity, size_t* len) {
  return guarded("op_table", [&] { write_text(op_table_json(), out, capacity, len); });
}

int clef_tt_mesh_open(const clef_tt_mesh_config* config, clef_tt_mesh** out) {
  return guarded("mesh_open", [&] {
    if (config == nullptr) invalid("argument config is null");
    if (out == nullptr) invalid("output out is null");
    check_mesh_config(*config, backend().visible_devices());
    auto mesh = std::make_unique<clef_tt_mesh>();
    mesh->config = *config;
    mesh->devices = config->cols;
    if (config->parent_cols == 0) {
      Registry::get().claim_direct(*config);
      try {
        mesh->device = backend().open(*config);
      } catch (...) {
        Registry::get().release_direct();
        throw;
      }
    } else {
      std::shared_ptr<ParentMesh> parent = Registry::get().claim_submesh(*config);
      try {
        mesh->parent = parent;
        mesh->device = backend().open_submesh(parent, *config);
      } catch (...) {
        Registry::get().release_submesh(*config);
        throw;
      }
    }
    Registry::get().add_mesh(mesh.get());
    *out = mesh.release();
  });
}

int clef_tt_mesh_close(clef_tt_mesh* mesh) {
  return guarded("mesh_close", [&] {
    if (mesh == nullptr) invalid("argument mesh is null");
    if (!Registry::get().has_mesh(mesh)) invalid("argument mesh is not an open mesh");
    {
      std::lock_guard<std::mutex> g(mesh->lock);
      if (mesh->live != 0) {
        invalid(std::to_string(mesh->live.load()) +
                " tensors of the mesh are still alive; free them first");
      }
    }
    Registry::get().remove_mesh(mesh);
    clef_tt_mesh_config config = mesh->config;
    delete mesh;  // closes the backend mesh (and a parent whose last submesh this was)
    if (config.parent_cols != 0) {
      Registry::get().release_submesh(config);
    } else {
      Registry::get().release_direct();
    }
  });
}

int clef_tt_mesh_devices(const clef_tt_mesh* mesh, uint32_t* out) {
  return guarded("mesh_devices", [&] {
    if (out == nullptr) invalid("output is null");
    Call call(const_cast<clef_tt_mesh*>(mesh), "mesh_devices");
    *out = call.devices();
  });
}

int clef_tt_mesh_device_ids(const clef_tt_mesh* mesh, uint32_t* out, uint32_t capacity) {
  return guarded("mesh_device_ids", [&] {
    Call call(const_cast<clef_tt_mesh*>(mesh), "mesh_device_ids");
    std::vector<uint32_t> ids = call.device().device_ids();
    if (out == nullptr || capacity < ids.size()) {
      invalid("the output holds " + std::to_string(capacity) + " ids, the mesh has " +
              std::to_string(ids.size()));
    }
    std::memcpy(out, ids.data(), ids.size() * sizeof(uint32_t));
  });
}

int clef_tt_mesh_memory(const clef_tt_mesh* mesh, uint64_t* bytes_per_device, uint32_t capacity) {
  return guarded("mesh_memory", [&] {
    Call call(const_cast<clef_tt_mesh*>(mesh), "mesh_memory");
    std::vector<uint64_t> bytes = call.device().memory();
    if (bytes_per_device == nullptr || capacity < bytes.size()) {
      invalid("the output holds " + std::to_string(capacity) + " devices, the mesh has " +
              std::to_string(bytes.size()));
    }
    std::memcpy(bytes_per_device, bytes.data(), bytes.size() * sizeof(uint64_t));
  });
}

int clef_tt_mesh_live_tensors(const clef_tt_mesh* mesh, uint64_t* out) {
  return guarded("mesh_live_tensors", [&] {
    if (out == nullptr) invalid("output is null");
    Call call(const_cast<clef_tt_mesh*>(mesh), "mesh_live_tensors");
    *out = mesh->live.load();
  });
}

int clef_tt_mesh_describe(const clef_tt_mesh* mesh, char* out, size_t capacity, size_t* len) {
  return guarded("mesh_describe", [&] {
    Call call(const_cast<clef_tt_mesh*>(mesh), "mesh_describe");
    write_text(call.device().describe(), out, capacity, len);
  });
}

int clef_tt_mesh_take_op_stats(clef_tt_mesh* mesh, char* out, size_t capacity, size_t* len) {
  return guarded("mesh_take_op_stats", [&] {
    Call call(mesh, "mesh_take_op_stats");
    write_text(call.device().take_op_stats(), out, capacity, len);
  });
}

int clef_tt_mesh_command(clef_tt_mesh* mesh, const char* request_json, char* out, size_t capacity,
                         size_t* len) {
  return guarded("mesh_command", [&] {
    Call call(mesh, "mesh_command");
    if (request_json == nullptr) invalid("argument request_json is null");
    write_text(call.device().command(request_json), out, capacity, len);
  });
}

int clef_tt_tensor_upload(clef_tt_mesh* mesh, const clef_tt_tensor_desc* desc,
                          const clef_tt_host_part* parts, uint32_t n_parts, clef_tt_tensor** out) {
  return guarded("upload", [&] {
    Call call(mesh, "upload");
    call.output(out, "out");
    if (desc == nullptr) invalid("argument desc is null");
    if (parts == nullptr) invalid("argument parts is null");
    Meta meta = upload_meta(*desc, call.devices(), n_parts);
    uint64_t want = upload_bytes(*desc);
    std::vector<HostBytes> per_device;
    for (uint32_t d = 0; d < call.devices(); ++d) {
      const clef_tt_host_part& p = parts[n_parts == 1 ? 0 : d];
      if (p.bytes != want) {
        invalid("part " + std::to_string(d) + ": " + std::to_string(p.bytes) + " bytes for a " +
                shape_text(meta) + " " + dtype_name(desc->dtype) + " " +
                (desc->layout == CLEF_TT_TILE ? "tile" : "row-major") + " part, expected " +
                std::to_string(want));
      }
      if (p.data == nullptr) invalid("part " + std::to_string(d) + " has no data");
      per_device.push_back(HostBytes{static_cast<const uint8_t*>(p.data), p.bytes});
    }
    call.result(meta, call.device().upload(meta, per_device));
    call.publish({out});
  });
}

int clef_tt_tensor_allocate(clef_tt_mesh* mesh, const clef_tt_tensor_desc* desc,
                            clef_tt_tensor** out) {
  return guarded("allocate", [&] {
    Call call(mesh, "allocate");
    call.output(out, "out");
    if (desc == nullptr) invalid("argument desc is null");
    uint32_t parts = desc->placement == CLEF_TT_REPLICATED ? 1 : call.devices();
    Meta meta = upload_meta(*desc, call.devices(), parts);
    call.result(meta, call.device().allocate(meta));
    call.publish({out});
  });
}

int clef_tt_tensor_info_get(const clef_tt_tensor* t, clef_tt_tensor_info* out) {
  return guarded("tensor_info", [&] {
    if (out == nullptr) invalid("output is null");
    clef_tt_mesh* mesh = t == nullptr ? nullptr : Registry::get().mesh_of(t);
    if (mesh == nullptr) invalid("argument t is not a live tensor");
    Call call(mesh, "tensor_info");
    const clef_tt_tensor& x = call.tensor(t, "t");
    out->rows = x.meta.rows;
    out->cols = x.meta.cols;
    out->devices = x.meta.devices;
    out->dtype = x.meta.dtype;
    out->layout = x.meta.layout;
    out->role = x.meta.role;
    out->placement = x.meta.placement;
    out->device_bytes = call.device().device_bytes(view(x));
    out->stored_bytes = stored_bytes(x.meta);
  });
}

int clef_tt_tensor_download(const clef_tt_tensor* t, uint32_t device, float* out, size_t capacity) {
  return guarded("download", [&] {
    clef_tt_mesh* mesh = t == nullptr ? nullptr : Registry::get().mesh_of(t);
    if (mesh == nullptr) invalid("argument t is not a live tensor");
    Call call(mesh, "download");
    const clef_tt_tensor& x = call.tensor(t, "t");
    check_read(x, device, out, static_cast<uint64_t>(x.meta.rows) * x.meta.cols, capacity,
               "floats");
    call.device().download(view(x), device, out);
  });
}

int clef_tt_tensor_read_stored(const clef_tt_tensor* t, uint32_t device, void* out,
                               size_t capacity) {
  return guarded("read_stored", [&] {
    clef_tt_mesh* mesh = t == nullptr ? nullptr : Registry::get().mesh_of(t);
    if (mesh == nullptr) invalid("argument t is not a live tensor");
    Call call(mesh, "read_stored");
    const clef_tt_tensor& x = call.tensor(t, "t");
    check_read(x, device, out, stored_bytes(x.meta), capacity, "bytes");
    call.device().read_stored(view(x), device, static_cast<uint8_t*>(out));
  });
}

int clef_tt_tensor_copy(clef_tt_mesh* mesh, const clef_tt_tensor* t, clef_tt_tensor** out) {
  return guarded("copy", [&] {
    Call call(mesh, "copy");
    call.output(out, "out");
    const clef_tt_tensor& x = call.tensor(t, "t");
    call.result(x.meta, call.device().copy(view(x)));
    call.publish({out});
  });
}

int clef_tt_tensor_free(clef_tt_tensor* t) {
  return guarded("free", [&] {
    if (t == nullptr) return;
    clef_tt_mesh* mesh = Registry::get().mesh_of(t);
    if (mesh == nullptr || !Registry::get().remove_tensor(t)) {
      invalid("argument t is not a live tensor (freed twice?)");
    }
    std::lock_guard<std::mutex> g(mesh->lock);
    delete t;  // the backend releases the device buffers
    mesh->live -= 1;
  });
}

}  // extern "C"
