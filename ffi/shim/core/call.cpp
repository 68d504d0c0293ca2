// The per-call machinery of the C ABI (see call.hpp).
#include "call.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace clef_tt {

namespace {
thread_local std::string g_last_error;
}  // namespace

void set_last_error(const char* op, const char* message) noexcept {
  try {
    g_last_error = std::string(op) + ": " + message;
  } catch (...) {
    // Out of memory while reporting: keep what fits in the existing buffer.
    try {
      g_last_error.assign("out of memory while reporting an error");
    } catch (...) {
    }
  }
}

const char* last_error() noexcept { return g_last_error.c_str(); }

const char* role_name(clef_tt_role role) {
  switch (role) {
    case CLEF_TT_ACTIVATION:
      return "activation";
    case CLEF_TT_MATRIX:
      return "matrix";
    case CLEF_TT_VECTOR:
      return "vector";
  }
  return "unknown role";
}

const char* placement_name(clef_tt_placement placement) {
  switch (placement) {
    case CLEF_TT_REPLICATED:
      return "replicated";
    case CLEF_TT_SHARDED:
      return "sharded";
    case CLEF_TT_PARTIAL:
      return "partial";
  }
  return "unknown placement";
}

std::string shape_text(const Meta& m) {
  return std::to_string(m.rows) + "x" + std::to_string(m.cols);
}

namespace {

// The fault `CLEF_TT_HANG=op:N`: the N-th call (counted per process, from 1) of the mesh op
// named `op` (as in error messages: "linear", "layer_op", "download", ...) never returns, as a
// call into a chip that stopped answering would not. It holds the mesh's lock, as such a call
// does. For the tests of the server's device deadline; unset, it costs one comparison.
struct HangPoint {
  std::string op;
  uint64_t nth = 0;
  std::atomic<uint64_t> seen{0};

  HangPoint() {
    const char* spec = std::getenv("CLEF_TT_HANG");
    if (spec == nullptr) return;
    std::string text(spec);
    size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0) return;
    try {
      nth = std::stoull(text.substr(colon + 1));
      op = text.substr(0, colon);
    } catch (...) {
      nth = 0;
    }
  }
};

void maybe_hang(const char* op) {
  static HangPoint point;
  if (point.nth == 0 || point.op != op) return;
  if (point.seen.fetch_add(1) + 1 != point.nth) return;
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace

Call::Call(clef_tt_mesh* mesh, const char* op) : mesh_(mesh), op_(op) {
  if (mesh == nullptr) invalid("argument mesh is null");
  if (!Registry::get().has_mesh(mesh)) invalid("argument mesh is not an open mesh");
  guard_ = std::unique_lock<std::mutex>(mesh->lock);
  maybe_hang(op);
}

const clef_tt_tensor& Call::tensor(const clef_tt_tensor* t, const char* name) {
  if (t == nullptr) invalid(std::string("argument ") + name + " is null");
  clef_tt_mesh* owner = Registry::get().mesh_of(t);
  if (owner == nullptr) invalid(std::string("argument ") + name + " is not a live tensor");
  if (owner != mesh_) invalid(std::string("argument ") + name + " belongs to another mesh");
  return *t;
}

const clef_tt_tensor& Call::activation(const clef_tt_tensor* t, const char* name) {
  const clef_tt_tensor& x = tensor(t, name);
  if (x.meta.role != CLEF_TT_ACTIVATION) {
    invalid(std::string("argument ") + name + ": expected an activation, got a " +
            role_name(x.meta.role) + " weight");
  }
  if (x.meta.placement == CLEF_TT_PARTIAL) {
    invalid(std::string("argument ") + name +
            ": expected a complete tensor, got a partial one (all_reduce it first)");
  }
  return x;
}

const clef_tt_tensor& Call::vector(const clef_tt_tensor* t, const char* name) {
  const clef_tt_tensor& w = tensor(t, name);
  if (w.meta.role != CLEF_TT_VECTOR) {
    invalid(std::string("argument ") + name + ": expected a vector weight, got a " +
            (w.meta.role == CLEF_TT_MATRIX ? "matrix weight" : "activation"));
  }
  return w;
}

const clef_tt_tensor& Call::matrix(const clef_tt_tensor* t, const char* name) {
  const clef_tt_tensor& w = tensor(t, name);
  if (w.meta.role != CLEF_TT_MATRIX) {
    invalid(std::string("argument ") + name + ": expected a matrix weight, got a " +
            (w.meta.role == CLEF_TT_VECTOR ? "vector weight" : "activation"));
  }
  return w;
}

void Call::output(clef_tt_tensor** out, const char* name) {
  if (out == nullptr) invalid(std::string("output ") + name + " is null");
}

Meta Call::activation_meta(uint32_t rows, uint32_t cols, clef_tt_placement placement) const {
  Meta m;
  m.rows = rows;
  m.cols = cols;
  m.devices = mesh_->devices;
  m.dtype = CLEF_TT_F32;
  m.layout = CLEF_TT_TILE;
  m.role = CLEF_TT_ACTIVATION;
  m.placement = placement;
  return m;
}

void Call::result(const Meta& meta, StoragePtr storage) {
  auto t = std::make_unique<clef_tt_tensor>();
  t->mesh = mesh_;
  t->meta = meta;
  t->storage = std::move(storage);
  t->storage->bind(meta);
  results_.push_back(std::move(t));
}

void Call::publish(std::initializer_list<clef_tt_tensor**> outs) {
  std::vector<clef_tt_tensor**> list(outs);
  publish_list(list);
}

void Call::publish(clef_tt_tensor** outs, size_t n) {
  std::vector<clef_tt_tensor**> list;
  list.reserve(n);
  for (size_t i = 0; i < n; ++i) list.push_back(&outs[i]);
  publish_list(list);
}

void Call::publish_list(const std::vector<clef_tt_tensor**>& outs) {
  if (outs.size() != results_.size()) {
    throw Error(CLEF_TT_INTERNAL, "results and outputs differ in number");
  }
  std::vector<clef_tt_tensor*> raw;
  raw.reserve(results_.size());
  for (auto& r : results_) raw.push_back(r.get());
  Registry::get().add_tensors(raw);
  // Nothing below can fail: ownership moves to the caller.
  for (size_t i = 0; i < outs.size(); ++i) *outs[i] = results_[i].release();
  mesh_->live += outs.size();
  results_.clear();
}

void Call::refuse(const std::string& detail) const { invalid("shape mismatch: " + detail); }

}  // namespace clef_tt
