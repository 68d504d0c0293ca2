// The handles of the C ABI and the process-wide registry of the live ones.
//
// A mesh owns its backend mesh and serialises calls on it; a tensor is its metadata plus the
// backend's storage. Every handle the shim hands out is in the registry until it is freed, so a
// null, freed or foreign handle is refused with a message instead of being dereferenced. Parent
// meshes (a 1x4 box split into 1x2 groups) are opened once and shared by their submeshes.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend.hpp"
#include "rope.hpp"

struct clef_tt_mesh {
  std::mutex lock;  // held for every call on the mesh
  clef_tt_mesh_config config{};
  uint32_t devices = 0;
  // The parent a submesh was taken from (declared first: it is closed after the submesh).
  std::shared_ptr<clef_tt::ParentMesh> parent;
  std::unique_ptr<clef_tt::DeviceMesh> device;
  std::atomic<uint64_t> live{0};
  // The last rope tables computed for this mesh (guarded by `lock`, as every call).
  clef_tt::RopeCache rope;
};

struct clef_tt_tensor {
  clef_tt_mesh* mesh = nullptr;
  clef_tt::Meta meta;
  clef_tt::StoragePtr storage;
};

namespace clef_tt {

inline TensorView view(const clef_tt_tensor& t) { return TensorView{t.meta, *t.storage}; }

class Registry {
 public:
  static Registry& get();

  void add_mesh(clef_tt_mesh* mesh);
  void remove_mesh(clef_tt_mesh* mesh);
  bool has_mesh(const clef_tt_mesh* mesh);

  // Registers all of `tensors` or (on failure) none.
  void add_tensors(const std::vector<clef_tt_tensor*>& tensors);
  // The mesh of a live tensor, or null when `t` is not one.
  clef_tt_mesh* mesh_of(const clef_tt_tensor* t);
  // Unregisters a live tensor; false when `t` is not one.
  bool remove_tensor(const clef_tt_tensor* t);

  // The parent a submesh is taken from: opened on first use, shared while any submesh of it is
  // open. Marks the submesh's columns as taken (refuses taken ones).
  std::shared_ptr<ParentMesh> claim_submesh(const clef_tt_mesh_config& config);
  void release_submesh(const clef_tt_mesh_config& config);
  // A mesh opened directly on devices 0..cols; on a backend with exclusive devices it is
  // refused while another direct mesh or a parent is open (the runtime would abort).
  void claim_direct(const clef_tt_mesh_config& config);
  void release_direct();

 private:
  std::mutex lock_;
  std::unordered_set<const clef_tt_mesh*> meshes_;
  std::unordered_map<const clef_tt_tensor*, clef_tt_mesh*> tensors_;
  uint32_t parent_cols_ = 0;
  std::weak_ptr<ParentMesh> parent_;
  std::set<uint32_t> taken_offsets_;
  uint32_t direct_meshes_ = 0;
};

}  // namespace clef_tt
