// The C ABI's layer-op entry (clef_tt_layer_op in clef_tt.h): one generic call for the layer ops
// a backend implements (a whole sublayer in one call). The core checks what it can know without
// the op: the handles, the caller's result shapes and the rope; the backend checks the op's own
// arguments (throwing invalid) or refuses an op or shape it does not run (CLEF_TT_UNSUPPORTED,
// before computing anything). A new layer op therefore needs no change here: it is written in
// the backend and called from clef-device's MeshOps layer methods.
#include <optional>
#include <string>
#include <vector>

#include "call.hpp"
#include "rope.hpp"

using namespace clef_tt;

extern "C" {

int clef_tt_layer_op(clef_tt_mesh* mesh, const char* op, const clef_tt_tensor* const* inputs,
                     uint32_t n_inputs, const char* params_json, const clef_tt_rope_spec* rope,
                     const uint32_t* positions, uint32_t rows, const clef_tt_result_spec* results,
                     uint32_t n_results, clef_tt_tensor** outs) {
  return guarded("layer_op", [&] {
    Call call(mesh, "layer_op");
    if (op == nullptr || *op == '\0') invalid("argument op is null or empty");
    if (params_json == nullptr) invalid("argument params_json is null");
    if (n_inputs > 0 && inputs == nullptr) invalid("argument inputs is null");
    if (n_results == 0 || results == nullptr) invalid("argument results is null or empty");
    if (outs == nullptr) invalid("output outs is null");
    std::vector<std::optional<TensorView>> views(n_inputs);
    for (uint32_t i = 0; i < n_inputs; ++i) {
      if (inputs[i] == nullptr) continue;
      std::string name = "inputs[" + std::to_string(i) + "]";
      views[i].emplace(view(call.tensor(inputs[i], name.c_str())));
    }
    std::vector<Meta> metas;
    for (uint32_t i = 0; i < n_results; ++i) {
      const clef_tt_result_spec& r = results[i];
      if (r.rows == 0 || r.cols == 0 || r.placement > CLEF_TT_PARTIAL) {
        invalid("results[" + std::to_string(i) + "]: " + std::to_string(r.rows) + "x" +
                std::to_string(r.cols) + " with placement " + std::to_string(r.placement));
      }
      metas.push_back(call.activation_meta(r.rows, r.cols, r.placement));
    }
    const RopeTables* tables = nullptr;
    if (rope != nullptr) {
      if (positions == nullptr) invalid("argument positions is null");
      if (rope->rotary_dim % 2 != 0 || rope->rotary_dim > rope->head_dim) {
        call.refuse("rotary dim " + std::to_string(rope->rotary_dim) + " of a head of " +
                    std::to_string(rope->head_dim));
      }
      tables = &call.rope_tables(*rope, positions, rows);
    }
    std::vector<StoragePtr> made = call.device().layer_op(op, views, params_json, tables);
    if (made.size() != n_results) {
      throw Error(CLEF_TT_INTERNAL, std::string(op) + ": the backend returned " +
                                        std::to_string(made.size()) +
                                        " results, the caller "
                                        "expects " +
                                        std::to_string(n_results));
    }
    for (uint32_t i = 0; i < n_results; ++i) call.result(metas[i], std::move(made[i]));
    call.publish(outs, n_results);
  });
}

}  // extern "C"
