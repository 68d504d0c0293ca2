// The ttnn backend's meshes and transfers: opening the mesh exactly as the Tenstorrent port
// does (spec/tenstorrent.md §1.2), uploads of host-packed tiles without re-quantising,
// downloads, device copies, memory queries. See ttnn_backend.hpp (not compiled here).
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <tt-metalium/bfloat16.hpp>  // bfloat16 (the host element of BFLOAT16 tensors)

#include "core/tile_format.hpp"
#include "ttnn/operations/ccl/all_gather/all_gather.hpp"          // ttnn::all_gather
#include "ttnn/operations/ccl/reduce_scatter/reduce_scatter.hpp"  // ttnn::reduce_scatter
#include "ttnn/operations/core/core.hpp"                          // ttnn::to_layout
#include "ttnn/operations/copy/typecast/typecast.hpp"             // ttnn::typecast
#include "ttnn/operations/data_movement/clone/clone.hpp"          // ttnn::clone
#include "ttnn/operations/data_movement/permute/permute.hpp"      // ttnn::permute
#include "ttnn/operations/data_movement/reshape_view/reshape.hpp" // ttnn::reshape
#include "ttnn/tensor/host_buffer/functions.hpp"                  // host_buffer::get_host_buffer
#include "ttnn_backend.hpp"

namespace clef_tt::ttnn_backend {

using tt::tt_metal::DataType;
using tt::tt_metal::Layout;
using tt::tt_metal::distributed::MeshCoordinate;
using tt::tt_metal::distributed::MeshDevice;
using tt::tt_metal::distributed::MeshShape;

namespace {

// Fabric is configured once per process, before the first mesh opens, and reset after the
// last one closed (the port: FABRIC_1D ... close ... DISABLED).
std::mutex g_fabric_lock;
int g_open_meshes = 0;

void fabric_acquire() {
  std::lock_guard<std::mutex> g(g_fabric_lock);
  if (g_open_meshes++ == 0) {
    // tt_metal/api/tt-metalium/experimental/fabric/fabric.hpp
    on_device("SetFabricConfig(FABRIC_1D)",
              [] { tt::tt_fabric::SetFabricConfig(tt::tt_fabric::FabricConfig::FABRIC_1D); });
  }
}

void fabric_release() noexcept {
  std::lock_guard<std::mutex> g(g_fabric_lock);
  if (--g_open_meshes == 0) {
    try {
      tt::tt_fabric::SetFabricConfig(tt::tt_fabric::FabricConfig::DISABLED);
    } catch (...) {
      // Closing must not throw; the next process resets fabric at open.
    }
  }
}

// ttnn/api/ttnn/distributed/api.hpp: open_mesh_device(MeshShape, l1_small_size,
// trace_region_size, num_command_queues, DispatchCoreConfig, offset, physical ids,
// worker_l1_size).
std::shared_ptr<MeshDevice> open_line(uint32_t cols, const clef_tt_mesh_config& c) {
  return on_device("open_mesh_device", [&] {
    auto m = ttnn::distributed::open_mesh_device(MeshShape(1, cols), c.l1_small_size,
                                                 c.trace_region_size, c.num_command_queues,
                                                 tt::tt_metal::DispatchCoreConfig{});
    m->enable_program_cache();  // mesh_device.hpp
    return m;
  });
}

// A parent mesh (1x4 box): its submeshes close before it, then fabric is reset.
class TtnnParent : public ParentMesh {
 public:
  explicit TtnnParent(std::shared_ptr<MeshDevice> d) : device(std::move(d)) {}
  ~TtnnParent() override {
    try {
      tt::tt_metal::distributed::Synchronize(device.get(), std::nullopt, {});
      ttnn::distributed::close_mesh_device(device);
    } catch (...) {
    }
    fabric_release();
  }
  std::shared_ptr<MeshDevice> device;
};

tt::tt_metal::TensorSpec spec(uint32_t rows, uint32_t cols, DataType dtype, Layout layout) {
  // ttnn/api/ttnn/tensor/tensor_spec.hpp, tensor_layout.hpp
  return tt::tt_metal::TensorSpec(
      ttnn::Shape({1, 1, rows, cols}),
      tt::tt_metal::TensorLayout(dtype, tt::tt_metal::PageConfig(layout), ttnn::DRAM_MEMORY_CONFIG));
}

}  // namespace

tt::tt_metal::MathFidelity math_fidelity(clef_tt_fidelity f) {
  switch (f) {
    case CLEF_TT_LOFI:
      return tt::tt_metal::MathFidelity::LoFi;
    case CLEF_TT_HIFI2:
      return tt::tt_metal::MathFidelity::HiFi2;
    case CLEF_TT_HIFI3:
      return tt::tt_metal::MathFidelity::HiFi3;
    default:
      return tt::tt_metal::MathFidelity::HiFi4;
  }
}

DataType tt_dtype(clef_tt_dtype d) {
  switch (d) {
    case CLEF_TT_BF16:
      return DataType::BFLOAT16;
    case CLEF_TT_BFP8_B:
      return DataType::BFLOAT8_B;
    case CLEF_TT_BFP4_B:
      return DataType::BFLOAT4_B;
    default:
      return DataType::FLOAT32;
  }
}

TtnnStorage::~TtnnStorage() {
  try {
    tensor.deallocate(true);  // tensor.hpp: free the device buffers now
  } catch (...) {
  }
}

const TtnnStorage& storage(const TensorView& t) {
  return static_cast<const TtnnStorage&>(t.storage);
}

StoragePtr wrap(ttnn::Tensor t) { return std::make_unique<TtnnStorage>(std::move(t)); }

TtnnMesh::TtnnMesh(std::shared_ptr<MeshDevice> device, std::shared_ptr<ParentMesh> parent,
                   const clef_tt_mesh_config& config)
    : device_(std::move(device)), parent_(std::move(parent)), config_(config) {}

TtnnMesh::~TtnnMesh() {
  try {
    tt::tt_metal::distributed::Synchronize(device_.get(), std::nullopt, {});
    if (parent_) {
      device_->close();  // a submesh closes before its parent (mesh_device.hpp)
    } else {
      ttnn::distributed::close_mesh_device(device_);
    }
  } catch (...) {
  }
  if (!parent_) fabric_release();
}

DataType TtnnMesh::activation_dtype() const {
  return config_.activation_dtype == CLEF_TT_BF16 ? DataType::BFLOAT16 : DataType::FLOAT32;
}

std::vector<uint32_t> TtnnMesh::device_ids() const {
  std::vector<uint32_t> ids;
  for (auto id : device_->get_device_ids()) ids.push_back(static_cast<uint32_t>(id));
  return ids;
}

std::vector<uint64_t> TtnnMesh::memory() const {
  return on_device("allocator statistics", [&] {
    // tt_metal/api/tt-metalium/allocator.hpp: statistics are per bank; mesh buffers are laid
    // out alike on every device of the mesh.
    auto* alloc = device_->allocator().get();
    auto stats = alloc->get_statistics(tt::tt_metal::BufferType::DRAM);
    uint64_t per_device =
        static_cast<uint64_t>(stats.total_allocated_bytes) *
        alloc->get_num_banks(tt::tt_metal::BufferType::DRAM);
    return std::vector<uint64_t>(config_.cols, per_device);
  });
}

ttnn::Tensor TtnnMesh::upload_rows(uint32_t rows, uint32_t cols,
                                   const std::vector<const float*>& parts, Layout layout,
                                   DataType dtype) {
  std::vector<ttnn::Tensor> shards;
  for (uint32_t d = 0; d < config_.cols; ++d) {
    const float* src = parts[parts.size() == 1 ? 0 : d];
    std::vector<float> values(src, src + static_cast<size_t>(rows) * cols);
    // tensor.hpp: Tensor::from_vector<float>(vector&&, TensorSpec) (a host tensor)
    shards.push_back(ttnn::Tensor::from_vector<float>(
        std::move(values), spec(rows, cols, DataType::FLOAT32, Layout::ROW_MAJOR)));
  }
  // distributed/api.hpp: from_host_shards(shards, mesh shape, shard dim)
  ttnn::Tensor host = ttnn::distributed::from_host_shards(shards, device_->shape(), 3);
  ttnn::Tensor t = host.to_device(device_.get(), ttnn::DRAM_MEMORY_CONFIG);
  if (layout == Layout::TILE) t = ttnn::to_layout(t, Layout::TILE);
  if (dtype != DataType::FLOAT32) t = ttnn::typecast(t, dtype);
  return t;
}

StoragePtr TtnnMesh::upload(const Meta& meta, const std::vector<HostBytes>& parts) {
  return on_device("upload", [&]() -> StoragePtr {
    if (meta.role != CLEF_TT_MATRIX) {
      std::vector<const float*> rows;
      for (const HostBytes& p : parts) rows.push_back(reinterpret_cast<const float*>(p.data));
      bool vector = meta.role == CLEF_TT_VECTOR;
      return wrap(upload_rows(meta.rows, meta.cols, rows, vector ? Layout::ROW_MAJOR : Layout::TILE,
                              vector ? DataType::FLOAT32 : activation_dtype()));
    }
    // Matrices: the host's tile bytes become the tensor's host buffer as they are. Block
    // floats are held by ttnn as uint32 words of packed tiles (its own host conversion and
    // load_tensor do the same); f32 as floats and bf16 as bfloat16 in tile order.
    // tensor.hpp: Tensor(HostBuffer, TensorSpec) wraps the buffer without converting it.
    DataType dtype = tt_dtype(meta.dtype);
    std::vector<ttnn::Tensor> shards;
    for (const HostBytes& p : parts) {
      tt::tt_metal::HostBuffer buffer;
      if (meta.dtype == CLEF_TT_F32) {
        std::vector<float> v(p.bytes / 4);
        std::memcpy(v.data(), p.data, p.bytes);
        buffer = tt::tt_metal::HostBuffer(std::move(v));
      } else if (meta.dtype == CLEF_TT_BF16) {
        std::vector<bfloat16> v(p.bytes / 2);  // tt-metalium/bfloat16.hpp
        std::memcpy(v.data(), p.data, p.bytes);
        buffer = tt::tt_metal::HostBuffer(std::move(v));
      } else {
        std::vector<uint32_t> words(p.bytes / 4);
        std::memcpy(words.data(), p.data, p.bytes);
        buffer = tt::tt_metal::HostBuffer(std::move(words));
      }
      shards.emplace_back(std::move(buffer), spec(meta.rows, meta.cols, dtype, Layout::TILE));
    }
    ttnn::Tensor host = ttnn::distributed::from_host_shards(shards, device_->shape(), 3);
    return wrap(host.to_device(device_.get(), ttnn::DRAM_MEMORY_CONFIG));
  });
}

std::vector<ttnn::Tensor> TtnnMesh::host_shards(const ttnn::Tensor& t) {
  // tensor.hpp: cpu(blocking); distributed/api.hpp: get_device_tensors
  return ttnn::distributed::get_device_tensors(t.cpu(true));
}

void TtnnMesh::download(const TensorView& t, uint32_t device, float* out) {
  on_device("download", [&] {
    const TtnnStorage& s = storage(t);
    ttnn::Tensor rows = s.tensor;
    if (s.paged) {
      // [blocks, kv, 64, d] → [1, 1, blocks*64, kv*d] → the valid rows.
      rows = ttnn::permute(rows, ttsl::SmallVector<int64_t>{0, 2, 1, 3});
      rows = ttnn::reshape(rows, ttnn::Shape({1, 1, rows.logical_shape()[0] * kKvBlock,
                                              s.kv_heads * s.head_dim}));
    }
    if (t.meta.role != CLEF_TT_MATRIX) {
      rows = ttnn::typecast(ttnn::to_layout(rows, Layout::ROW_MAJOR), DataType::FLOAT32);
    }
    // to_vector<float> decodes bf16 / bfp tiles and untilises, in the logical shape
    // (tensor.hpp); a paged cache has whole blocks, of which the first rows are valid.
    std::vector<float> v = host_shards(rows).at(device).to_vector<float>();
    size_t n = static_cast<size_t>(t.meta.rows) * t.meta.cols;
    if (v.size() < n) device_failure("download: the device returned fewer values than the tensor holds");
    std::memcpy(out, v.data(), n * sizeof(float));
  });
}

void TtnnMesh::read_stored(const TensorView& t, uint32_t device, uint8_t* out) {
  if (t.meta.role != CLEF_TT_MATRIX) {
    download(t, device, reinterpret_cast<float*>(out));
    return;
  }
  on_device("read_stored", [&] {
    // host_buffer/functions.hpp: the shard's HostBuffer holds the packed tiles read back.
    ttnn::Tensor shard = host_shards(storage(t).tensor).at(device);
    auto bytes = tt::tt_metal::host_buffer::get_host_buffer(shard).view_bytes();
    std::memcpy(out, bytes.data(), std::min<size_t>(bytes.size(), stored_bytes(t.meta)));
  });
}

uint64_t TtnnMesh::device_bytes(const TensorView& t) {
  // tensor_spec.hpp: bytes of one device's buffer.
  return storage(t).tensor.tensor_spec().compute_packed_buffer_size_bytes() * config_.cols;
}

StoragePtr TtnnMesh::copy(const TensorView& t) {
  return on_device("copy", [&] {
    const TtnnStorage& s = storage(t);
    // data_movement/clone/clone.hpp: a new device buffer with the same values.
    auto out = std::make_unique<TtnnStorage>(ttnn::clone(s.tensor, std::nullopt, std::nullopt, std::nullopt));
    out->paged = s.paged;
    out->kv_heads = s.kv_heads;
    out->head_dim = s.head_dim;
    return StoragePtr(std::move(out));
  });
}

ttnn::Tensor TtnnMesh::page_table(uint32_t first, uint32_t blocks) {
  std::vector<int32_t> ids(blocks);
  for (uint32_t i = 0; i < blocks; ++i) ids[i] = static_cast<int32_t>(first + i);
  std::vector<ttnn::Tensor> shards;
  auto s = tt::tt_metal::TensorSpec(ttnn::Shape({1, blocks}),
                                    tt::tt_metal::TensorLayout(DataType::INT32,
                                                               tt::tt_metal::PageConfig(Layout::ROW_MAJOR),
                                                               ttnn::DRAM_MEMORY_CONFIG));
  for (uint32_t d = 0; d < config_.cols; ++d) {
    shards.push_back(ttnn::Tensor::from_vector<int32_t>(std::vector<int32_t>(ids), s));
  }
  return ttnn::distributed::from_host_shards(shards, device_->shape(), 0)
      .to_device(device_.get(), ttnn::DRAM_MEMORY_CONFIG);
}

ttnn::Tensor TtnnMesh::derived(const TensorView& w, const std::string& key,
                               const std::function<ttnn::Tensor(const ttnn::Tensor&)>& make) {
  const TtnnStorage& s = storage(w);
  for (const auto& [k, t] : s.derived) {
    if (k == key) return t;
  }
  ttnn::Tensor t = make(s.tensor);
  s.derived.emplace_back(key, t);
  return t;
}

ttnn::Tensor TtnnMesh::reduce_all(const ttnn::Tensor& partial) {
  // The port's composite all-reduce: reduce-scatter on the hidden dim, then all-gather, over
  // the mesh's line (cluster axis 1 of a 1xN mesh), 2 links, in f32.
  const char* links_env = std::getenv("CLEF_TT_NUM_LINKS");
  uint32_t links = links_env ? static_cast<uint32_t>(std::strtoul(links_env, nullptr, 10)) : 2;
  const char* ring = std::getenv("CLEF_TT_RING");
  auto topology = ring && std::string(ring) == "1" ? tt::tt_fabric::Topology::Ring
                                                   : tt::tt_fabric::Topology::Linear;
  ttnn::Tensor f32 = partial.dtype() == DataType::FLOAT32 ? partial : ttnn::typecast(partial, DataType::FLOAT32);
  // ccl/reduce_scatter/reduce_scatter.hpp, ccl/all_gather/all_gather.hpp
  ttnn::Tensor scattered = ttnn::reduce_scatter(f32, 3, 1u, std::nullopt, ttnn::DRAM_MEMORY_CONFIG,
                                                std::nullopt, std::nullopt, links, topology);
  return ttnn::all_gather(scattered, 3, 1u, ttnn::DRAM_MEMORY_CONFIG, std::nullopt, std::nullopt,
                          std::nullopt, links, topology);
}

namespace {

class TtnnBackend : public Backend {
 public:
  const char* name() const override { return "ttnn"; }

  uint32_t visible_devices() override {
    return on_device("GetNumAvailableDevices",
                     [] { return static_cast<uint32_t>(tt::tt_metal::GetNumAvailableDevices()); });
  }

  std::unique_ptr<DeviceMesh> open(const clef_tt_mesh_config& config) override {
    fabric_acquire();
    try {
      return std::make_unique<TtnnMesh>(open_line(config.cols, config), nullptr, config);
    } catch (...) {
      fabric_release();
      throw;
    }
  }

  std::shared_ptr<ParentMesh> open_parent(const clef_tt_mesh_config& config) override {
    fabric_acquire();
    try {
      return std::make_shared<TtnnParent>(open_line(config.parent_cols, config));
    } catch (...) {
      fabric_release();
      throw;
    }
  }

  std::unique_ptr<DeviceMesh> open_submesh(const std::shared_ptr<ParentMesh>& parent,
                                           const clef_tt_mesh_config& config) override {
    auto& p = static_cast<TtnnParent&>(*parent);
    auto sub = on_device("create_submesh", [&] {
      // mesh_device.hpp: create_submesh(MeshShape, optional<MeshCoordinate> offset)
      return p.device->create_submesh(MeshShape(1, config.cols), MeshCoordinate(0, config.submesh_offset));
    });
    return std::make_unique<TtnnMesh>(sub, parent, config);
  }
};

}  // namespace

}  // namespace clef_tt::ttnn_backend

namespace clef_tt {

Backend& backend() {
  static ttnn_backend::TtnnBackend b;
  return b;
}

}  // namespace clef_tt
