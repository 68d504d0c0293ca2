// The registry of live handles and shared parent meshes (see handles.hpp).
#include "handles.hpp"

#include <string>

#include "errors.hpp"

namespace clef_tt {

Registry& Registry::get() {
  static Registry registry;
  return registry;
}

void Registry::add_mesh(clef_tt_mesh* mesh) {
  std::lock_guard<std::mutex> g(lock_);
  meshes_.insert(mesh);
}

void Registry::remove_mesh(clef_tt_mesh* mesh) {
  std::lock_guard<std::mutex> g(lock_);
  meshes_.erase(mesh);
}

bool Registry::has_mesh(const clef_tt_mesh* mesh) {
  std::lock_guard<std::mutex> g(lock_);
  return meshes_.count(mesh) != 0;
}

void Registry::add_tensors(const std::vector<clef_tt_tensor*>& tensors) {
  std::lock_guard<std::mutex> g(lock_);
  std::vector<clef_tt_tensor*> added;
  try {
    for (clef_tt_tensor* t : tensors) {
      tensors_.emplace(t, t->mesh);
      added.push_back(t);
    }
  } catch (...) {
    for (clef_tt_tensor* t : added) tensors_.erase(t);
    throw;
  }
}

clef_tt_mesh* Registry::mesh_of(const clef_tt_tensor* t) {
  std::lock_guard<std::mutex> g(lock_);
  auto it = tensors_.find(t);
  return it == tensors_.end() ? nullptr : it->second;
}

bool Registry::remove_tensor(const clef_tt_tensor* t) {
  std::lock_guard<std::mutex> g(lock_);
  return tensors_.erase(t) != 0;
}

std::shared_ptr<ParentMesh> Registry::claim_submesh(const clef_tt_mesh_config& config) {
  std::lock_guard<std::mutex> g(lock_);
  std::shared_ptr<ParentMesh> parent = parent_.lock();
  if (parent && parent_cols_ != config.parent_cols) {
    invalid("a 1x" + std::to_string(parent_cols_) + " parent mesh is open; a 1x" +
            std::to_string(config.parent_cols) + " parent cannot be opened beside it");
  }
  if (!parent) taken_offsets_.clear();
  for (uint32_t c = config.submesh_offset; c < config.submesh_offset + config.cols; ++c) {
    if (taken_offsets_.count(c)) {
      invalid("column " + std::to_string(c) + " of the 1x" + std::to_string(config.parent_cols) +
              " parent already belongs to an open submesh");
    }
  }
  if (!parent) {
    if (backend().exclusive_devices() && direct_meshes_ != 0) {
      invalid("a 1x" + std::to_string(config.parent_cols) + " parent cannot be opened while a " +
              "mesh is open on its devices (each device belongs to one mesh in a process)");
    }
    parent = backend().open_parent(config);
    parent_ = parent;
    parent_cols_ = config.parent_cols;
  }
  for (uint32_t c = config.submesh_offset; c < config.submesh_offset + config.cols; ++c) {
    taken_offsets_.insert(c);
  }
  return parent;
}

void Registry::release_submesh(const clef_tt_mesh_config& config) {
  std::lock_guard<std::mutex> g(lock_);
  for (uint32_t c = config.submesh_offset; c < config.submesh_offset + config.cols; ++c) {
    taken_offsets_.erase(c);
  }
}

void Registry::claim_direct(const clef_tt_mesh_config& config) {
  std::lock_guard<std::mutex> g(lock_);
  if (backend().exclusive_devices() && (direct_meshes_ != 0 || !parent_.expired())) {
    invalid("the devices of a 1x" + std::to_string(config.cols) +
            " mesh are open already in this process (each device belongs to one mesh: close "
            "the other first)");
  }
  direct_meshes_ += 1;
}

void Registry::release_direct() {
  std::lock_guard<std::mutex> g(lock_);
  direct_meshes_ -= 1;
}

}  // namespace clef_tt
