// C ABI entry points of the ops (clef_tt.h). Each one checks its arguments (handles, roles,
// placements, shapes — the same refusals as clef-device's CPU mesh, naming the op and the
// argument), computes the result's shape and placement, and only then asks the backend to
// compute. Results reach the caller's pointers only when every one of them exists.
#include <string>

#include "call.hpp"
#include "rope.hpp"

using namespace clef_tt;

namespace {

std::string dims(uint32_t rows, uint32_t cols) {
  return std::to_string(rows) + "x" + std::to_string(cols);
}

void same_shape(const Call& call, const clef_tt_tensor& a, const clef_tt_tensor& b) {
  if (a.meta.rows != b.meta.rows || a.meta.cols != b.meta.cols) {
    call.refuse(shape_text(a.meta) + " vs " + shape_text(b.meta));
  }
}

void groups(const Call& call, const clef_tt_tensor& x, uint32_t group) {
  if (group == 0 || x.meta.cols % group != 0) {
    call.refuse(std::to_string(x.meta.cols) + " columns in groups of " + std::to_string(group));
  }
}

}  // namespace

extern "C" {

int clef_tt_linear(clef_tt_mesh* mesh, const clef_tt_tensor* x, const clef_tt_tensor* w,
                   const clef_tt_matmul_config* config, clef_tt_tensor** out) {
  return guarded("linear", [&] {
    Call call(mesh, "linear");
    call.output(out, "out");
    if (config == nullptr) invalid("argument config is null");
    if (config->fidelity > CLEF_TT_HIFI4) invalid("unknown fidelity");
    const clef_tt_tensor& tx = call.activation(x, "x");
    const clef_tt_tensor& tw = call.matrix(w, "w");
    if (tx.meta.cols != tw.meta.rows) {
      call.refuse("input width " + std::to_string(tx.meta.cols) + " vs weight [in " +
                  std::to_string(tw.meta.rows) + ", out " + std::to_string(tw.meta.cols) + "]");
    }
    clef_tt_placement p = tx.meta.placement == CLEF_TT_SHARDED ? CLEF_TT_PARTIAL
                          : call.devices() == 1                ? CLEF_TT_REPLICATED
                                                               : CLEF_TT_SHARDED;
    call.result(call.activation_meta(tx.meta.rows, tw.meta.cols, p),
                call.device().linear(view(tx), view(tw), *config));
    call.publish({out});
  });
}

int clef_tt_all_reduce(clef_tt_mesh* mesh, const clef_tt_tensor* x, clef_tt_tensor** out) {
  return guarded("all_reduce", [&] {
    Call call(mesh, "all_reduce");
    call.output(out, "out");
    const clef_tt_tensor& tx = call.tensor(x, "x");
    if (tx.meta.role != CLEF_TT_ACTIVATION) invalid("argument x: expected an activation");
    if (tx.meta.placement == CLEF_TT_SHARDED) {
      invalid("argument x: expected a partial tensor, got a sharded one");
    }
    Meta m = call.activation_meta(tx.meta.rows, tx.meta.cols, CLEF_TT_REPLICATED);
    if (tx.meta.placement == CLEF_TT_REPLICATED) {
      call.result(m, call.device().copy(view(tx)));
    } else {
      call.result(m, call.device().all_reduce(view(tx)));
    }
    call.publish({out});
  });
}

int clef_tt_split_cols(clef_tt_mesh* mesh, const clef_tt_tensor* x, const uint32_t* widths,
                       uint32_t n, clef_tt_tensor** outs) {
  return guarded("split_cols", [&] {
    Call call(mesh, "split_cols");
    if (outs == nullptr) invalid("output outs is null");
    if (widths == nullptr || n == 0) invalid("argument widths is empty");
    const clef_tt_tensor& tx = call.activation(x, "x");
    std::vector<uint32_t> list(widths, widths + n);
    uint64_t total = 0;
    std::string text;
    for (uint32_t w : list) {
      total += w;
      text += (text.empty() ? "" : ", ") + std::to_string(w);
    }
    bool empty_block = false;
    for (uint32_t w : list) empty_block = empty_block || w == 0;
    if (total != tx.meta.cols || empty_block) {
      call.refuse(std::to_string(tx.meta.cols) + " columns split as [" + text + "]");
    }
    std::vector<StoragePtr> parts = call.device().split_cols(view(tx), list);
    for (uint32_t i = 0; i < n; ++i) {
      call.result(call.activation_meta(tx.meta.rows, list[i], tx.meta.placement),
                  std::move(parts[i]));
    }
    call.publish(outs, n);
  });
}

int clef_tt_add(clef_tt_mesh* mesh, const clef_tt_tensor* a, const clef_tt_tensor* b,
                clef_tt_tensor** out) {
  return guarded("add", [&] {
    Call call(mesh, "add");
    call.output(out, "out");
    const clef_tt_tensor& ta = call.activation(a, "a");
    const clef_tt_tensor& tb = call.activation(b, "b");
    same_shape(call, ta, tb);
    call.result(call.activation_meta(ta.meta.rows, ta.meta.cols, Call::elementwise({&ta, &tb})),
                call.device().add(view(ta), view(tb)));
    call.publish({out});
  });
}

int clef_tt_rms_norm(clef_tt_mesh* mesh, const clef_tt_tensor* x, const clef_tt_tensor* w,
                     uint32_t group, float eps, uint32_t one_plus, clef_tt_tensor** out) {
  return guarded("rms_norm", [&] {
    Call call(mesh, "rms_norm");
    call.output(out, "out");
    const clef_tt_tensor& tx = call.activation(x, "x");
    const clef_tt_tensor& tw = call.vector(w, "w", group);
    groups(call, tx, group);
    call.result(call.activation_meta(tx.meta.rows, tx.meta.cols, tx.meta.placement),
                call.device().rms_norm(view(tx), view(tw), group, eps, one_plus != 0));
    call.publish({out});
  });
}

int clef_tt_swiglu(clef_tt_mesh* mesh, const clef_tt_tensor* gate_up, clef_tt_tensor** out) {
  return guarded("swiglu", [&] {
    Call call(mesh, "swiglu");
    call.output(out, "out");
    const clef_tt_tensor& tx = call.activation(gate_up, "gate_up");
    if (tx.meta.cols % 2 != 0) {
      call.refuse(std::to_string(tx.meta.cols) + " columns are not [gate | up]");
    }
    call.result(call.activation_meta(tx.meta.rows, tx.meta.cols / 2, tx.meta.placement),
                call.device().swiglu(view(tx)));
    call.publish({out});
  });
}

int clef_tt_split_query_gate(clef_tt_mesh* mesh, const clef_tt_tensor* qg, uint32_t heads,
                             uint32_t head_dim, clef_tt_tensor** query, clef_tt_tensor** gate) {
  return guarded("split_query_gate", [&] {
    Call call(mesh, "split_query_gate");
    call.output(query, "query");
    call.output(gate, "gate");
    const clef_tt_tensor& tx = call.activation(qg, "qg");
    if (heads == 0 || head_dim == 0 ||
        static_cast<uint64_t>(heads) * 2 * head_dim != tx.meta.cols) {
      call.refuse(std::to_string(tx.meta.cols) + " columns for " + std::to_string(heads) +
                  " heads of [query | gate] x " + std::to_string(head_dim));
    }
    StoragePair parts = call.device().split_query_gate(view(tx), heads, head_dim);
    Meta m = call.activation_meta(tx.meta.rows, heads * head_dim, tx.meta.placement);
    call.result(m, std::move(parts.first));
    call.result(m, std::move(parts.second));
    call.publish({query, gate});
  });
}

int clef_tt_rope(clef_tt_mesh* mesh, const clef_tt_tensor* x, const clef_tt_rope_spec* spec,
                 const uint32_t* positions, uint32_t rows, clef_tt_tensor** out) {
  return guarded("rope", [&] {
    Call call(mesh, "rope");
    call.output(out, "out");
    if (spec == nullptr) invalid("argument spec is null");
    if (positions == nullptr) invalid("argument positions is null");
    const clef_tt_tensor& tx = call.activation(x, "x");
    if (static_cast<uint64_t>(spec->heads) * spec->head_dim != tx.meta.cols ||
        tx.meta.rows != rows) {
      call.refuse(shape_text(tx.meta) + " for " + std::to_string(rows) + " positions of " +
                  std::to_string(spec->heads) + " heads x " + std::to_string(spec->head_dim));
    }
    if (spec->rotary_dim % 2 != 0 || spec->rotary_dim > spec->head_dim) {
      call.refuse("rotary dim " + std::to_string(spec->rotary_dim) + " of a head of " +
                  std::to_string(spec->head_dim));
    }
    const RopeTables& tables = call.rope_tables(*spec, positions, rows);
    call.result(call.activation_meta(tx.meta.rows, tx.meta.cols, tx.meta.placement),
                call.device().rope(view(tx), tables, spec->heads, spec->head_dim));
    call.publish({out});
  });
}

int clef_tt_append_rows(clef_tt_mesh* mesh, const clef_tt_tensor* cache, const clef_tt_tensor* rows,
                        uint32_t heads, clef_tt_tensor** out) {
  return guarded("append_rows", [&] {
    Call call(mesh, "append_rows");
    call.output(out, "out");
    const clef_tt_tensor& tr = call.activation(rows, "rows");
    const clef_tt_tensor* tc = cache == nullptr ? nullptr : &call.activation(cache, "cache");
    if (tc != nullptr && tc->meta.cols != tr.meta.cols) {
      call.refuse(std::to_string(tc->meta.cols) + " vs " + std::to_string(tr.meta.cols) +
                  " columns");
    }
    if (heads == 0 || tr.meta.cols % heads != 0) {
      call.refuse(std::to_string(tr.meta.cols) + " columns in " + std::to_string(heads) + " heads");
    }
    uint32_t total = tr.meta.rows + (tc == nullptr ? 0 : tc->meta.rows);
    clef_tt_placement p = tc == nullptr ? tr.meta.placement : Call::elementwise({tc, &tr});
    TensorView cache_view = tc == nullptr ? view(tr) : view(*tc);
    call.result(call.activation_meta(total, tr.meta.cols, p),
                call.device().append_rows(tc == nullptr ? nullptr : &cache_view, view(tr), heads));
    call.publish({out});
  });
}

int clef_tt_causal_attention(clef_tt_mesh* mesh, const clef_tt_tensor* q,
                             const clef_tt_tensor* keys, const clef_tt_tensor* values,
                             uint32_t heads, uint32_t kv_heads, uint32_t head_dim,
                             clef_tt_tensor** out) {
  return guarded("causal_attention", [&] {
    Call call(mesh, "causal_attention");
    call.output(out, "out");
    const clef_tt_tensor& tq = call.activation(q, "q");
    const clef_tt_tensor& tk = call.activation(keys, "keys");
    const clef_tt_tensor& tv = call.activation(values, "values");
    uint64_t kvw = static_cast<uint64_t>(kv_heads) * head_dim;
    if (static_cast<uint64_t>(heads) * head_dim != tq.meta.cols || tk.meta.cols != kvw ||
        tv.meta.cols != kvw || tk.meta.rows != tv.meta.rows || tk.meta.rows < tq.meta.rows ||
        kv_heads == 0 || head_dim == 0 || heads % kv_heads != 0) {
      call.refuse("q " + shape_text(tq.meta) + ", k " + shape_text(tk.meta) + ", v " +
                  shape_text(tv.meta) + " for " + std::to_string(heads) + " heads, " +
                  std::to_string(kv_heads) + " kv heads x " + std::to_string(head_dim));
    }
    call.result(
        call.activation_meta(tq.meta.rows, tq.meta.cols, Call::elementwise({&tq, &tk, &tv})),
        call.device().causal_attention(view(tq), view(tk), view(tv), heads, kv_heads, head_dim));
    call.publish({out});
  });
}

int clef_tt_mul_sigmoid(clef_tt_mesh* mesh, const clef_tt_tensor* x, const clef_tt_tensor* gate,
                        clef_tt_tensor** out) {
  return guarded("mul_sigmoid", [&] {
    Call call(mesh, "mul_sigmoid");
    call.output(out, "out");
    const clef_tt_tensor& tx = call.activation(x, "x");
    const clef_tt_tensor& tg = call.activation(gate, "gate");
    same_shape(call, tx, tg);
    call.result(call.activation_meta(tx.meta.rows, tx.meta.cols, Call::elementwise({&tx, &tg})),
                call.device().mul_sigmoid(view(tx), view(tg)));
    call.publish({out});
  });
}

int clef_tt_causal_conv1d_silu(clef_tt_mesh* mesh, const clef_tt_tensor* x, const clef_tt_tensor* w,
                               const clef_tt_tensor* carry, uint32_t kernel, clef_tt_tensor** out,
                               clef_tt_tensor** carry_out) {
  return guarded("causal_conv1d_silu", [&] {
    Call call(mesh, "causal_conv1d_silu");
    call.output(out, "out");
    call.output(carry_out, "carry_out");
    if (kernel < 2) call.refuse("kernel " + std::to_string(kernel) + " (at least 2 taps)");
    const clef_tt_tensor& tx = call.activation(x, "x");
    uint32_t ch = tx.meta.cols;
    const clef_tt_tensor& tw = call.vector(w, "w", static_cast<uint64_t>(ch) * kernel);
    const clef_tt_tensor* tc = carry == nullptr ? nullptr : &call.activation(carry, "carry");
    if (tc != nullptr && (tc->meta.rows != kernel - 1 || tc->meta.cols != ch)) {
      call.refuse("carry " + shape_text(tc->meta) + " for " + dims(kernel - 1, ch));
    }
    clef_tt_placement p = tx.meta.placement == CLEF_TT_REPLICATED && call.devices() == 1
                              ? CLEF_TT_REPLICATED
                              : CLEF_TT_SHARDED;
    TensorView carry_view = view(tc == nullptr ? tx : *tc);
    StoragePair parts = call.device().causal_conv1d_silu(
        view(tx), view(tw), tc == nullptr ? nullptr : &carry_view, kernel);
    call.result(call.activation_meta(tx.meta.rows, ch, p), std::move(parts.first));
    call.result(call.activation_meta(kernel - 1, ch, p), std::move(parts.second));
    call.publish({out, carry_out});
  });
}

int clef_tt_delta_gates(clef_tt_mesh* mesh, const clef_tt_tensor* a, const clef_tt_tensor* b,
                        const clef_tt_tensor* a_log, const clef_tt_tensor* dt_bias,
                        clef_tt_tensor** g, clef_tt_tensor** beta) {
  return guarded("delta_gates", [&] {
    Call call(mesh, "delta_gates");
    call.output(g, "g");
    call.output(beta, "beta");
    const clef_tt_tensor& ta = call.activation(a, "a");
    const clef_tt_tensor& tb = call.activation(b, "b");
    const clef_tt_tensor& tl = call.vector(a_log, "a_log", ta.meta.cols);
    const clef_tt_tensor& td = call.vector(dt_bias, "dt_bias", ta.meta.cols);
    StoragePair parts = call.device().delta_gates(view(ta), view(tb), view(tl), view(td));
    call.result(call.activation_meta(ta.meta.rows, ta.meta.cols, ta.meta.placement),
                std::move(parts.first));
    call.result(call.activation_meta(tb.meta.rows, tb.meta.cols, tb.meta.placement),
                std::move(parts.second));
    call.publish({g, beta});
  });
}

int clef_tt_gated_delta_rule(clef_tt_mesh* mesh, const clef_tt_tensor* qkv, const clef_tt_tensor* g,
                             const clef_tt_tensor* beta, const clef_tt_tensor* state,
                             const clef_tt_delta_spec* spec, clef_tt_tensor** out,
                             clef_tt_tensor** state_out) {
  return guarded("gated_delta_rule", [&] {
    Call call(mesh, "gated_delta_rule");
    call.output(out, "out");
    call.output(state_out, "state_out");
    if (spec == nullptr) invalid("argument spec is null");
    const clef_tt_tensor& tq = call.activation(qkv, "qkv");
    const clef_tt_tensor& tg = call.activation(g, "g");
    const clef_tt_tensor& tb = call.activation(beta, "beta");
    const clef_tt_tensor* ts = state == nullptr ? nullptr : &call.activation(state, "state");
    uint64_t nk = spec->key_heads, nv = spec->value_heads, dk = spec->key_dim, dv = spec->value_dim;
    uint32_t t = tq.meta.rows;
    if (tq.meta.cols != 2 * nk * dk + nv * dv || tg.meta.cols != nv || tb.meta.cols != nv ||
        tg.meta.rows != t || tb.meta.rows != t || nk == 0 || dk == 0 || dv == 0 || nv % nk != 0) {
      call.refuse("qkv " + shape_text(tq.meta) + ", g " + shape_text(tg.meta) + ", beta " +
                  shape_text(tb.meta) + " for " + std::to_string(nk) + " key heads x " +
                  std::to_string(dk) + ", " + std::to_string(nv) + " value heads x " +
                  std::to_string(dv));
    }
    if (ts != nullptr && (ts->meta.rows != nv * dk || ts->meta.cols != dv)) {
      call.refuse("state " + shape_text(ts->meta) + " for " +
                  dims(static_cast<uint32_t>(nv * dk), static_cast<uint32_t>(dv)));
    }
    clef_tt_placement p = call.devices() == 1 ? tq.meta.placement : CLEF_TT_SHARDED;
    TensorView state_view = view(ts == nullptr ? tq : *ts);
    StoragePair parts = call.device().gated_delta_rule(
        view(tq), view(tg), view(tb), ts == nullptr ? nullptr : &state_view, *spec);
    call.result(call.activation_meta(t, static_cast<uint32_t>(nv * dv), p), std::move(parts.first));
    call.result(call.activation_meta(static_cast<uint32_t>(nv * dk), static_cast<uint32_t>(dv), p),
                std::move(parts.second));
    call.publish({out, state_out});
  });
}

int clef_tt_gated_rms_norm(clef_tt_mesh* mesh, const clef_tt_tensor* x, const clef_tt_tensor* z,
                           const clef_tt_tensor* w, uint32_t group, float eps,
                           clef_tt_tensor** out) {
  return guarded("gated_rms_norm", [&] {
    Call call(mesh, "gated_rms_norm");
    call.output(out, "out");
    const clef_tt_tensor& tx = call.activation(x, "x");
    const clef_tt_tensor& tz = call.activation(z, "z");
    same_shape(call, tx, tz);
    const clef_tt_tensor& tw = call.vector(w, "w", group);
    groups(call, tx, group);
    call.result(call.activation_meta(tx.meta.rows, tx.meta.cols, Call::elementwise({&tx, &tz})),
                call.device().gated_rms_norm(view(tx), view(tz), view(tw), group, eps));
    call.publish({out});
  });
}

int clef_tt_layer_norm(clef_tt_mesh* mesh, const clef_tt_tensor* x, const clef_tt_tensor* w,
                       const clef_tt_tensor* b, float eps, clef_tt_tensor** out) {
  return guarded("layer_norm", [&] {
    Call call(mesh, "layer_norm");
    call.output(out, "out");
    const clef_tt_tensor& tx = call.activation(x, "x");
    const clef_tt_tensor& tw = call.vector(w, "w", tx.meta.cols);
    const clef_tt_tensor& tb = call.vector(b, "b", tx.meta.cols);
    call.result(call.activation_meta(tx.meta.rows, tx.meta.cols, tx.meta.placement),
                call.device().layer_norm(view(tx), view(tw), view(tb), eps));
    call.publish({out});
  });
}

int clef_tt_add_bias(clef_tt_mesh* mesh, const clef_tt_tensor* x, const clef_tt_tensor* b,
                     clef_tt_tensor** out) {
  return guarded("add_bias", [&] {
    Call call(mesh, "add_bias");
    call.output(out, "out");
    const clef_tt_tensor& tx = call.activation(x, "x");
    const clef_tt_tensor& tb = call.vector(b, "b", tx.meta.cols);
    call.result(call.activation_meta(tx.meta.rows, tx.meta.cols, tx.meta.placement),
                call.device().add_bias(view(tx), view(tb)));
    call.publish({out});
  });
}

int clef_tt_gelu(clef_tt_mesh* mesh, const clef_tt_tensor* x, clef_tt_gelu_kind kind,
                 clef_tt_tensor** out) {
  return guarded("gelu", [&] {
    Call call(mesh, "gelu");
    call.output(out, "out");
    if (kind != CLEF_TT_GELU_TANH && kind != CLEF_TT_GELU_ERF) invalid("unknown GELU kind");
    const clef_tt_tensor& tx = call.activation(x, "x");
    call.result(call.activation_meta(tx.meta.rows, tx.meta.cols, tx.meta.placement),
                call.device().gelu(view(tx), kind));
    call.publish({out});
  });
}

int clef_tt_rotary(clef_tt_mesh* mesh, const clef_tt_tensor* x, const clef_tt_tensor* cos,
                   const clef_tt_tensor* sin, uint32_t heads, uint32_t head_dim,
                   clef_tt_tensor** out) {
  return guarded("rotary", [&] {
    Call call(mesh, "rotary");
    call.output(out, "out");
    const clef_tt_tensor& tx = call.activation(x, "x");
    const clef_tt_tensor& tc = call.activation(cos, "cos");
    const clef_tt_tensor& ts = call.activation(sin, "sin");
    if (tc.meta.placement != CLEF_TT_REPLICATED || ts.meta.placement != CLEF_TT_REPLICATED) {
      invalid("arguments cos and sin: expected replicated tables");
    }
    if (static_cast<uint64_t>(heads) * head_dim != tx.meta.cols || head_dim % 2 != 0 ||
        head_dim == 0 || tc.meta.rows != tx.meta.rows || tc.meta.cols != head_dim ||
        ts.meta.rows != tx.meta.rows || ts.meta.cols != head_dim) {
      call.refuse(shape_text(tx.meta) + " for " + std::to_string(heads) + " heads x " +
                  std::to_string(head_dim) + " with tables " + shape_text(tc.meta) + " and " +
                  shape_text(ts.meta));
    }
    call.result(call.activation_meta(tx.meta.rows, tx.meta.cols, tx.meta.placement),
                call.device().rotary(view(tx), view(tc), view(ts), heads, head_dim));
    call.publish({out});
  });
}

int clef_tt_segment_attention(clef_tt_mesh* mesh, const clef_tt_tensor* q, const clef_tt_tensor* k,
                              const clef_tt_tensor* v, uint32_t heads, uint32_t head_dim,
                              const uint32_t* segments, uint32_t n, clef_tt_tensor** out) {
  return guarded("segment_attention", [&] {
    Call call(mesh, "segment_attention");
    call.output(out, "out");
    if (segments == nullptr || n == 0) invalid("argument segments is empty");
    const clef_tt_tensor& tq = call.activation(q, "q");
    const clef_tt_tensor& tk = call.activation(k, "k");
    const clef_tt_tensor& tv = call.activation(v, "v");
    std::vector<Segment> list;
    uint32_t next = 0;
    bool tiled = true;
    std::string text;
    for (uint32_t i = 0; i < n; ++i) {
      Segment s{segments[2 * i], segments[2 * i + 1]};
      tiled = tiled && s.start == next && s.end > s.start;
      next = s.end;
      text += (text.empty() ? "" : ", ") + std::to_string(s.start) + ".." + std::to_string(s.end);
      list.push_back(s);
    }
    tiled = tiled && next == tq.meta.rows;
    uint64_t width = static_cast<uint64_t>(heads) * head_dim;
    if (tq.meta.cols != width || tk.meta.cols != width || tv.meta.cols != width ||
        tk.meta.rows != tq.meta.rows || tv.meta.rows != tq.meta.rows || head_dim == 0 || !tiled) {
      call.refuse("q " + shape_text(tq.meta) + ", k " + shape_text(tk.meta) + ", v " +
                  shape_text(tv.meta) + " for " + std::to_string(heads) + " heads x " +
                  std::to_string(head_dim) + ", segments [" + text + "]");
    }
    call.result(
        call.activation_meta(tq.meta.rows, tq.meta.cols, Call::elementwise({&tq, &tk, &tv})),
        call.device().segment_attention(view(tq), view(tk), view(tv), heads, head_dim, list));
    call.publish({out});
  });
}

int clef_tt_fold_rows(clef_tt_mesh* mesh, const clef_tt_tensor* x, uint32_t group,
                      clef_tt_tensor** out) {
  return guarded("fold_rows", [&] {
    Call call(mesh, "fold_rows");
    call.output(out, "out");
    const clef_tt_tensor& tx = call.activation(x, "x");
    if (group == 0 || tx.meta.rows % group != 0) {
      call.refuse(std::to_string(tx.meta.rows) + " rows in groups of " + std::to_string(group));
    }
    call.result(call.activation_meta(tx.meta.rows / group, tx.meta.cols * group, tx.meta.placement),
                call.device().fold_rows(view(tx), group));
    call.publish({out});
  });
}

}  // extern "C"
