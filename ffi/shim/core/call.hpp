// One C ABI call on a mesh: the exception guard, argument checks with messages that name the
// op and the argument, result placements (the same rules as clef-device's CPU mesh), and the
// hand-over of results (registered together, written to the caller's pointers only once all
// of them exist).
#pragma once

#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "errors.hpp"
#include "handles.hpp"

namespace clef_tt {

// Sets the calling thread's last error (never throws).
void set_last_error(const char* op, const char* message) noexcept;
const char* last_error() noexcept;

// Runs `body`, turning every exception into a status and the thread's last error.
template <class F>
int guarded(const char* op, F&& body) noexcept {
  try {
    body();
    return CLEF_TT_OK;
  } catch (const Error& e) {
    set_last_error(op, e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error(op, "out of memory");
    return CLEF_TT_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(op, e.what());
    return CLEF_TT_INTERNAL;
  } catch (...) {
    set_last_error(op, "unknown exception");
    return CLEF_TT_INTERNAL;
  }
}

const char* role_name(clef_tt_role role);
const char* placement_name(clef_tt_placement placement);
std::string shape_text(const Meta& m);

class Call {
 public:
  // Checks the mesh handle and locks it for the call.
  Call(clef_tt_mesh* mesh, const char* op);

  DeviceMesh& device() { return *mesh_->device; }
  // The rope tables of `positions`, from the mesh's cache when they are the last ones.
  const RopeTables& rope_tables(const clef_tt_rope_spec& spec, const uint32_t* positions,
                                uint32_t rows) {
    return mesh_->rope.get(spec, positions, rows);
  }
  uint32_t devices() const { return mesh_->devices; }

  // A live tensor of this mesh (`name` is the argument's name in messages).
  const clef_tt_tensor& tensor(const clef_tt_tensor* t, const char* name);
  // ... that is an activation and not a partial sum.
  const clef_tt_tensor& activation(const clef_tt_tensor* t, const char* name);
  // ... that is a vector weight (its size is the op rule's to check).
  const clef_tt_tensor& vector(const clef_tt_tensor* t, const char* name);
  const clef_tt_tensor& matrix(const clef_tt_tensor* t, const char* name);
  // An output pointer, checked before any work is done.
  void output(clef_tt_tensor** out, const char* name);

  Meta activation_meta(uint32_t rows, uint32_t cols, clef_tt_placement placement) const;

  // Queue a result; publish() hands all queued results to `outs` (in order).
  void result(const Meta& meta, StoragePtr storage);
  void publish(std::initializer_list<clef_tt_tensor**> outs);
  void publish(clef_tt_tensor** outs, size_t n);

  [[noreturn]] void refuse(const std::string& detail) const;

 private:
  void publish_list(const std::vector<clef_tt_tensor**>& outs);

  clef_tt_mesh* mesh_;
  const char* op_;
  std::unique_lock<std::mutex> guard_;
  std::vector<std::unique_ptr<clef_tt_tensor>> results_;
};

}  // namespace clef_tt
