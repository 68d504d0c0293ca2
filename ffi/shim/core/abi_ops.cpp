// The C ABI's one entry for the fine ops (clef_tt_op in clef_tt.h). The op's declaration in the
// op table (op_table.cpp) says what to check: the number of operands, parameters and results,
// each operand's handle and role (a null only where it is optional), each parameter's type and
// range, and whether a list is taken. The op's rule then checks its shapes and gives each
// result's metadata; only then does the backend compute. Results reach the caller's pointers
// only when every one of them exists.
#include <cmath>
#include <string>

#include "call.hpp"
#include "op_table.hpp"

using namespace clef_tt;

namespace {

std::string names(const std::vector<Operand>& operands) {
  std::string text;
  for (const Operand& o : operands) text += (text.empty() ? "" : ", ") + std::string(o.name);
  return text;
}

std::string names(const std::vector<Param>& params) {
  std::string text;
  for (const Param& p : params) text += (text.empty() ? "" : ", ") + std::string(p.name);
  return text;
}

// Operand `o`'s handle, checked for its kind.
TensorView operand(Call& call, const Operand& o, const clef_tt_tensor* t) {
  switch (o.kind) {
    case OperandKind::Activation:
      return view(call.activation(t, o.name));
    case OperandKind::PartialSums: {
      const clef_tt_tensor& x = call.tensor(t, o.name);
      if (x.meta.role != CLEF_TT_ACTIVATION) {
        invalid(std::string("argument ") + o.name + ": expected an activation");
      }
      if (x.meta.placement == CLEF_TT_SHARDED) {
        invalid(std::string("argument ") + o.name +
                ": expected a partial tensor, got a sharded one");
      }
      return view(x);
    }
    case OperandKind::Vector:
      return view(call.vector(t, o.name));
    case OperandKind::Matrix:
      return view(call.matrix(t, o.name));
  }
  throw Error(CLEF_TT_INTERNAL, "unknown operand kind");
}

// A parameter's value, checked for its type.
double parameter(const Param& p, double v) {
  auto whole = [&](double max) {
    return std::isfinite(v) && v >= 0 && v <= max && v == std::floor(v);
  };
  bool ok = true;
  switch (p.type) {
    case ParamType::U32:
      ok = whole(4294967295.0);
      break;
    case ParamType::Flag:
      ok = v == 0.0 || v == 1.0;
      break;
    case ParamType::Fidelity:
      if (!whole(CLEF_TT_HIFI4)) invalid("unknown fidelity");
      break;
    case ParamType::GeluKind:
      if (!whole(CLEF_TT_GELU_ERF)) invalid("unknown GELU kind");
      break;
    case ParamType::F32:
    case ParamType::F64:
      break;
  }
  if (!ok) {
    invalid(std::string("parameter ") + p.name + ": " + std::to_string(v) + " is not a " +
            (p.type == ParamType::Flag ? "flag (0 or 1)" : "u32"));
  }
  return v;
}

}  // namespace

extern "C" {

int clef_tt_op(clef_tt_mesh* mesh, const char* op, const clef_tt_tensor* const* inputs,
               uint32_t n_inputs, const double* params, uint32_t n_params, const uint32_t* list,
               uint32_t n_list, clef_tt_tensor** outs, uint32_t n_outs) {
  const OpDecl* decl = find_op(op);
  return guarded(decl == nullptr ? "op" : decl->name, [&] {
    if (decl == nullptr) {
      invalid(std::string("no op named \"") + (op == nullptr ? "(null)" : op) +
              "\" (clef_tt_op_table lists them)");
    }
    Call call(mesh, decl->name);
    if (outs == nullptr) invalid("output outs is null");
    if (n_inputs != decl->inputs.size() || (n_inputs > 0 && inputs == nullptr)) {
      invalid(std::to_string(n_inputs) + " inputs, the op takes " +
              std::to_string(decl->inputs.size()) + " (" + names(decl->inputs) + ")");
    }
    if (n_params != decl->params.size() || (n_params > 0 && params == nullptr)) {
      invalid(std::to_string(n_params) + " parameters, the op takes " +
              std::to_string(decl->params.size()) + " (" + names(decl->params) + ")");
    }
    if (decl->list == nullptr ? n_list != 0 : (n_list > 0 && list == nullptr)) {
      invalid(decl->list == nullptr ? std::string("the op takes no list")
                                    : std::string("argument ") + decl->list + " is null");
    }
    OpArgs args{*decl, {}, {}, {}};
    for (uint32_t i = 0; i < n_inputs; ++i) {
      const Operand& o = decl->inputs[i];
      if (inputs[i] == nullptr && o.optional) {
        args.inputs.emplace_back();
      } else {
        args.inputs.emplace_back(operand(call, o, inputs[i]));
      }
    }
    for (uint32_t i = 0; i < n_params; ++i) {
      args.params.push_back(parameter(decl->params[i], params[i]));
    }
    if (n_list > 0) args.list.assign(list, list + n_list);
    std::vector<Meta> metas = decl->rule(call, args);
    if (metas.size() != n_outs) {
      invalid(std::to_string(n_outs) + " outputs, the op gives " + std::to_string(metas.size()));
    }
    std::vector<StoragePtr> made;
    if (args.identity) {
      made.push_back(call.device().copy(args.in(0)));
    } else {
      made = call.device().op(args);
    }
    if (made.size() != metas.size()) {
      throw Error(CLEF_TT_INTERNAL, "the backend returned " + std::to_string(made.size()) +
                                        " results, the op gives " + std::to_string(metas.size()));
    }
    for (size_t i = 0; i < metas.size(); ++i) call.result(metas[i], std::move(made[i]));
    call.publish(outs, n_outs);
  });
}

}  // extern "C"
