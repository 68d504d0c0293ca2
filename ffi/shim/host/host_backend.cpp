// The host backend: simulated devices whose buffers are host memory in ttnn's layouts
// (activations as f32 tiles, matrices as the tile bytes uploaded, vectors as f32 rows). Every
// op reads its operands out of the tiles, computes with the plain loops of math.cpp and writes
// tiles back; collectives sum real per-device partials. Built everywhere so the C ABI and the
// shared core are tested in CI; not meant to be fast.
//
// Environment (read by this backend only):
//   CLEF_TT_HOST_DEVICES  devices this process "sees" (default 4);
//   CLEF_TT_HOST_FAIL     `op:N[,op:N...]`: the Nth call of `op` on each mesh opened afterwards
//                         fails with a device error (`open:N` fails the Nth mesh open), for
//                         fault tests.
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "core/errors.hpp"
#include "core/tile_format.hpp"
#include "math.hpp"

namespace clef_tt::host {

namespace {

// Bytes held per device, shared by a mesh and the storages it made.
struct Ledger {
  std::mutex lock;
  std::vector<uint64_t> bytes;
};

class HostStorage : public Storage {
 public:
  HostStorage(std::shared_ptr<Ledger> ledger, std::vector<std::vector<uint8_t>> parts)
      : ledger_(std::move(ledger)), parts_(std::move(parts)) {
    std::lock_guard<std::mutex> g(ledger_->lock);
    for (size_t d = 0; d < parts_.size(); ++d) ledger_->bytes[d] += parts_[d].size();
  }
  ~HostStorage() override {
    std::lock_guard<std::mutex> g(ledger_->lock);
    for (size_t d = 0; d < parts_.size(); ++d) ledger_->bytes[d] -= parts_[d].size();
  }
  const std::vector<uint8_t>& part(uint32_t d) const { return parts_[d]; }
  uint64_t bytes() const {
    uint64_t total = 0;
    for (const auto& p : parts_) total += p.size();
    return total;
  }

 private:
  std::shared_ptr<Ledger> ledger_;
  std::vector<std::vector<uint8_t>> parts_;
};

const HostStorage& host(const TensorView& t) { return static_cast<const HostStorage&>(t.storage); }

// Counts calls per op and fails the ones CLEF_TT_HOST_FAIL names.
class Faults {
 public:
  static std::map<std::string, uint64_t> parse(const char* spec) {
    std::map<std::string, uint64_t> out;
    if (spec == nullptr || *spec == '\0') return out;
    std::string s(spec);
    size_t at = 0;
    while (at <= s.size()) {
      size_t end = s.find(',', at);
      std::string item = s.substr(at, end == std::string::npos ? std::string::npos : end - at);
      size_t colon = item.find(':');
      char* rest = nullptr;
      unsigned long long n =
          colon == std::string::npos ? 0 : std::strtoull(item.c_str() + colon + 1, &rest, 10);
      if (colon == std::string::npos || colon == 0 || n == 0 || rest == nullptr || *rest != '\0') {
        invalid("CLEF_TT_HOST_FAIL=" + s + ": expected op:N[,op:N...] with N >= 1");
      }
      out[item.substr(0, colon)] = n;
      if (end == std::string::npos) break;
      at = end + 1;
    }
    return out;
  }

  Faults() : fail_at_(parse(std::getenv("CLEF_TT_HOST_FAIL"))) {}

  void count(const char* op) {
    uint64_t n = ++calls_[op];
    auto it = fail_at_.find(op);
    if (it != fail_at_.end() && it->second == n) {
      device_failure("injected fault: call " + std::to_string(n) + " of " + op +
                     " (CLEF_TT_HOST_FAIL)");
    }
  }

 private:
  std::map<std::string, uint64_t> fail_at_;
  std::map<std::string, uint64_t> calls_;
};

// Rows as a mesh keeps them in `dtype`: the host keeps f32 and rounds what is kept as bf16.
Rows kept(Rows r, clef_tt_dtype dtype) {
  if (dtype == CLEF_TT_BF16) {
    for (float& v : r.v) v = round_bf16(v);
  }
  return r;
}

class HostMesh : public DeviceMesh {
 public:
  HostMesh(uint32_t first, const clef_tt_mesh_config& config)
      : first_(first), devices_(config.cols), config_(config) {
    ledger_ = std::make_shared<Ledger>();
    ledger_->bytes.assign(devices_, 0);
  }

  std::vector<uint32_t> device_ids() const override {
    std::vector<uint32_t> ids;
    for (uint32_t d = 0; d < devices_; ++d) ids.push_back(first_ + d);
    return ids;
  }

  std::vector<uint64_t> memory() const override {
    std::lock_guard<std::mutex> g(ledger_->lock);
    return ledger_->bytes;
  }

  std::string describe() override {
    std::string ids;
    for (uint32_t id : device_ids()) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
    return "{\"devices\": " + std::to_string(devices_) + ", \"device_ids\": [" + ids +
           "], \"activation_dtype\": \"f32\", \"kv_dtype\": \"" + dtype_name(config_.kv_dtype) +
           "\", \"gdn_gate_dtype\": \"" + dtype_name(config_.gdn_gate_dtype) +
           "\", \"gdn_state_dtype\": \"" + dtype_name(config_.gdn_state_dtype) + "\"}";
  }

  StoragePtr allocate(const Meta& meta) override {
    // Simulated devices: zeros in the stored layout, as an upload of zeros would hold them.
    std::vector<uint8_t> zeros(stored_bytes(meta), 0);
    std::vector<HostBytes> parts(meta.devices, HostBytes{zeros.data(), zeros.size()});
    return upload(meta, parts);
  }

  StoragePtr upload(const Meta& meta, const std::vector<HostBytes>& parts) override {
    faults_.count("upload");
    std::vector<std::vector<uint8_t>> stored;
    for (const HostBytes& p : parts) {
      if (meta.role == CLEF_TT_ACTIVATION) {
        Rows m(meta.rows, meta.cols);
        std::memcpy(m.v.data(), p.data, p.bytes);
        stored.push_back(tilize_f32(m));
      } else {
        stored.emplace_back(p.data, p.data + p.bytes);
      }
    }
    return make(std::move(stored));
  }

  void download(const TensorView& t, uint32_t device, float* out) override {
    faults_.count("download");
    Rows m = rows(t, device);
    std::memcpy(out, m.v.data(), m.v.size() * 4);
  }

  void read_stored(const TensorView& t, uint32_t device, uint8_t* out) override {
    if (t.meta.role == CLEF_TT_ACTIVATION) {
      Rows m = rows(t, device);
      std::memcpy(out, m.v.data(), m.v.size() * 4);
    } else {
      const std::vector<uint8_t>& p = host(t).part(device);
      std::memcpy(out, p.data(), p.size());
    }
  }

  uint64_t device_bytes(const TensorView& t) override { return host(t).bytes(); }

  StoragePtr copy(const TensorView& t) override {
    faults_.count("copy");
    std::vector<std::vector<uint8_t>> parts;
    for (uint32_t d = 0; d < t.meta.devices; ++d) parts.push_back(host(t).part(d));
    return make(std::move(parts));
  }

  StoragePtr linear(const TensorView& x, const TensorView& w,
                    const clef_tt_matmul_config& config) override {
    faults_.count("linear");
    return each([&](uint32_t d) { return math::linear(rows(x, d), rows(w, d), config); });
  }

  StoragePtr all_reduce(const TensorView& x) override {
    faults_.count("all_reduce");
    Rows sum = rows(x, 0);
    for (uint32_t d = 1; d < x.meta.devices; ++d) sum = math::add(sum, rows(x, d));
    return each([&](uint32_t) { return sum; });
  }

  std::vector<StoragePtr> split_cols(const TensorView& x,
                                     const std::vector<uint32_t>& widths) override {
    faults_.count("split_cols");
    std::vector<Rows> src;
    for (uint32_t d = 0; d < x.meta.devices; ++d) src.push_back(rows(x, d));
    std::vector<StoragePtr> out;
    uint32_t start = 0;
    for (uint32_t w : widths) {
      out.push_back(each([&](uint32_t d) {
        Rows part(src[d].rows, w);
        for (uint32_t r = 0; r < part.rows; ++r) {
          std::memcpy(part.row(r), src[d].row(r) + start, w * 4);
        }
        return part;
      }));
      start += w;
    }
    return out;
  }

  StoragePtr add(const TensorView& a, const TensorView& b) override {
    faults_.count("add");
    return each([&](uint32_t d) { return math::add(rows(a, d), rows(b, d)); });
  }

  StoragePtr rms_norm(const TensorView& x, const TensorView& w, uint32_t group, float eps,
                      bool one_plus) override {
    faults_.count("rms_norm");
    return each(
        [&](uint32_t d) { return math::rms_norm(rows(x, d), values(w, d), group, eps, one_plus); });
  }

  StoragePtr swiglu(const TensorView& gate_up) override {
    faults_.count("swiglu");
    return each([&](uint32_t d) { return math::swiglu(rows(gate_up, d)); });
  }

  StoragePair split_query_gate(const TensorView& qg, uint32_t heads, uint32_t d_head) override {
    faults_.count("split_query_gate");
    auto q = each([&](uint32_t d) { return math::pick_half(rows(qg, d), heads, d_head, 0); });
    auto g = each([&](uint32_t d) { return math::pick_half(rows(qg, d), heads, d_head, 1); });
    return {std::move(q), std::move(g)};
  }

  StoragePtr rope(const TensorView& x, const RopeTables& tables, uint32_t,
                  uint32_t head_dim) override {
    faults_.count("rope");
    return each([&](uint32_t d) { return math::rope(rows(x, d), tables, head_dim); });
  }

  StoragePtr append_rows(const TensorView* cache, const TensorView& new_rows, uint32_t) override {
    faults_.count("append_rows");
    return each([&](uint32_t d) {
      Rows tail = kept(rows(new_rows, d), config_.kv_dtype);
      if (cache == nullptr) return tail;
      Rows all = rows(*cache, d);
      all.rows += tail.rows;
      all.v.insert(all.v.end(), tail.v.begin(), tail.v.end());
      return all;
    });
  }

  StoragePtr causal_attention(const TensorView& q, const TensorView& keys,
                              const TensorView& values_, uint32_t heads, uint32_t kv_heads,
                              uint32_t head_dim) override {
    faults_.count("causal_attention");
    return each([&](uint32_t d) {
      return math::causal_attention(rows(q, d), rows(keys, d), rows(values_, d), heads, kv_heads,
                                    head_dim);
    });
  }

  StoragePtr mul_sigmoid(const TensorView& x, const TensorView& gate) override {
    faults_.count("mul_sigmoid");
    return each([&](uint32_t d) { return math::mul_sigmoid(rows(x, d), rows(gate, d)); });
  }

  StoragePair causal_conv1d_silu(const TensorView& x, const TensorView& w, const TensorView* carry,
                                 uint32_t kernel) override {
    faults_.count("causal_conv1d_silu");
    std::vector<Rows> outs, carries;
    for (uint32_t d = 0; d < x.meta.devices; ++d) {
      Rows xs = rows(x, d);
      Rows prev = carry == nullptr ? Rows(kernel - 1, xs.cols) : rows(*carry, d);
      auto pair = math::causal_conv1d_silu(xs, values(w, d), prev, kernel);
      outs.push_back(std::move(pair.first));
      carries.push_back(std::move(pair.second));
    }
    return {tiles(outs), tiles(carries)};
  }

  StoragePair delta_gates(const TensorView& a, const TensorView& b, const TensorView& a_log,
                          const TensorView& dt_bias) override {
    faults_.count("delta_gates");
    const clef_tt_dtype gates = config_.gdn_gate_dtype;
    auto g = each([&](uint32_t d) {
      return kept(math::decay_gate(rows(a, d), values(a_log, d), values(dt_bias, d)), gates);
    });
    auto beta = each([&](uint32_t d) { return kept(math::sigmoid_all(rows(b, d)), gates); });
    return {std::move(g), std::move(beta)};
  }

  StoragePair gated_delta_rule(const TensorView& qkv, const TensorView& g, const TensorView& beta,
                               const TensorView* state, const clef_tt_delta_spec& spec) override {
    faults_.count("gated_delta_rule");
    std::vector<Rows> outs, states;
    for (uint32_t d = 0; d < qkv.meta.devices; ++d) {
      Rows s = state == nullptr ? Rows(spec.value_heads * spec.key_dim, spec.value_dim)
                                : rows(*state, d);
      auto pair = math::gated_delta_rule(rows(qkv, d), rows(g, d), rows(beta, d), s, spec);
      outs.push_back(std::move(pair.first));
      states.push_back(kept(std::move(pair.second), config_.gdn_state_dtype));
    }
    return {tiles(outs), tiles(states)};
  }

  StoragePtr gated_rms_norm(const TensorView& x, const TensorView& z, const TensorView& w,
                            uint32_t group, float eps) override {
    faults_.count("gated_rms_norm");
    return each([&](uint32_t d) {
      return math::gated_rms_norm(rows(x, d), rows(z, d), values(w, d), group, eps);
    });
  }

  StoragePtr layer_norm(const TensorView& x, const TensorView& w, const TensorView& b,
                        float eps) override {
    faults_.count("layer_norm");
    return each(
        [&](uint32_t d) { return math::layer_norm(rows(x, d), values(w, d), values(b, d), eps); });
  }

  StoragePtr add_bias(const TensorView& x, const TensorView& b) override {
    faults_.count("add_bias");
    return each([&](uint32_t d) { return math::add_bias(rows(x, d), values(b, d)); });
  }

  StoragePtr gelu(const TensorView& x, clef_tt_gelu_kind kind) override {
    faults_.count("gelu");
    return each([&](uint32_t d) { return math::gelu(rows(x, d), kind); });
  }

  StoragePtr rotary(const TensorView& x, const TensorView& cos, const TensorView& sin, uint32_t,
                    uint32_t head_dim) override {
    faults_.count("rotary");
    return each(
        [&](uint32_t d) { return math::rotary(rows(x, d), rows(cos, d), rows(sin, d), head_dim); });
  }

  StoragePtr segment_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                               uint32_t heads, uint32_t head_dim,
                               const std::vector<Segment>& segments) override {
    faults_.count("segment_attention");
    return each([&](uint32_t d) {
      return math::segment_attention(rows(q, d), rows(k, d), rows(v, d), heads, head_dim, segments);
    });
  }

  StoragePtr fold_rows(const TensorView& x, uint32_t group) override {
    faults_.count("fold_rows");
    return each([&](uint32_t d) {
      Rows m = rows(x, d);
      m.rows /= group;
      m.cols *= group;
      return m;
    });
  }

  std::string command(const std::string& request_json) override {
    throw Error(CLEF_TT_UNSUPPORTED,
                "the host backend takes no mesh command (" + request_json + ")");
  }

  // The host backend runs no layer op: the caller composes each layer from the ops above,
  // which is what this backend exists to check.
  std::vector<StoragePtr> layer_op(const std::string& op,
                                   const std::vector<std::optional<TensorView>>& /*inputs*/,
                                   const std::string& /*params_json*/,
                                   const RopeTables* /*rope*/) override {
    throw Error(CLEF_TT_UNSUPPORTED, "the host backend runs no layer op (" + op + ")");
  }

 private:
  // Device `d`'s part of any tensor as f32 rows.
  static Rows rows(const TensorView& t, uint32_t d) {
    const std::vector<uint8_t>& p = host(t).part(d);
    if (t.meta.role == CLEF_TT_VECTOR) {
      Rows m(t.meta.rows, t.meta.cols);
      std::memcpy(m.v.data(), p.data(), p.size());
      return m;
    }
    return untilize(p.data(), t.meta.rows, t.meta.cols,
                    t.meta.role == CLEF_TT_ACTIVATION ? CLEF_TT_F32 : t.meta.dtype);
  }

  static std::vector<float> values(const TensorView& t, uint32_t d) { return rows(t, d).v; }

  StoragePtr make(std::vector<std::vector<uint8_t>> parts) {
    return std::make_unique<HostStorage>(ledger_, std::move(parts));
  }

  StoragePtr tiles(const std::vector<Rows>& per_device) {
    std::vector<std::vector<uint8_t>> parts;
    for (const Rows& m : per_device) parts.push_back(tilize_f32(m));
    return make(std::move(parts));
  }

  // An activation result computed device by device.
  template <class F>
  StoragePtr each(F&& f) {
    std::vector<Rows> parts;
    for (uint32_t d = 0; d < devices_; ++d) parts.push_back(f(d));
    return tiles(parts);
  }

  uint32_t first_;
  uint32_t devices_;
  clef_tt_mesh_config config_;
  std::shared_ptr<Ledger> ledger_;
  Faults faults_;
};

class HostParent : public ParentMesh {};

class HostBackend : public Backend {
 public:
  const char* name() const override { return "host"; }

  std::string describe() override {
    return "{\"backend\": \"host\", \"hardware\": \"host\", \"runtime\": "
           "\"clef-tt host loops\", \"devices\": " +
           std::to_string(visible_devices()) + "}";
  }

  uint32_t visible_devices() override {
    const char* v = std::getenv("CLEF_TT_HOST_DEVICES");
    if (v == nullptr || *v == '\0') return 4;
    char* rest = nullptr;
    unsigned long n = std::strtoul(v, &rest, 10);
    if (rest == nullptr || *rest != '\0' || n > CLEF_TT_MAX_DEVICES) {
      invalid(std::string("CLEF_TT_HOST_DEVICES=") + v + ": expected 0 to " +
              std::to_string(CLEF_TT_MAX_DEVICES));
    }
    return static_cast<uint32_t>(n);
  }

  std::unique_ptr<DeviceMesh> open(const clef_tt_mesh_config& config) override {
    count_open();
    return std::make_unique<HostMesh>(0, config);
  }

  std::shared_ptr<ParentMesh> open_parent(const clef_tt_mesh_config&) override {
    return std::make_shared<HostParent>();
  }

  std::unique_ptr<DeviceMesh> open_submesh(const std::shared_ptr<ParentMesh>&,
                                           const clef_tt_mesh_config& config) override {
    count_open();
    return std::make_unique<HostMesh>(config.submesh_offset, config);
  }

 private:
  void count_open() {
    std::lock_guard<std::mutex> g(lock_);
    std::map<std::string, uint64_t> fail = Faults::parse(std::getenv("CLEF_TT_HOST_FAIL"));
    uint64_t n = ++opens_;
    auto it = fail.find("open");
    if (it != fail.end() && it->second == n) {
      device_failure("injected fault: mesh open " + std::to_string(n) + " (CLEF_TT_HOST_FAIL)");
    }
  }

  std::mutex lock_;
  uint64_t opens_ = 0;
};

}  // namespace

}  // namespace clef_tt::host

namespace clef_tt {

Backend& backend() {
  static host::HostBackend b;
  return b;
}

}  // namespace clef_tt
