// The ttnn backend's op bodies, each the ttnn op the Tenstorrent port uses for it (see
// ttnn_backend.hpp; not compiled here). Activations are [1, 1, rows, cols]; per-head work
// reshapes to [1, rows, heads, d] (or permutes to [1, heads, rows, d] for attention) and back.
#include <array>
#include <cmath>

#include "core/tile_format.hpp"
#include "ttnn/operations/copy/typecast/typecast.hpp"                // ttnn::typecast
#include "ttnn/operations/core/core.hpp"                             // ttnn::to_layout
#include "ttnn/operations/data_movement/concat/concat.hpp"           // ttnn::concat
#include "ttnn/operations/creation.hpp"                              // ttnn::zeros
#include "ttnn/operations/data_movement/pad/pad.hpp"                 // ttnn::pad
#include "ttnn/operations/data_movement/permute/permute.hpp"         // ttnn::permute
#include "ttnn/operations/data_movement/repeat/repeat.hpp"           // ttnn::repeat
#include "ttnn/operations/data_movement/reshape_view/reshape.hpp"    // ttnn::reshape
#include "ttnn/operations/data_movement/slice/slice.hpp"             // ttnn::slice
#include "ttnn/operations/eltwise/binary/binary.hpp"                 // ttnn::add, ttnn::multiply
#include "ttnn/operations/eltwise/unary/unary.hpp"                   // sigmoid, silu, exp, neg, softplus, gelu
#include "ttnn/operations/experimental/paged_cache/paged_cache.hpp"  // experimental::paged_fill_cache
#include "ttnn/operations/matmul/matmul.hpp"                         // ttnn::linear, program configs
#include "ttnn/operations/normalization/layernorm/layernorm.hpp"     // ttnn::layer_norm
#include "ttnn/operations/normalization/rmsnorm/rmsnorm.hpp"         // ttnn::rms_norm
#include "ttnn/operations/transformer/chunk_gated_delta_rule/chunk_gated_delta_rule.hpp"
#include "ttnn/operations/transformer/sdpa/sdpa.hpp"                 // (chunked_)scaled_dot_product_attention
#include "ttnn_backend.hpp"

namespace clef_tt::ttnn_backend {

using tt::tt_metal::DataType;
using tt::tt_metal::Layout;

namespace {

uint32_t rows_of(const ttnn::Tensor& t) { return t.logical_shape()[2]; }

// Columns [c0, c1) of a [1, 1, rows, cols] tensor (data_movement/slice/slice.hpp).
ttnn::Tensor cols(const ttnn::Tensor& t, uint32_t c0, uint32_t c1) {
  std::array<uint32_t, 4> begin{0, 0, 0, c0}, end{1, 1, rows_of(t), c1}, step{1, 1, 1, 1};
  return ttnn::slice(t, begin, end, step);
}

// Rows [r0, r1) of a [1, 1, rows, cols] tensor.
ttnn::Tensor rows(const ttnn::Tensor& t, uint32_t r0, uint32_t r1) {
  uint32_t c = t.logical_shape()[3];
  std::array<uint32_t, 4> begin{0, 0, r0, 0}, end{1, 1, r1, c}, step{1, 1, 1, 1};
  return ttnn::slice(t, begin, end, step);
}

// The last-dim slice [c0, c1) of any 4-D tensor.
ttnn::Tensor last(const ttnn::Tensor& t, uint32_t c0, uint32_t c1) {
  auto s = t.logical_shape();
  std::array<uint32_t, 4> begin{0, 0, 0, c0}, end{s[0], s[1], s[2], c1}, step{1, 1, 1, 1};
  return ttnn::slice(t, begin, end, step);
}

ttnn::Tensor shape4(const ttnn::Tensor& t, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return ttnn::reshape(t, ttnn::Shape({a, b, c, d}));
}

// [1, 1, T, H*d] <-> [1, H, T, d] for attention.
ttnn::Tensor heads_first(const ttnn::Tensor& t, uint32_t heads, uint32_t d) {
  return ttnn::permute(shape4(t, 1, rows_of(t), heads, d), ttsl::SmallVector<int64_t>{0, 2, 1, 3});
}
ttnn::Tensor heads_last(const ttnn::Tensor& t) {
  auto s = t.logical_shape();  // [1, H, T, d]
  ttnn::Tensor p = ttnn::permute(t, ttsl::SmallVector<int64_t>{0, 2, 1, 3});
  return shape4(p, 1, 1, s[2], s[1] * s[3]);
}

ttnn::ComputeKernelConfig kernel(clef_tt_fidelity f, bool fp32_acc, bool l1_acc) {
  // operations/core/compute_kernel/compute_kernel_config.hpp
  ttnn::ComputeKernelConfig c{};
  c.math_fidelity = math_fidelity(f);
  c.math_approx_mode = false;
  c.fp32_dest_acc_en = fp32_acc;
  c.packer_l1_acc = l1_acc;
  return c;
}

// HiFi4 with f32 accumulation: attention, norms and the delta rule (the port's choice).
ttnn::ComputeKernelConfig precise() { return kernel(CLEF_TT_HIFI4, true, false); }

// The largest divisor of `n` not above `cap`.
uint32_t divisor(uint32_t n, uint32_t cap) {
  for (uint32_t d = std::min(n, cap); d > 1; --d) {
    if (n % d == 0) return d;
  }
  return 1;
}

// The 2-D multicast program config for a prefill-sized matmul (M >= 128 rows), following the
// port's rules (tp_common.py): a grid of at most 8x8 (the compute grid of a p150 is 11x10;
// here bounded by the device's), per_core_M/N covering the output tiles, in0_block_w a
// divisor of K's tiles up to 4 (8 when both in/out are small), subblocks within the
// destination register (4 tiles with f32 accumulation, else 8). Smaller matmuls are left to
// ttnn's own choice.
std::optional<ttnn::operations::matmul::MatmulProgramConfig> program_config(
    const ttnn::Tensor& x, const ttnn::Tensor& w, tt::tt_metal::CoreCoord grid, bool fp32_acc) {
  uint32_t mt = (rows_of(x) + 31) / 32, kt = (w.logical_shape()[2] + 31) / 32,
           nt = (w.logical_shape()[3] + 31) / 32;
  if (mt < 4) return std::nullopt;
  uint32_t gx = std::min<uint32_t>(8, grid.x), gy = std::min<uint32_t>(8, grid.y);
  gy = std::min(gy, mt);
  gx = std::min(gx, nt);
  uint32_t per_m = (mt + gy - 1) / gy, per_n = (nt + gx - 1) / gx;
  uint32_t dst = fp32_acc ? 4 : 8;
  uint32_t sub_w = divisor(per_n, dst);
  uint32_t sub_h = divisor(per_m, dst / sub_w);
  ttnn::operations::matmul::MatmulMultiCoreReuseMultiCastProgramConfig c{};
  c.compute_with_storage_grid_size = tt::tt_metal::CoreCoord(gx, gy);
  c.in0_block_w = divisor(kt, 4);
  c.out_subblock_h = sub_h;
  c.out_subblock_w = sub_w;
  c.out_block_h = per_m;
  c.out_block_w = per_n;
  c.per_core_M = per_m;
  c.per_core_N = per_n;
  c.transpose_mcast = false;
  c.fuse_batch = true;
  return c;
}

}  // namespace

StoragePtr TtnnMesh::linear(const TensorView& x, const TensorView& w,
                            const clef_tt_matmul_config& config) {
  return on_device("linear", [&] {
    const ttnn::Tensor& xt = storage(x).tensor;
    const ttnn::Tensor& wt = storage(w).tensor;
    // A row-parallel projection (sharded input) leaves partial sums, reduced in f32.
    bool partial = x.meta.placement == CLEF_TT_SHARDED;
    DataType out = partial ? DataType::FLOAT32 : activation_dtype();
    auto ckc = kernel(config.fidelity, config.fp32_dest_acc != 0, config.packer_l1_acc != 0);
    auto pc = program_config(xt, wt, device_->compute_with_storage_grid_size(), config.fp32_dest_acc != 0);
    ttnn::Tensor in = config.bf16_activations && xt.dtype() == DataType::FLOAT32
                          ? ttnn::typecast(xt, DataType::BFLOAT16)
                          : xt;
    // matmul/matmul.hpp: linear(a, b, bias, transpose_a, transpose_b, memory_config, dtype,
    // program_config, activation, compute_kernel_config)
    return wrap(ttnn::linear(in, wt, std::nullopt, false, false, ttnn::DRAM_MEMORY_CONFIG, out, pc,
                             std::nullopt, ckc));
  });
}

StoragePtr TtnnMesh::all_reduce(const TensorView& x) {
  return on_device("all_reduce", [&] {
    ttnn::Tensor sum = reduce_all(storage(x).tensor);
    return wrap(sum.dtype() == activation_dtype() ? sum : ttnn::typecast(sum, activation_dtype()));
  });
}

std::vector<StoragePtr> TtnnMesh::split_cols(const TensorView& x,
                                             const std::vector<uint32_t>& widths) {
  return on_device("split_cols", [&] {
    std::vector<StoragePtr> out;
    uint32_t start = 0;
    for (uint32_t w : widths) {
      out.push_back(wrap(cols(storage(x).tensor, start, start + w)));
      start += w;
    }
    return out;
  });
}

StoragePtr TtnnMesh::add(const TensorView& a, const TensorView& b) {
  return on_device("add", [&] { return wrap(ttnn::add(storage(a).tensor, storage(b).tensor)); });
}

StoragePtr TtnnMesh::rms_norm(const TensorView& x, const TensorView& w, uint32_t group, float eps,
                              bool one_plus) {
  return on_device("rms_norm", [&] {
    // The gamma as rms_norm takes it: [1, 1, group/32, 32] row-major, (1 + w) for the
    // zero-centred norms of Qwen3.5.
    ttnn::Tensor gamma = derived(w, one_plus ? "gamma+1" : "gamma", [&](const ttnn::Tensor& v) {
      ttnn::Tensor g = one_plus ? ttnn::add(v, 1.0f) : v;
      return ttnn::typecast(shape4(g, 1, 1, group / 32, 32), DataType::BFLOAT16);
    });
    const ttnn::Tensor& xt = storage(x).tensor;
    uint32_t t = rows_of(xt), n = x.meta.cols / group;
    // Per-head norms run over [1, T, heads, group]. normalization/rmsnorm/rmsnorm.hpp:
    // rms_norm(x, epsilon, weight, bias, residual, memory_config, program_config, compute).
    ttnn::Tensor in = n == 1 ? xt : shape4(xt, 1, t, n, group);
    ttnn::Tensor y = ttnn::rms_norm(in, eps, gamma, std::nullopt, std::nullopt,
                                    ttnn::DRAM_MEMORY_CONFIG, std::nullopt, precise());
    return wrap(n == 1 ? y : shape4(y, 1, 1, t, x.meta.cols));
  });
}

StoragePtr TtnnMesh::swiglu(const TensorView& gate_up) {
  return on_device("swiglu", [&] {
    const ttnn::Tensor& t = storage(gate_up).tensor;
    uint32_t half = gate_up.meta.cols / 2;
    return wrap(ttnn::multiply(ttnn::silu(cols(t, 0, half)), cols(t, half, 2 * half)));
  });
}

StoragePair TtnnMesh::split_query_gate(const TensorView& qg, uint32_t heads, uint32_t head_dim) {
  return on_device("split_query_gate", [&] {
    const ttnn::Tensor& t = storage(qg).tensor;
    uint32_t rows = rows_of(t);
    ttnn::Tensor per_head = shape4(t, 1, rows, heads, 2 * head_dim);
    auto flat = [&](const ttnn::Tensor& h) { return shape4(h, 1, 1, rows, heads * head_dim); };
    return StoragePair{wrap(flat(last(per_head, 0, head_dim))),
                       wrap(flat(last(per_head, head_dim, 2 * head_dim)))};
  });
}

StoragePtr TtnnMesh::rope(const TensorView& x, const RopeTables& tables, uint32_t heads,
                          uint32_t head_dim) {
  return on_device("rope", [&] {
    // cos/sin of the chunk's positions come from the host (core/rope.cpp), repeated per head
    // so the products need no broadcast: [1, T, heads, half].
    uint32_t t = tables.rows, half = tables.half;
    auto expand = [&](const std::vector<float>& v) {
      std::vector<float> full(static_cast<size_t>(t) * heads * half);
      for (uint32_t r = 0; r < t; ++r) {
        for (uint32_t h = 0; h < heads; ++h) {
          std::copy_n(v.data() + static_cast<size_t>(r) * half, half,
                      full.data() + (static_cast<size_t>(r) * heads + h) * half);
        }
      }
      ttnn::Tensor flat = upload_rows(t, heads * half, {full.data()}, Layout::TILE, activation_dtype());
      return shape4(flat, 1, t, heads, half);
    };
    ttnn::Tensor cos = expand(tables.cos), sin = expand(tables.sin);
    ttnn::Tensor per_head = shape4(storage(x).tensor, 1, t, heads, head_dim);
    ttnn::Tensor a = last(per_head, 0, half), b = last(per_head, half, 2 * half);
    ttnn::Tensor ra = ttnn::subtract(ttnn::multiply(a, cos), ttnn::multiply(b, sin));
    ttnn::Tensor rb = ttnn::add(ttnn::multiply(b, cos), ttnn::multiply(a, sin));
    std::vector<ttnn::Tensor> parts{ra, rb};
    if (2 * half < head_dim) parts.push_back(last(per_head, 2 * half, head_dim));
    return wrap(shape4(ttnn::concat(parts, 3), 1, 1, t, heads * head_dim));
  });
}

ttnn::Tensor TtnnMesh::paged(const TensorView& t, uint32_t kv_heads, uint32_t head_dim) {
  const TtnnStorage& s = storage(t);
  if (s.paged) return s.tensor;
  // [1, 1, S, kv*d] → rows padded to whole blocks → [blocks, kv, 64, d].
  uint32_t rows = t.meta.rows, blocks = (rows + kKvBlock - 1) / kKvBlock;
  ttnn::Tensor r = s.tensor;
  if (blocks * kKvBlock != rows) {
    r = ttnn::pad(r, ttnn::Shape({1, 1, blocks * kKvBlock, kv_heads * head_dim}),
                  ttnn::Shape({0, 0, 0, 0}), 0.0f);
  }
  r = shape4(r, blocks, kKvBlock, kv_heads, head_dim);
  return ttnn::permute(r, ttsl::SmallVector<int64_t>{0, 2, 1, 3});
}

StoragePtr TtnnMesh::append_rows(const TensorView* cache, const TensorView& new_rows,
                                  uint32_t heads) {
  return on_device("append_rows", [&]() -> StoragePtr {
    // The KV cache is held paged, as the port holds it: [blocks, heads, 64, d], block i the
    // positions [64 i, 64 i + 64) (an identity page table). The new rows start on a block
    // boundary (prefill passes and prefix slots start at multiples of 128) and are written
    // into freshly added blocks by paged_fill_cache through a page table of those blocks.
    uint32_t d = new_rows.meta.cols / heads;
    uint32_t old_rows = cache == nullptr ? 0 : cache->meta.rows;
    if (old_rows % kKvBlock != 0) {
      invalid("ttnn backend: KV rows are appended at multiples of 64 (the paged cache's block), not after row " +
              std::to_string(old_rows));
    }
    std::optional<ttnn::Tensor> old;
    if (cache != nullptr) old = paged(*cache, heads, d);
    DataType dtype = old ? old->dtype() : activation_dtype();
    uint32_t old_blocks = old_rows / kKvBlock;
    uint32_t added = (new_rows.meta.rows + kKvBlock - 1) / kKvBlock;
    // creation.hpp: zeros(shape, dtype, layout, device, memory_config)
    ttnn::Tensor grown = ttnn::zeros(ttnn::Shape({added, heads, kKvBlock, d}), dtype, Layout::TILE,
                                     std::ref(*device_), ttnn::DRAM_MEMORY_CONFIG);
    if (old) grown = ttnn::concat({*old, grown}, 0);
    ttnn::Tensor input = heads_first(storage(new_rows).tensor, heads, d);
    // experimental/paged_cache/paged_cache.hpp: paged_fill_cache(cache, input, page_table,
    // batch_idx_tensor, batch_idx, compute_kernel_config, mesh_coords) fills in place.
    ttnn::experimental::paged_fill_cache(grown, input, page_table(old_blocks, added), std::nullopt, 0,
                                         std::nullopt, std::nullopt);
    auto out = std::make_unique<TtnnStorage>(grown);
    out->paged = true;
    out->kv_heads = heads;
    out->head_dim = d;
    return StoragePtr(std::move(out));
  });
}

StoragePtr TtnnMesh::causal_attention(const TensorView& q, const TensorView& keys,
                                      const TensorView& values, uint32_t heads, uint32_t kv_heads,
                                      uint32_t head_dim) {
  return on_device("causal_attention", [&] {
    ttnn::Tensor k = paged(keys, kv_heads, head_dim), v = paged(values, kv_heads, head_dim);
    uint32_t blocks = k.logical_shape()[0];
    int64_t start = static_cast<int64_t>(keys.meta.rows) - q.meta.rows;
    // The port: 128-token q/k chunks on the compute grid; chunk starts are 128-aligned
    // (prefix slots and prefill passes are).
    if (start % 128 != 0) {
      invalid("ttnn backend: a chunk of queries starts at position " + std::to_string(start) +
              ", chunked SDPA needs multiples of 128");
    }
    ttnn::operations::transformer::SDPAProgramConfig pc{};
    pc.compute_with_storage_grid_size = device_->compute_with_storage_grid_size();
    pc.q_chunk_size = 128;
    pc.k_chunk_size = 128;
    pc.exp_approx_mode = false;
    // transformer/sdpa/sdpa.hpp: chunked_scaled_dot_product_attention(q, k, v, page_table,
    // chunk_start_idx, scale, memory_config, program_config, compute_kernel_config)
    ttnn::Tensor o = ttnn::transformer::chunked_scaled_dot_product_attention(
        heads_first(storage(q).tensor, heads, head_dim), k, v, page_table(0, blocks), start,
        1.0f / std::sqrt(static_cast<float>(head_dim)), ttnn::DRAM_MEMORY_CONFIG, pc, precise());
    return wrap(heads_last(o));
  });
}

StoragePtr TtnnMesh::mul_sigmoid(const TensorView& x, const TensorView& gate) {
  return on_device("mul_sigmoid", [&] {
    return wrap(ttnn::multiply(storage(x).tensor, ttnn::sigmoid(storage(gate).tensor)));
  });
}

StoragePair TtnnMesh::causal_conv1d_silu(const TensorView& x, const TensorView& w,
                                         const TensorView* carry, uint32_t kernel) {
  return on_device("causal_conv1d_silu", [&] {
    // The port's 4-tap FIR: the input extended by the carried rows, each tap a shifted
    // multiply-accumulate with a per-channel row, then SiLU; the new carry is the last
    // kernel-1 rows.
    const ttnn::Tensor& xt = storage(x).tensor;
    uint32_t t = x.meta.rows, ch = x.meta.cols, keep = kernel - 1;
    ttnn::Tensor prev = carry != nullptr
                            ? storage(*carry).tensor
                            : ttnn::zeros(ttnn::Shape({1, 1, keep, ch}), xt.dtype(), Layout::TILE,
                                          std::ref(*device_), ttnn::DRAM_MEMORY_CONFIG);
    ttnn::Tensor ext = ttnn::concat({prev, xt}, 2);
    std::optional<ttnn::Tensor> acc;
    for (uint32_t j = 0; j < kernel; ++j) {
      // Tap j of every channel as a [1, 1, 1, ch] row (the weight is [ch, kernel]).
      ttnn::Tensor tap = derived(w, "tap" + std::to_string(j), [&](const ttnn::Tensor& v) {
        ttnn::Tensor cols_first = ttnn::permute(shape4(v, 1, 1, ch, kernel), ttsl::SmallVector<int64_t>{0, 1, 3, 2});
        std::array<uint32_t, 4> b{0, 0, j, 0}, e{1, 1, j + 1, ch}, s{1, 1, 1, 1};
        return ttnn::typecast(ttnn::to_layout(ttnn::slice(cols_first, b, e, s), Layout::TILE), xt.dtype());
      });
      ttnn::Tensor term = ttnn::multiply(rows(ext, j, j + t), tap);
      acc = acc ? ttnn::add(*acc, term) : term;
    }
    return StoragePair{wrap(ttnn::silu(*acc)), wrap(rows(ext, t, t + keep))};
  });
}

StoragePair TtnnMesh::delta_gates(const TensorView& a, const TensorView& b, const TensorView& a_log,
                                  const TensorView& dt_bias) {
  return on_device("delta_gates", [&] {
    // g = -exp(A_log) * softplus(a + dt_bias) in f32 (the port's accuracy fix); beta =
    // sigmoid(b).
    uint32_t nv = a.meta.cols;
    auto row = [&](const TensorView& v, const char* key, bool neg_exp) {
      return derived(v, key, [&](const ttnn::Tensor& t) {
        ttnn::Tensor r = ttnn::to_layout(shape4(t, 1, 1, 1, nv), Layout::TILE);
        return neg_exp ? ttnn::neg(ttnn::exp(r, false)) : r;
      });
    };
    ttnn::Tensor a32 = ttnn::typecast(storage(a).tensor, DataType::FLOAT32);
    ttnn::Tensor sp = ttnn::softplus(ttnn::add(a32, row(dt_bias, "row", false)), 1.0f, 20.0f);
    ttnn::Tensor g = ttnn::multiply(row(a_log, "neg_exp", true), sp);
    return StoragePair{wrap(g), wrap(ttnn::sigmoid(storage(b).tensor))};
  });
}

StoragePair TtnnMesh::gated_delta_rule(const TensorView& qkv, const TensorView& g,
                                       const TensorView& beta, const TensorView* state,
                                       const clef_tt_delta_spec& spec) {
  return on_device("gated_delta_rule", [&] {
    // transformer/chunk_gated_delta_rule/chunk_gated_delta_rule.hpp: q, k [B, T, H, K],
    // v [B, T, HV, V], g, beta [B, T, HV], initial_state [B, HV, K, V] (f32); returns o
    // [B, T, HV, V] and the final state. q/k are L2-normalised inside, q scaled by K^-0.5.
    const ttnn::Tensor& x = storage(qkv).tensor;
    uint32_t t = qkv.meta.rows, nk = spec.key_heads, nv = spec.value_heads, dk = spec.key_dim,
             dv = spec.value_dim, kd = nk * dk;
    ttnn::Tensor q = shape4(cols(x, 0, kd), 1, t, nk, dk);
    ttnn::Tensor k = shape4(cols(x, kd, 2 * kd), 1, t, nk, dk);
    ttnn::Tensor v = shape4(cols(x, 2 * kd, 2 * kd + nv * dv), 1, t, nv, dv);
    ttnn::Tensor gg = ttnn::reshape(storage(g).tensor, ttnn::Shape({1, t, nv}));
    ttnn::Tensor bb = ttnn::reshape(ttnn::typecast(storage(beta).tensor, DataType::FLOAT32), ttnn::Shape({1, t, nv}));
    std::optional<ttnn::Tensor> s0;
    if (state != nullptr) s0 = shape4(ttnn::typecast(storage(*state).tensor, DataType::FLOAT32), 1, nv, dk, dv);
    // Positional arguments up to output_head_major only: the trailing ones (program config,
    // WY inverse, memory and compute configs) differ between ttnn versions.
    auto [o, final_state] = ttnn::transformer::chunk_gated_delta_rule(
        q, k, v, gg, bb, 1.0f / std::sqrt(static_cast<float>(dk)), s0, true, 64, true, false);
    if (!final_state) device_failure("chunk_gated_delta_rule returned no final state");
    ttnn::Tensor out = ttnn::to_layout(o, Layout::TILE);  // o is row-major
    out = shape4(out, 1, 1, t, nv * dv);
    if (out.dtype() != activation_dtype()) out = ttnn::typecast(out, activation_dtype());
    return StoragePair{wrap(out), wrap(shape4(*final_state, 1, 1, nv * dk, dv))};
  });
}

StoragePtr TtnnMesh::gated_rms_norm(const TensorView& x, const TensorView& z, const TensorView& w,
                                    uint32_t group, float eps) {
  return on_device("gated_rms_norm", [&] {
    // The port: rms_norm with the plain weight per value head, then times silu(z).
    ttnn::Tensor gamma = derived(w, "gamma", [&](const ttnn::Tensor& v) {
      return ttnn::typecast(shape4(v, 1, 1, group / 32, 32), DataType::BFLOAT16);
    });
    uint32_t t = x.meta.rows, n = x.meta.cols / group;
    ttnn::Tensor y = ttnn::rms_norm(shape4(storage(x).tensor, 1, t, n, group), eps, gamma, std::nullopt,
                                    std::nullopt, ttnn::DRAM_MEMORY_CONFIG, std::nullopt, precise());
    return wrap(ttnn::multiply(shape4(y, 1, 1, t, x.meta.cols), ttnn::silu(storage(z).tensor)));
  });
}

StoragePtr TtnnMesh::layer_norm(const TensorView& x, const TensorView& w, const TensorView& b,
                                float eps) {
  return on_device("layer_norm", [&] {
    uint32_t n = x.meta.cols;
    auto param = [&](const TensorView& v) {
      return derived(v, "gamma", [&](const ttnn::Tensor& t) {
        return ttnn::typecast(shape4(t, 1, 1, n / 32, 32), DataType::BFLOAT16);
      });
    };
    // normalization/layernorm/layernorm.hpp: layer_norm(x, epsilon, weight, bias, residual,
    // memory_config, program_config, compute_kernel_config)
    return wrap(ttnn::layer_norm(storage(x).tensor, eps, param(w), param(b), std::nullopt,
                                 ttnn::DRAM_MEMORY_CONFIG, std::nullopt, precise()));
  });
}

StoragePtr TtnnMesh::add_bias(const TensorView& x, const TensorView& b) {
  return on_device("add_bias", [&] {
    const ttnn::Tensor& xt = storage(x).tensor;
    ttnn::Tensor row = derived(b, "row", [&](const ttnn::Tensor& t) {
      return ttnn::typecast(ttnn::to_layout(shape4(t, 1, 1, 1, x.meta.cols), Layout::TILE), xt.dtype());
    });
    return wrap(ttnn::add(xt, row));  // broadcast over rows
  });
}

StoragePtr TtnnMesh::gelu(const TensorView& x, clef_tt_gelu_kind kind) {
  return on_device("gelu", [&] {
    const ttnn::Tensor& v = storage(x).tensor;
    if (kind == CLEF_TT_GELU_ERF) return wrap(ttnn::gelu(v, false));  // the accurate (erf) form
    // tanh GELU as x · sigmoid(2u), u = sqrt(2/π) (x + 0.044715 x³), as the CPU mesh computes it.
    const float c = std::sqrt(2.0f / static_cast<float>(M_PI));
    ttnn::Tensor cube = ttnn::multiply(ttnn::multiply(v, v), v);
    ttnn::Tensor u = ttnn::multiply(ttnn::add(v, ttnn::multiply(cube, 0.044715f)), 2.0f * c);
    return wrap(ttnn::multiply(v, ttnn::sigmoid(u)));
  });
}

StoragePtr TtnnMesh::rotary(const TensorView& x, const TensorView& cos, const TensorView& sin,
                            uint32_t heads, uint32_t head_dim) {
  return on_device("rotary", [&] {
    uint32_t t = x.meta.rows, half = head_dim / 2;
    auto per_head = [&](const TensorView& table) {
      // [rows, d] repeated over heads (data_movement/repeat/repeat.hpp).
      return ttnn::repeat(shape4(storage(table).tensor, 1, t, 1, head_dim), ttsl::SmallVector<uint32_t>{1, 1, heads, 1});
    };
    ttnn::Tensor xs = shape4(storage(x).tensor, 1, t, heads, head_dim);
    ttnn::Tensor rotated = ttnn::concat({ttnn::neg(last(xs, half, head_dim)), last(xs, 0, half)}, 3);
    ttnn::Tensor y = ttnn::add(ttnn::multiply(xs, per_head(cos)), ttnn::multiply(rotated, per_head(sin)));
    return wrap(shape4(y, 1, 1, t, heads * head_dim));
  });
}

StoragePtr TtnnMesh::segment_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                       uint32_t heads, uint32_t head_dim,
                                       const std::vector<Segment>& segments) {
  return on_device("segment_attention", [&] {
    // One bidirectional SDPA per image (or frame pair); transformer/sdpa/sdpa.hpp:
    // scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale, sliding_window,
    // memory_config, program_config, compute_kernel_config).
    std::vector<ttnn::Tensor> outs;
    for (const Segment& s : segments) {
      auto part = [&](const TensorView& t) { return heads_first(rows(storage(t).tensor, s.start, s.end), heads, head_dim); };
      ttnn::Tensor o = ttnn::transformer::scaled_dot_product_attention(
          part(q), part(k), part(v), std::nullopt, false, 1.0f / std::sqrt(static_cast<float>(head_dim)),
          std::nullopt, ttnn::DRAM_MEMORY_CONFIG, std::nullopt, precise());
      outs.push_back(heads_last(o));
    }
    return wrap(outs.size() == 1 ? outs[0] : ttnn::concat(outs, 2));
  });
}

StoragePtr TtnnMesh::fold_rows(const TensorView& x, uint32_t group) {
  return on_device("fold_rows", [&] {
    return wrap(shape4(storage(x).tensor, 1, 1, x.meta.rows / group, x.meta.cols * group));
  });
}

}  // namespace clef_tt::ttnn_backend
