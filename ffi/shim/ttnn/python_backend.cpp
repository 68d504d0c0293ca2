// The ttnn backend of the shim: the core's Backend and DeviceMesh (backend.hpp) as calls into
// the Python package clef_tt_ttnn (beside this file), which drives ttnn 0.81.1 through its
// public Python API. The core has checked every argument and computed every result's Meta
// before a call reaches here; this file only marshals: a tensor goes to Python as the pair
// (Meta, the object Python returned for it), scalars and configs as ints, floats and dicts,
// host bytes as memoryviews (copied by Python before the call returns).
//
// The GIL is taken per call (any thread may call); Python exceptions become the shim's errors
// (interpreter.hpp) and never cross the C ABI. Every Python object the shim keeps is released
// with the GIL held: a tensor's device buffers are freed (Mesh.free) when the ABI frees it.
#include <pybind11/stl.h>

#include <cstring>

#include "backend.hpp"
#include "interpreter.hpp"

namespace clef_tt::ttnn_bridge {

namespace {

// A Python object shared by C++ owners, released with the GIL held whatever thread drops it.
using Shared = std::shared_ptr<py::object>;

Shared share(py::object o) {
  return Shared(new py::object(std::move(o)), [](py::object* p) {
    try {
      std::lock_guard<std::recursive_mutex> one(runtime_lock());
      py::gil_scoped_acquire gil;
      delete p;
    } catch (...) {
      // Dropping a reference cannot be reported; the object is leaked rather than crash.
    }
  });
}

py::dict config_dict(const clef_tt_mesh_config& c) {
  py::dict d;
  d["cols"] = c.cols;
  d["parent_cols"] = c.parent_cols;
  d["submesh_offset"] = c.submesh_offset;
  d["num_command_queues"] = c.num_command_queues;
  d["l1_small_size"] = c.l1_small_size;
  d["trace_region_size"] = c.trace_region_size;
  d["activation_dtype"] = static_cast<int>(c.activation_dtype);
  d["kv_dtype"] = static_cast<int>(c.kv_dtype);
  d["gdn_gate_dtype"] = static_cast<int>(c.gdn_gate_dtype);
  d["gdn_state_dtype"] = static_cast<int>(c.gdn_state_dtype);
  return d;
}

py::object meta_object(const Meta& m) {
  static py::object* cls = nullptr;  // clef_tt_ttnn.Meta, kept for the process
  if (cls == nullptr) cls = new py::object(py::module_::import("clef_tt_ttnn").attr("Meta"));
  return (*cls)(m.rows, m.cols, m.devices, static_cast<int>(m.dtype), static_cast<int>(m.layout),
                static_cast<int>(m.role), static_cast<int>(m.placement));
}

// One ABI tensor: the object clef_tt_ttnn returned for it.
class PyStorage : public Storage {
 public:
  PyStorage(Shared mesh, py::object obj) : mesh_(std::move(mesh)), obj_(share(std::move(obj))) {}

  ~PyStorage() override {
    try {
      std::lock_guard<std::recursive_mutex> one(runtime_lock());
      py::gil_scoped_acquire gil;
      // The device buffers go now, not at Python's next collection.
      mesh_->attr("free")(py::none(), *obj_);
    } catch (...) {
      // A failed free leaves the buffers to Python's collector; nothing can be reported here.
    }
  }

  // The result must be what the core promises (per-device shape, placement, dtype class).
  void bind(const Meta& meta) override {
    with_python("result check", [&] {
      py::object pair = arg(meta);
      mesh_->attr("check")(pair[py::int_(0)], *obj_);
    });
  }

  const py::object& obj() const { return *obj_; }

  // The (Meta, object) pair Python receives for this tensor under `meta` (GIL held). Made once
  // and kept: a tensor's Meta does not change, and a new Meta per argument per call was ~2 ms
  // of a Clef 27B chunk's host time (~1,300 arguments).
  py::object arg(const Meta& meta) const {
    if (!arg_ || !same(arg_meta_, meta)) {
      arg_ = share(py::make_tuple(meta_object(meta), *obj_));
      arg_meta_ = meta;
    }
    return *arg_;
  }

 private:
  static bool same(const Meta& a, const Meta& b) {
    return a.rows == b.rows && a.cols == b.cols && a.devices == b.devices && a.dtype == b.dtype &&
           a.layout == b.layout && a.role == b.role && a.placement == b.placement;
  }

  Shared mesh_;
  Shared obj_;
  mutable Shared arg_;
  mutable Meta arg_meta_;
};

const PyStorage& storage(const TensorView& t) { return static_cast<const PyStorage&>(t.storage); }

py::object arg(const TensorView& t) { return storage(t).arg(t.meta); }

py::object optional_arg(const TensorView* t) {
  return t == nullptr ? py::object(py::none()) : py::object(arg(*t));
}

py::bytes float_bytes(const std::vector<float>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// The bytes object `b` copied into `out`, which holds exactly `want` bytes.
void copy_out(const char* op, const py::object& b, uint8_t* out, uint64_t want) {
  std::string_view data = py::cast<std::string_view>(py::bytes(b));
  if (data.size() != want) {
    throw Error(CLEF_TT_INTERNAL, std::string(op) + ": clef_tt_ttnn returned " +
                                      std::to_string(data.size()) + " bytes, expected " +
                                      std::to_string(want));
  }
  std::memcpy(out, data.data(), want);
}

// A download's values into `out` (`n` floats) from a C-contiguous buffer of f32 values (4-byte
// items) or of bf16 bit patterns (2-byte items, widened here in one pass: a bf16 is the top
// half of the f32 of the same value).
void copy_floats_out(const char* op, const py::object& b, float* out, uint64_t n) {
  py::buffer_info info = py::buffer(b).request();
  bool contiguous = info.ndim == 1 && info.strides[0] == info.itemsize;
  uint64_t count = static_cast<uint64_t>(info.size);
  if (!contiguous || count != n || (info.itemsize != 4 && info.itemsize != 2)) {
    throw Error(CLEF_TT_INTERNAL, std::string(op) + ": clef_tt_ttnn returned " +
                                      std::to_string(count) + " values of " +
                                      std::to_string(info.itemsize) +
                                      " bytes (1-D, contiguous), expected " + std::to_string(n) +
                                      " f32 or bf16 values");
  }
  if (info.itemsize == 4) {
    std::memcpy(out, info.ptr, n * sizeof(float));
    return;
  }
  const uint16_t* bits = static_cast<const uint16_t*>(info.ptr);
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t wide = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(out + i, &wide, sizeof(float));
  }
}

class PyParent : public ParentMesh {
 public:
  explicit PyParent(Shared parent) : parent(std::move(parent)) {}
  ~PyParent() override {
    try {
      std::lock_guard<std::recursive_mutex> one(runtime_lock());
      py::gil_scoped_acquire gil;
      parent->attr("close")();
    } catch (...) {
      // Closing must not throw; the next process resets the chips at open.
    }
  }
  Shared parent;
};

class PyMesh : public DeviceMesh {
 public:
  explicit PyMesh(py::object mesh) : mesh_(share(std::move(mesh))) {}

  ~PyMesh() override {
    try {
      std::lock_guard<std::recursive_mutex> one(runtime_lock());
      py::gil_scoped_acquire gil;
      mesh_->attr("close")();
    } catch (...) {
      // As ~PyParent.
    }
  }

  std::vector<uint32_t> device_ids() const override {
    return with_python(
        "device_ids", [&] { return py::cast<std::vector<uint32_t>>(mesh_->attr("device_ids")()); });
  }

  std::vector<uint64_t> memory() const override {
    return with_python("memory",
                       [&] { return py::cast<std::vector<uint64_t>>(mesh_->attr("memory")()); });
  }

  std::string describe() override {
    return with_python("describe", [&] {
      return py::cast<std::string>(
          py::module_::import("json").attr("dumps")(mesh_->attr("describe")()));
    });
  }

  std::string take_op_stats() override {
    return with_python("op_stats", [&] {
      py::object stats = mesh_->attr("op_stats")();
      mesh_->attr("reset_op_stats")();
      return py::cast<std::string>(py::module_::import("json").attr("dumps")(stats));
    });
  }

  std::string command(const std::string& request_json) override {
    return with_python("command", [&] {
      py::module_ json = py::module_::import("json");
      py::object answer = mesh_->attr("command")(json.attr("loads")(request_json));
      return py::cast<std::string>(json.attr("dumps")(answer));
    });
  }

  StoragePtr upload(const Meta& meta, const std::vector<HostBytes>& parts) override {
    return one_result("upload", [&] {
      py::list views;
      for (const HostBytes& p : parts) {
        views.append(py::memoryview::from_memory(p.data, static_cast<ssize_t>(p.bytes)));
      }
      return mesh_->attr("upload")(meta_object(meta), views);
    });
  }

  StoragePtr allocate(const Meta& meta) override {
    return one_result("allocate", [&] { return mesh_->attr("allocate")(meta_object(meta)); });
  }

  void download(const TensorView& t, uint32_t device, float* out) override {
    with_python("download", [&] {
      py::object b = mesh_->attr("download_values")(meta_object(t.meta), storage(t).obj(), device);
      copy_floats_out("download", b, out, static_cast<uint64_t>(t.meta.rows) * t.meta.cols);
    });
  }

  void read_stored(const TensorView& t, uint32_t device, uint8_t* out) override {
    with_python("read_stored", [&] {
      py::object b = mesh_->attr("read_stored")(meta_object(t.meta), storage(t).obj(), device);
      copy_out("read_stored", b, out, stored_bytes(t.meta));
    });
  }

  uint64_t device_bytes(const TensorView& t) override {
    return with_python("device_bytes", [&] {
      return py::cast<uint64_t>(mesh_->attr("device_bytes")(meta_object(t.meta), storage(t).obj()));
    });
  }

  StoragePtr copy(const TensorView& t) override {
    return one_result("copy",
                      [&] { return mesh_->attr("copy")(meta_object(t.meta), storage(t).obj()); });
  }

  // A fine op: the op package's `Mesh.op` with the declared arguments (core/op_table.cpp):
  // the tensors in order (None for an absent optional one), the parameters as a dict in order
  // (ints, floats and bools as declared), the list (or None) and the rope tables (or None).
  std::vector<StoragePtr> op(const OpArgs& a) override {
    return with_python(a.op.name, [&] {
      py::list tensors;
      for (size_t i = 0; i < a.inputs.size(); ++i) tensors.append(optional_arg(a.maybe(i)));
      py::dict params;
      for (size_t i = 0; i < a.op.params.size(); ++i) {
        const Param& p = a.op.params[i];
        switch (p.type) {
          case ParamType::F32:
          case ParamType::F64:
            params[p.name] = a.params[i];
            break;
          case ParamType::Flag:
            params[p.name] = a.params[i] != 0.0;
            break;
          case ParamType::U32:
          case ParamType::Fidelity:
          case ParamType::GeluKind:
            params[p.name] = static_cast<uint32_t>(a.params[i]);
            break;
        }
      }
      py::object list = a.op.list == nullptr ? py::object(py::none()) : py::cast(a.list);
      py::object tables = a.rope == nullptr ? py::object(py::none()) : rope_arg(*a.rope);
      py::object made = mesh_->attr("op")(a.op.name, tensors, params, list, tables);
      // One declared result is the object returned; several (or one per list entry) come as
      // a tuple or list (the core checks their number).
      std::vector<StoragePtr> out;
      if (a.op.results.size() == 1 && !a.op.results_per_list_entry) {
        out.push_back(wrap(made));
      } else {
        for (py::handle r : py::iterable(made)) {
          out.push_back(wrap(py::reinterpret_borrow<py::object>(r)));
        }
      }
      return out;
    });
  }

  std::vector<StoragePtr> layer_op(const std::string& name,
                                   const std::vector<std::optional<TensorView>>& inputs,
                                   const std::string& params_json,
                                   const RopeTables* rope) override {
    return with_python("layer_op", [&] {
      py::list tensors;
      for (const std::optional<TensorView>& t : inputs) {
        tensors.append(t.has_value() ? py::object(arg(*t)) : py::object(py::none()));
      }
      // The JSON text as it is: the package parses each distinct text once.
      py::str params(params_json);
      py::object tables = rope == nullptr ? py::object(py::none()) : rope_arg(*rope);
      py::list made = mesh_->attr("layer_op")(name, tensors, params, tables);
      std::vector<StoragePtr> out;
      for (py::handle r : made) out.push_back(wrap(py::reinterpret_borrow<py::object>(r)));
      return out;
    });
  }

 private:
  StoragePtr wrap(py::object o) { return std::make_unique<PyStorage>(mesh_, std::move(o)); }

  // Rope tables as Python takes them, (rows, half, cos bytes, sin bytes): the same object for
  // the same generation of the mesh's rope cache, so the package finds its device tables by
  // identity instead of hashing the bytes (every attention layer of a chunk passes them).
  py::object rope_arg(const RopeTables& t) {
    if (t.generation != 0 && t.generation == rope_generation_ && rope_tuple_) return *rope_tuple_;
    py::object made = py::make_tuple(t.rows, t.half, float_bytes(t.cos), float_bytes(t.sin));
    rope_tuple_ = share(made);
    rope_generation_ = t.generation;
    return made;
  }

  // One result from `body` (a Python call returning the result's object).
  template <class F>
  StoragePtr one_result(const char* what, F&& body) {
    return with_python(what, [&] { return wrap(body()); });
  }

  Shared mesh_;
  Shared rope_tuple_;
  uint64_t rope_generation_ = 0;
};

class PyBackend : public Backend {
 public:
  const char* name() const override { return "ttnn"; }
  bool exclusive_devices() const override { return true; }

  uint32_t visible_devices() override {
    return with_python("visible_devices", [&] {
      return py::cast<uint32_t>(python_backend().attr("visible_devices")());
    });
  }

  std::string describe() override {
    return with_python("describe", [&] {
      return py::cast<std::string>(
          py::module_::import("json").attr("dumps")(python_backend().attr("describe")()));
    });
  }

  std::unique_ptr<DeviceMesh> open(const clef_tt_mesh_config& config) override {
    return with_python("open", [&] {
      return std::make_unique<PyMesh>(python_backend().attr("open")(config_dict(config)));
    });
  }

  std::shared_ptr<ParentMesh> open_parent(const clef_tt_mesh_config& config) override {
    return with_python("open_parent", [&] {
      return std::make_shared<PyParent>(
          share(python_backend().attr("open_parent")(config_dict(config))));
    });
  }

  std::unique_ptr<DeviceMesh> open_submesh(const std::shared_ptr<ParentMesh>& parent,
                                           const clef_tt_mesh_config& config) override {
    return with_python("open_submesh", [&] {
      const auto& p = static_cast<const PyParent&>(*parent);
      return std::make_unique<PyMesh>(
          python_backend().attr("open_submesh")(*p.parent, config_dict(config)));
    });
  }
};

}  // namespace

}  // namespace clef_tt::ttnn_bridge

namespace clef_tt {

Backend& backend() {
  static ttnn_bridge::PyBackend b;
  return b;
}

}  // namespace clef_tt
