// The op table: each fine op of the C ABI declared once — what it computes, its tensor
// operands (what each must be, and whether it may be absent), its numeric parameters with
// their types, the one list of numbers it may take, its results, and its shape rule. The
// generic entry (abi_ops.cpp) checks handles, roles, counts and parameter types from the
// declaration before the rule runs; the rule checks the shapes only it knows (refusing with the
// same messages as clef-device's CPU mesh), computes each result's shape and placement (the
// rules of device/src/ops.rs), and may compute the rope tables of the rows. A backend then
// reads its arguments by these names.
//
// A new fine op is one entry here and its maths in each backend (host/host_backend.cpp's table,
// the op package's method of the same name, the CPU mesh's kernel); its MeshOps method is
// generated from this table (device/src/fine_ops.rs; ffi/README.md, "Adding an op").
#include "op_table.hpp"

#include <string>

#include "call.hpp"

namespace clef_tt {

namespace {

using Metas = std::vector<Meta>;
constexpr OperandKind ACT = OperandKind::Activation;
constexpr OperandKind VEC = OperandKind::Vector;
constexpr OperandKind MAT = OperandKind::Matrix;
constexpr OperandKind SUMS = OperandKind::PartialSums;
constexpr ParamType U32 = ParamType::U32;

std::string dims(uint64_t rows, uint64_t cols) {
  return std::to_string(rows) + "x" + std::to_string(cols);
}

const Meta& meta(const OpArgs& a, size_t i) { return a.in(i).meta; }

void same_shape(const Call& call, const Meta& a, const Meta& b) {
  if (a.rows != b.rows || a.cols != b.cols) call.refuse(shape_text(a) + " vs " + shape_text(b));
}

void groups(const Call& call, const Meta& x, uint32_t group) {
  if (group == 0 || x.cols % group != 0) {
    call.refuse(std::to_string(x.cols) + " columns in groups of " + std::to_string(group));
  }
}

// A vector operand holds exactly `values` values.
void values(const OpArgs& a, size_t i, uint64_t values) {
  const Meta& w = meta(a, i);
  uint64_t got = static_cast<uint64_t>(w.rows) * w.cols;
  if (got != values) {
    invalid(std::string("argument ") + a.op.inputs[i].name + ": a weight of " +
            std::to_string(got) + " values, expected " + std::to_string(values));
  }
}

// The placement of an elementwise result: sharded if any input is, else the first's.
clef_tt_placement elementwise(std::initializer_list<const Meta*> inputs) {
  clef_tt_placement placement = (*inputs.begin())->placement;
  for (const Meta* m : inputs) {
    if (m->placement == CLEF_TT_SHARDED) placement = CLEF_TT_SHARDED;
  }
  return placement;
}

// A result of `x`'s shape and placement.
Metas like(const Call& call, const Meta& x) {
  return {call.activation_meta(x.rows, x.cols, x.placement)};
}

Metas linear(Call& call, OpArgs& a) {
  const Meta& x = meta(a, 0);
  const Meta& w = meta(a, 1);
  if (x.cols != w.rows) {
    call.refuse("input width " + std::to_string(x.cols) + " vs weight [in " +
                std::to_string(w.rows) + ", out " + std::to_string(w.cols) + "]");
  }
  clef_tt_placement p = x.placement == CLEF_TT_SHARDED ? CLEF_TT_PARTIAL
                        : call.devices() == 1          ? CLEF_TT_REPLICATED
                                                       : CLEF_TT_SHARDED;
  return {call.activation_meta(x.rows, w.cols, p)};
}

Metas all_reduce(Call& call, OpArgs& a) {
  const Meta& x = meta(a, 0);
  a.identity = x.placement == CLEF_TT_REPLICATED;
  return {call.activation_meta(x.rows, x.cols, CLEF_TT_REPLICATED)};
}

Metas split_cols(Call& call, OpArgs& a) {
  const Meta& x = meta(a, 0);
  if (a.list.empty()) invalid("argument widths is empty");
  uint64_t total = 0;
  bool empty_block = false;
  std::string text;
  for (uint32_t w : a.list) {
    total += w;
    empty_block = empty_block || w == 0;
    text += (text.empty() ? "" : ", ") + std::to_string(w);
  }
  if (total != x.cols || empty_block) {
    call.refuse(std::to_string(x.cols) + " columns split as [" + text + "]");
  }
  Metas out;
  for (uint32_t w : a.list) out.push_back(call.activation_meta(x.rows, w, x.placement));
  return out;
}

// Two operands of one shape, an elementwise result (add, mul_sigmoid).
Metas same_shapes(Call& call, OpArgs& a) {
  same_shape(call, meta(a, 0), meta(a, 1));
  const Meta& x = meta(a, 0);
  return {call.activation_meta(x.rows, x.cols, elementwise({&x, &meta(a, 1)}))};
}

Metas rms_norm(Call& call, OpArgs& a) {
  values(a, 1, a.u32("group"));
  groups(call, meta(a, 0), a.u32("group"));
  return like(call, meta(a, 0));
}

Metas swiglu(Call& call, OpArgs& a) {
  const Meta& x = meta(a, 0);
  if (x.cols % 2 != 0) call.refuse(std::to_string(x.cols) + " columns are not [gate | up]");
  return {call.activation_meta(x.rows, x.cols / 2, x.placement)};
}

Metas split_query_gate(Call& call, OpArgs& a) {
  const Meta& x = meta(a, 0);
  uint32_t heads = a.u32("heads"), head_dim = a.u32("head_dim");
  if (heads == 0 || head_dim == 0 || static_cast<uint64_t>(heads) * 2 * head_dim != x.cols) {
    call.refuse(std::to_string(x.cols) + " columns for " + std::to_string(heads) +
                " heads of [query | gate] x " + std::to_string(head_dim));
  }
  Meta m = call.activation_meta(x.rows, heads * head_dim, x.placement);
  return {m, m};
}

Metas rope(Call& call, OpArgs& a) {
  const Meta& x = meta(a, 0);
  if (a.list.size() % 3 != 0) {
    invalid("argument positions: " + std::to_string(a.list.size()) +
            " numbers, not (t, h, w) per row");
  }
  clef_tt_rope_spec spec{};
  spec.heads = a.u32("heads");
  spec.head_dim = a.u32("head_dim");
  spec.rotary_dim = a.u32("rotary_dim");
  spec.mrope_section[0] = a.u32("section_t");
  spec.mrope_section[1] = a.u32("section_h");
  spec.mrope_section[2] = a.u32("section_w");
  spec.theta = a.param("theta");
  auto rows = static_cast<uint32_t>(a.list.size() / 3);
  if (static_cast<uint64_t>(spec.heads) * spec.head_dim != x.cols || x.rows != rows) {
    call.refuse(shape_text(x) + " for " + std::to_string(rows) + " positions of " +
                std::to_string(spec.heads) + " heads x " + std::to_string(spec.head_dim));
  }
  if (spec.rotary_dim % 2 != 0 || spec.rotary_dim > spec.head_dim) {
    call.refuse("rotary dim " + std::to_string(spec.rotary_dim) + " of a head of " +
                std::to_string(spec.head_dim));
  }
  a.rope = &call.rope_tables(spec, a.list.data(), rows);
  return like(call, x);
}

Metas append_rows(Call& call, OpArgs& a) {
  const Meta* cache = a.maybe(0) == nullptr ? nullptr : &a.maybe(0)->meta;
  const Meta& rows = meta(a, 1);
  uint32_t heads = a.u32("heads");
  if (cache != nullptr && cache->cols != rows.cols) {
    call.refuse(std::to_string(cache->cols) + " vs " + std::to_string(rows.cols) + " columns");
  }
  if (heads == 0 || rows.cols % heads != 0) {
    call.refuse(std::to_string(rows.cols) + " columns in " + std::to_string(heads) + " heads");
  }
  uint32_t total = rows.rows + (cache == nullptr ? 0 : cache->rows);
  clef_tt_placement p = cache == nullptr ? rows.placement : elementwise({cache, &rows});
  return {call.activation_meta(total, rows.cols, p)};
}

Metas causal_attention(Call& call, OpArgs& a) {
  const Meta& q = meta(a, 0);
  const Meta& k = meta(a, 1);
  const Meta& v = meta(a, 2);
  uint32_t heads = a.u32("heads"), kv_heads = a.u32("kv_heads"), head_dim = a.u32("head_dim");
  uint64_t kvw = static_cast<uint64_t>(kv_heads) * head_dim;
  if (static_cast<uint64_t>(heads) * head_dim != q.cols || k.cols != kvw || v.cols != kvw ||
      k.rows != v.rows || k.rows < q.rows || kv_heads == 0 || head_dim == 0 ||
      heads % kv_heads != 0) {
    call.refuse("q " + shape_text(q) + ", k " + shape_text(k) + ", v " + shape_text(v) + " for " +
                std::to_string(heads) + " heads, " + std::to_string(kv_heads) + " kv heads x " +
                std::to_string(head_dim));
  }
  return {call.activation_meta(q.rows, q.cols, elementwise({&q, &k, &v}))};
}

Metas causal_conv1d_silu(Call& call, OpArgs& a) {
  uint32_t kernel = a.u32("kernel");
  if (kernel < 2) call.refuse("kernel " + std::to_string(kernel) + " (at least 2 taps)");
  const Meta& x = meta(a, 0);
  uint32_t ch = x.cols;
  values(a, 1, static_cast<uint64_t>(ch) * kernel);
  const TensorView* carry = a.maybe(2);
  if (carry != nullptr && (carry->meta.rows != kernel - 1 || carry->meta.cols != ch)) {
    call.refuse("carry " + shape_text(carry->meta) + " for " + dims(kernel - 1, ch));
  }
  clef_tt_placement p = x.placement == CLEF_TT_REPLICATED && call.devices() == 1
                            ? CLEF_TT_REPLICATED
                            : CLEF_TT_SHARDED;
  return {call.activation_meta(x.rows, ch, p), call.activation_meta(kernel - 1, ch, p)};
}

Metas delta_gates(Call& call, OpArgs& a) {
  const Meta& ga = meta(a, 0);
  const Meta& gb = meta(a, 1);
  values(a, 2, ga.cols);
  values(a, 3, ga.cols);
  return {call.activation_meta(ga.rows, ga.cols, ga.placement),
          call.activation_meta(gb.rows, gb.cols, gb.placement)};
}

Metas gated_delta_rule(Call& call, OpArgs& a) {
  const Meta& qkv = meta(a, 0);
  const Meta& g = meta(a, 1);
  const Meta& beta = meta(a, 2);
  const TensorView* state = a.maybe(3);
  uint64_t nk = a.u32("key_heads"), nv = a.u32("value_heads"), dk = a.u32("key_dim"),
           dv = a.u32("value_dim");
  uint32_t t = qkv.rows;
  if (qkv.cols != 2 * nk * dk + nv * dv || g.cols != nv || beta.cols != nv || g.rows != t ||
      beta.rows != t || nk == 0 || dk == 0 || dv == 0 || nv % nk != 0) {
    call.refuse("qkv " + shape_text(qkv) + ", g " + shape_text(g) + ", beta " + shape_text(beta) +
                " for " + std::to_string(nk) + " key heads x " + std::to_string(dk) + ", " +
                std::to_string(nv) + " value heads x " + std::to_string(dv));
  }
  if (state != nullptr && (state->meta.rows != nv * dk || state->meta.cols != dv)) {
    call.refuse("state " + shape_text(state->meta) + " for " + dims(nv * dk, dv));
  }
  clef_tt_placement p = call.devices() == 1 ? qkv.placement : CLEF_TT_SHARDED;
  return {call.activation_meta(t, static_cast<uint32_t>(nv * dv), p),
          call.activation_meta(static_cast<uint32_t>(nv * dk), static_cast<uint32_t>(dv), p)};
}

Metas gated_rms_norm(Call& call, OpArgs& a) {
  const Meta& x = meta(a, 0);
  const Meta& z = meta(a, 1);
  same_shape(call, x, z);
  values(a, 2, a.u32("group"));
  groups(call, x, a.u32("group"));
  return {call.activation_meta(x.rows, x.cols, elementwise({&x, &z}))};
}

Metas layer_norm(Call& call, OpArgs& a) {
  values(a, 1, meta(a, 0).cols);
  values(a, 2, meta(a, 0).cols);
  return like(call, meta(a, 0));
}

Metas add_bias(Call& call, OpArgs& a) {
  values(a, 1, meta(a, 0).cols);
  return like(call, meta(a, 0));
}

Metas same_as_input(Call& call, OpArgs& a) { return like(call, meta(a, 0)); }

Metas rotary(Call& call, OpArgs& a) {
  const Meta& x = meta(a, 0);
  const Meta& c = meta(a, 1);
  const Meta& s = meta(a, 2);
  if (c.placement != CLEF_TT_REPLICATED || s.placement != CLEF_TT_REPLICATED) {
    invalid("arguments cos and sin: expected replicated tables");
  }
  uint32_t heads = a.u32("heads"), head_dim = a.u32("head_dim");
  if (static_cast<uint64_t>(heads) * head_dim != x.cols || head_dim % 2 != 0 || head_dim == 0 ||
      c.rows != x.rows || c.cols != head_dim || s.rows != x.rows || s.cols != head_dim) {
    call.refuse(shape_text(x) + " for " + std::to_string(heads) + " heads x " +
                std::to_string(head_dim) + " with tables " + shape_text(c) + " and " +
                shape_text(s));
  }
  return like(call, x);
}

Metas segment_attention(Call& call, OpArgs& a) {
  const Meta& q = meta(a, 0);
  const Meta& k = meta(a, 1);
  const Meta& v = meta(a, 2);
  if (a.list.empty() || a.list.size() % 2 != 0) {
    invalid("argument segments: " + std::to_string(a.list.size()) +
            " numbers, not one or more (start, end) pairs");
  }
  uint32_t heads = a.u32("heads"), head_dim = a.u32("head_dim");
  uint32_t next = 0;
  bool tiled = true;
  std::string text;
  for (size_t i = 0; i < a.list.size(); i += 2) {
    uint32_t start = a.list[i], end = a.list[i + 1];
    tiled = tiled && start == next && end > start;
    next = end;
    text += (text.empty() ? "" : ", ") + std::to_string(start) + ".." + std::to_string(end);
  }
  tiled = tiled && next == q.rows;
  uint64_t width = static_cast<uint64_t>(heads) * head_dim;
  if (q.cols != width || k.cols != width || v.cols != width || k.rows != q.rows ||
      v.rows != q.rows || head_dim == 0 || !tiled) {
    call.refuse("q " + shape_text(q) + ", k " + shape_text(k) + ", v " + shape_text(v) + " for " +
                std::to_string(heads) + " heads x " + std::to_string(head_dim) + ", segments [" +
                text + "]");
  }
  return {call.activation_meta(q.rows, q.cols, elementwise({&q, &k, &v}))};
}

Metas fold_rows(Call& call, OpArgs& a) {
  const Meta& x = meta(a, 0);
  uint32_t group = a.u32("group");
  if (group == 0 || x.rows % group != 0) {
    call.refuse(std::to_string(x.rows) + " rows in groups of " + std::to_string(group));
  }
  return {call.activation_meta(x.rows / group, x.cols * group, x.placement)};
}

const char* kind_name(OperandKind k) {
  switch (k) {
    case OperandKind::Activation:
      return "activation";
    case OperandKind::PartialSums:
      return "partial_sums";
    case OperandKind::Vector:
      return "vector";
    case OperandKind::Matrix:
      return "matrix";
  }
  return "unknown";
}

const char* type_name(ParamType t) {
  switch (t) {
    case ParamType::U32:
      return "u32";
    case ParamType::F32:
      return "f32";
    case ParamType::F64:
      return "f64";
    case ParamType::Flag:
      return "flag";
    case ParamType::Fidelity:
      return "fidelity";
    case ParamType::GeluKind:
      return "gelu_kind";
  }
  return "unknown";
}

// `text` as a JSON string (the docs hold quotes and non-ASCII UTF-8, no control characters).
std::string json_string(const char* text) {
  std::string out = "\"";
  for (const char* c = text; *c != '\0'; ++c) {
    if (*c == '"' || *c == '\\') out += '\\';
    out += *c;
  }
  return out + "\"";
}

}  // namespace

const std::vector<OpDecl>& op_table() {
  // name, what it computes, operands, parameters, list, results, one result per list entry,
  // rule.
  static const std::vector<OpDecl> table = {
      // The text prefill.
      {"linear",
       "`x · Wᵀ` per device. A replicated `x` against a column-split weight gives a sharded "
       "result; a sharded `x` against a row-split weight gives partial sums. The matmul numerics "
       "are the backend's: the tt mesh sets the four parameters from its profile, the CPU mesh "
       "computes in its own.",
       {{"x", ACT}, {"w", MAT}},
       {{"fidelity", ParamType::Fidelity, true},
        {"fp32_dest_acc", ParamType::Flag, true},
        {"bf16_activations", ParamType::Flag, true},
        {"packer_l1_acc", ParamType::Flag, true}},
       nullptr,
       {"out"},
       false,
       linear},
      {"all_reduce",
       "Sum the per-device partial sums and replicate the result (reduce-scatter followed by "
       "all-gather, as the Tenstorrent port does it). The CPU mesh sums in f32; the ttnn backend "
       "holds the partial sums in the activation dtype (bf16 collectives, as the port). A "
       "replicated `x` stays as it is.",
       {{"x", SUMS}},
       {},
       nullptr,
       {"out"},
       false,
       all_reduce},
      {"split_cols",
       "Split the columns of every device's part into consecutive blocks of the given widths, one "
       "result per width.",
       {{"x", ACT}},
       {},
       "widths",
       {"parts"},
       true,
       split_cols},
      {"add",
       "`a + b` elementwise.",
       {{"a", ACT}, {"b", ACT}},
       {},
       nullptr,
       {"out"},
       false,
       same_shapes},
      {"rms_norm",
       "RMSNorm over groups of `group` consecutive channels: `x / rms(x) * (1 + w)` when "
       "`one_plus`, else `* w`. `w` is a `[group, 1]` weight, the same on every device.",
       {{"x", ACT}, {"w", VEC}},
       {{"group", U32}, {"eps", ParamType::F32}, {"one_plus", ParamType::Flag}},
       nullptr,
       {"out"},
       false,
       rms_norm},
      {"swiglu",
       "`silu(gate) * up` where each device part is `[gate | up]` in two equal halves.",
       {{"gate_up", ACT}},
       {},
       nullptr,
       {"out"},
       false,
       swiglu},
      {"split_query_gate",
       "Split per-head `[query(head_dim) | gate(head_dim)]` columns of `heads` heads into a query "
       "tensor and a gate tensor.",
       {{"qg", ACT}},
       {{"heads", U32}, {"head_dim", U32}},
       nullptr,
       {"query", "gate"},
       false,
       split_query_gate},
      {"rope",
       "Rotate the leading `rotary_dim` channels of each of `heads` heads (partial, interleaved "
       "M-RoPE in the rotate-half layout, base `theta`); `positions` holds a (t, h, w) triple per "
       "row. Frequency slot j follows h if j%3==1 and j<3*section_h, w if j%3==2 and "
       "j<3*section_w, else t.",
       {{"x", ACT}},
       {{"heads", U32},
        {"head_dim", U32},
        {"rotary_dim", U32},
        {"section_t", U32},
        {"section_h", U32},
        {"section_w", U32},
        {"theta", ParamType::F64}},
       "positions",
       {"out"},
       false,
       rope},
      {"append_rows",
       "Append `rows` to a per-device cache of `heads` heads (KV pages, which a backend may hold "
       "paged per head); an absent `cache` starts one from `rows`.",
       {{"cache", ACT, true}, {"rows", ACT}},
       {{"heads", U32}},
       nullptr,
       {"out"},
       false,
       append_rows},
      {"causal_attention",
       "Causal softmax attention of the queries (absolute positions `start..start+T`) over the "
       "cached keys and values (positions `0..start+T`): `heads` query heads over `kv_heads` "
       "key/value heads (GQA) of `head_dim`, scale `head_dim^-0.5`, fp32.",
       {{"q", ACT}, {"keys", ACT}, {"values", ACT}},
       {{"heads", U32}, {"kv_heads", U32}, {"head_dim", U32}},
       nullptr,
       {"out"},
       false,
       causal_attention},
      {"mul_sigmoid",
       "`x * sigmoid(gate)` elementwise.",
       {{"x", ACT}, {"gate", ACT}},
       {},
       nullptr,
       {"out"},
       false,
       same_shapes},
      {"causal_conv1d_silu",
       "Causal depthwise conv over time plus SiLU. `w` is `[channels, kernel]` per device; `carry` "
       "holds the last `kernel-1` inputs of the previous chunk (absent = zeros). Gives the output "
       "and the new carry.",
       {{"x", ACT}, {"w", VEC}, {"carry", ACT, true}},
       {{"kernel", U32}},
       nullptr,
       {"out", "carry_out"},
       false,
       causal_conv1d_silu},
      {"delta_gates",
       "DeltaNet gates: `g = -exp(a_log) * softplus(a + dt_bias)`, `beta = sigmoid(b)`, fp32. "
       "`a_log` and `dt_bias` are `[value_heads, 1]` weights per device.",
       {{"a", ACT}, {"b", ACT}, {"a_log", VEC}, {"dt_bias", VEC}},
       {},
       nullptr,
       {"g", "beta"},
       false,
       delta_gates},
      {"gated_delta_rule",
       "The chunked gated delta rule (q/k L2-normalised inside, q scaled by `key_dim^-0.5`, key "
       "heads shared by consecutive value heads). `qkv` is the conv output `[q | k | v]`; `state` "
       "is `[value_heads * key_dim, value_dim]` per device (absent = zeros). Gives the core output "
       "`[T, value_heads * value_dim]` and the final state.",
       {{"qkv", ACT}, {"g", ACT}, {"beta", ACT}, {"state", ACT, true}},
       {{"key_heads", U32}, {"value_heads", U32}, {"key_dim", U32}, {"value_dim", U32}},
       nullptr,
       {"out", "state_out"},
       false,
       gated_delta_rule},
      {"gated_rms_norm",
       "Gated RMSNorm per group of `group` channels: `w * x / rms(x) * silu(z)` (plain `w`).",
       {{"x", ACT}, {"z", ACT}, {"w", VEC}},
       {{"group", U32}, {"eps", ParamType::F32}},
       nullptr,
       {"out"},
       false,
       gated_rms_norm},
      // The vision tower.
      {"layer_norm",
       "LayerNorm over each row: `(x - mean) / sqrt(var + eps) * w + b`; `w` and `b` are `[cols, "
       "1]` weights, the same on every device.",
       {{"x", ACT}, {"w", VEC}, {"b", VEC}},
       {{"eps", ParamType::F32}},
       nullptr,
       {"out"},
       false,
       layer_norm},
      {"add_bias",
       "Add a bias row to every row. `b` is each device's `[cols, 1]` part: split like the columns "
       "of a sharded `x`, whole for a replicated one.",
       {{"x", ACT}, {"b", VEC}},
       {},
       nullptr,
       {"out"},
       false,
       add_bias},
      {"gelu",
       "GELU elementwise, tanh-approximated or exact (erf) as `kind` says.",
       {{"x", ACT}},
       {{"kind", ParamType::GeluKind}},
       nullptr,
       {"out"},
       false,
       same_as_input},
      {"rotary",
       "Rotate-half rotary embedding over whole heads (`heads` of `head_dim`) with tables `cos`, "
       "`sin` (replicated, `[rows, head_dim]`, the same for every head): `x * cos + rotate_half(x) "
       "* sin`.",
       {{"x", ACT}, {"cos", ACT}, {"sin", ACT}},
       {{"heads", U32}, {"head_dim", U32}},
       nullptr,
       {"out"},
       false,
       rotary},
      {"segment_attention",
       "Bidirectional softmax attention (scale `head_dim^-0.5`, fp32) in which the rows of each "
       "segment attend only to the rows of the same segment (one image, or one pair of video "
       "frames). `q`, `k`, `v` are `[rows, heads * head_dim]` per device; `segments` holds each "
       "segment's first row and end row, the segments covering the rows in order.",
       {{"q", ACT}, {"k", ACT}, {"v", ACT}},
       {{"heads", U32}, {"head_dim", U32}},
       "segments",
       {"out"},
       false,
       segment_attention},
      {"fold_rows",
       "Join every `group` consecutive rows into one row (`[rows, cols]` to `[rows/group, "
       "cols*group]`, a reshape).",
       {{"x", ACT}},
       {{"group", U32}},
       nullptr,
       {"out"},
       false,
       fold_rows},
  };
  return table;
}

const OpDecl* find_op(const char* name) {
  if (name == nullptr) return nullptr;
  for (const OpDecl& op : op_table()) {
    if (std::string(op.name) == name) return &op;
  }
  return nullptr;
}

std::string op_table_json() {
  std::string out = "[";
  for (const OpDecl& op : op_table()) {
    if (out.size() > 1) out += ",";
    out += "{\"name\":\"" + std::string(op.name) + "\",\"inputs\":[";
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const Operand& o = op.inputs[i];
      out += std::string(i ? "," : "") + "{\"name\":\"" + o.name + "\",\"kind\":\"" +
             kind_name(o.kind) + "\",\"optional\":" + (o.optional ? "true" : "false") + "}";
    }
    out += "],\"params\":[";
    for (size_t i = 0; i < op.params.size(); ++i) {
      out += std::string(i ? "," : "") + "{\"name\":\"" + op.params[i].name + "\",\"type\":\"" +
             type_name(op.params[i].type) +
             "\",\"from_profile\":" + (op.params[i].from_profile ? "true" : "false") + "}";
    }
    out += "],\"list\":";
    out += op.list == nullptr ? std::string("null") : "\"" + std::string(op.list) + "\"";
    out += ",\"results\":[";
    for (size_t i = 0; i < op.results.size(); ++i) {
      out += std::string(i ? "," : "") + "\"" + op.results[i] + "\"";
    }
    out += std::string("],\"results_per_list_entry\":") +
           (op.results_per_list_entry ? "true" : "false") + ",\"doc\":" + json_string(op.doc) + "}";
  }
  return out + "]";
}

const TensorView& OpArgs::in(size_t i) const {
  if (i >= inputs.size() || !inputs[i].has_value()) {
    throw Error(CLEF_TT_INTERNAL,
                std::string(op.name) + ": operand " + std::to_string(i) + " read but absent");
  }
  return *inputs[i];
}

const TensorView* OpArgs::maybe(size_t i) const {
  return i < inputs.size() && inputs[i].has_value() ? &*inputs[i] : nullptr;
}

double OpArgs::param(const char* name) const {
  for (size_t i = 0; i < op.params.size() && i < params.size(); ++i) {
    if (std::string(op.params[i].name) == name) return params[i];
  }
  throw Error(CLEF_TT_INTERNAL, std::string(op.name) + " declares no parameter " + name);
}

}  // namespace clef_tt
