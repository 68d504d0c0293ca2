// The ttnn backend of the shim: every op of backend.hpp as ttnn calls on a MeshDevice.
//
// NOT COMPILED HERE: no tt-metal install exists on the machines this was written on. Every
// call is written against the published headers (tenstorrent/tt-metal; the header each one
// comes from is named beside it) and its symbol is checked against the ttnn 0.81.1 wheel's
// _ttnncpp.so / libtt_metal.so by ttnn/check-symbols.sh (listed in ttnn/symbols.txt). Build
// with `cargo build --features tt` (CMake, ffi/shim/CMakeLists.txt) on a Tenstorrent host.
//
// Layout on the device: one ttnn mesh tensor per ABI tensor, distributed over the mesh (one
// shard per device, in mesh order). Activations are [1, 1, rows, cols] TILE tensors in the
// mesh's activation dtype (bf16 for the port's profiles, f32 for the f32 profile), partial sums
// of row-parallel matmuls and DeltaNet gates/states FLOAT32; matrices are [1, 1, in, out] TILE
// tensors built from the host's packed tile bytes; vectors [1, 1, rows, cols] ROW_MAJOR
// FLOAT32. A KV cache made by append_rows is held paged as the port holds it:
// [blocks, kv_heads, 64, head_dim] with an identity page table.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

// tt-metalium (tt_metal/api/tt-metalium/)
#include <tt-metalium/allocator.hpp>                    // Allocator::get_statistics, get_num_banks
#include <tt-metalium/base_types.hpp>                   // MathFidelity
#include <tt-metalium/distributed.hpp>                  // distributed::Synchronize
#include <tt-metalium/experimental/fabric/fabric.hpp>   // tt_fabric::SetFabricConfig, FabricConfig
#include <tt-metalium/host_api.hpp>                     // GetNumAvailableDevices
#include <tt-metalium/mesh_device.hpp>                  // MeshDevice, create_submesh, close
// ttnn (ttnn/api/, ttnn/cpp/)
#include "ttnn/distributed/api.hpp"         // open_mesh_device, close_mesh_device, from_host_shards, get_device_tensors
#include "ttnn/tensor/tensor.hpp"           // Tensor, TensorSpec, TensorLayout, HostBuffer
#include "ttnn/operations/core/compute_kernel/compute_kernel_config.hpp"  // ComputeKernelConfig

#include "backend.hpp"
#include "core/errors.hpp"

namespace clef_tt::ttnn_backend {

// Rows of one page of the paged KV cache (the port's block size).
constexpr uint32_t kKvBlock = 64;

// One ABI tensor on the mesh.
class TtnnStorage : public Storage {
 public:
  explicit TtnnStorage(ttnn::Tensor t) : tensor(std::move(t)) {}
  ~TtnnStorage() override;

  ttnn::Tensor tensor;
  // A KV cache held paged: `tensor` is [blocks, kv_heads, kKvBlock, head_dim], `rows` valid.
  bool paged = false;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  // Per-weight tensors derived once on first use (norm gammas, conv tap rows, -exp(A_log)).
  mutable std::vector<std::pair<std::string, ttnn::Tensor>> derived;
};

const TtnnStorage& storage(const TensorView& t);
tt::tt_metal::MathFidelity math_fidelity(clef_tt_fidelity f);
tt::tt_metal::DataType tt_dtype(clef_tt_dtype d);
StoragePtr wrap(ttnn::Tensor t);

// Runs `body`, turning tt-metal's exceptions (TT_THROW is a std::runtime_error) into device
// errors naming `what`; refusals of the shim itself pass through.
template <class F>
auto on_device(const char* what, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const clef_tt::Error&) {
    throw;
  } catch (const std::exception& e) {
    device_failure(std::string(what) + ": " + e.what());
  }
}

class TtnnMesh : public DeviceMesh {
 public:
  TtnnMesh(std::shared_ptr<tt::tt_metal::distributed::MeshDevice> device,
           std::shared_ptr<ParentMesh> parent, const clef_tt_mesh_config& config);
  ~TtnnMesh() override;

  std::vector<uint32_t> device_ids() const override;
  std::vector<uint64_t> memory() const override;
  StoragePtr upload(const Meta& meta, const std::vector<HostBytes>& parts) override;
  void download(const TensorView& t, uint32_t device, float* out) override;
  void read_stored(const TensorView& t, uint32_t device, uint8_t* out) override;
  uint64_t device_bytes(const TensorView& t) override;
  StoragePtr copy(const TensorView& t) override;

  StoragePtr linear(const TensorView& x, const TensorView& w,
                    const clef_tt_matmul_config& config) override;
  StoragePtr all_reduce(const TensorView& x) override;
  std::vector<StoragePtr> split_cols(const TensorView& x,
                                     const std::vector<uint32_t>& widths) override;
  StoragePtr add(const TensorView& a, const TensorView& b) override;
  StoragePtr rms_norm(const TensorView& x, const TensorView& w, uint32_t group, float eps,
                      bool one_plus) override;
  StoragePtr swiglu(const TensorView& gate_up) override;
  StoragePair split_query_gate(const TensorView& qg, uint32_t heads, uint32_t head_dim) override;
  StoragePtr rope(const TensorView& x, const RopeTables& tables, uint32_t heads,
                  uint32_t head_dim) override;
  StoragePtr append_rows(const TensorView* cache, const TensorView& rows, uint32_t heads) override;
  StoragePtr causal_attention(const TensorView& q, const TensorView& keys,
                              const TensorView& values, uint32_t heads, uint32_t kv_heads,
                              uint32_t head_dim) override;
  StoragePtr mul_sigmoid(const TensorView& x, const TensorView& gate) override;
  StoragePair causal_conv1d_silu(const TensorView& x, const TensorView& w,
                                 const TensorView* carry, uint32_t kernel) override;
  StoragePair delta_gates(const TensorView& a, const TensorView& b, const TensorView& a_log,
                          const TensorView& dt_bias) override;
  StoragePair gated_delta_rule(const TensorView& qkv, const TensorView& g, const TensorView& beta,
                               const TensorView* state, const clef_tt_delta_spec& spec) override;
  StoragePtr gated_rms_norm(const TensorView& x, const TensorView& z, const TensorView& w,
                            uint32_t group, float eps) override;
  StoragePtr layer_norm(const TensorView& x, const TensorView& w, const TensorView& b,
                        float eps) override;
  StoragePtr add_bias(const TensorView& x, const TensorView& b) override;
  StoragePtr gelu(const TensorView& x, clef_tt_gelu_kind kind) override;
  StoragePtr rotary(const TensorView& x, const TensorView& cos, const TensorView& sin,
                    uint32_t heads, uint32_t head_dim) override;
  StoragePtr segment_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                               uint32_t heads, uint32_t head_dim,
                               const std::vector<Segment>& segments) override;
  StoragePtr fold_rows(const TensorView& x, uint32_t group) override;

 private:
  // Host f32 rows, one block per device (or one for all), as a mesh tensor.
  ttnn::Tensor upload_rows(uint32_t rows, uint32_t cols, const std::vector<const float*>& parts,
                           tt::tt_metal::Layout layout, tt::tt_metal::DataType dtype);
  // Per-device host shards of a device tensor.
  std::vector<ttnn::Tensor> host_shards(const ttnn::Tensor& t);
  // A KV tensor in the paged layout (converting a plain [1, 1, rows, kv*d] one).
  ttnn::Tensor paged(const TensorView& t, uint32_t kv_heads, uint32_t head_dim);
  // An identity page table [1, blocks] (int32) on the device.
  ttnn::Tensor page_table(uint32_t first, uint32_t blocks);
  // A vector weight reshaped for an op, derived once and kept with the weight.
  ttnn::Tensor derived(const TensorView& w, const std::string& key,
                       const std::function<ttnn::Tensor(const ttnn::Tensor&)>& make);
  // Reduce-scatter then all-gather over the mesh's line (f32).
  ttnn::Tensor reduce_all(const ttnn::Tensor& partial);

  tt::tt_metal::DataType activation_dtype() const;

  std::shared_ptr<tt::tt_metal::distributed::MeshDevice> device_;
  std::shared_ptr<ParentMesh> parent_;
  clef_tt_mesh_config config_;
};

}  // namespace clef_tt::ttnn_backend
