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

std::vector<StoragePtr> one(StoragePtr a) {
  std::vector<StoragePtr> out;
  out.push_back(std::move(a));
  return out;
}

std::vector<StoragePtr> two(StoragePtr a, StoragePtr b) {
  std::vector<StoragePtr> out;
  out.push_back(std::move(a));
  out.push_back(std::move(b));
  return out;
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

  // The fine ops, each as its declaration in the op table names it (core/op_table.cpp): the
  // core has checked every operand, parameter and shape; these compute device by device.
  std::vector<StoragePtr> op(const OpArgs& a) override {
    faults_.count(a.op.name);
    using Kernel = std::vector<StoragePtr> (*)(HostMesh&, const OpArgs&);
    static const std::map<std::string, Kernel> kernels = {
        {"linear",
         [](HostMesh& m, const OpArgs& a) {
           MatmulConfig c;
           c.fidelity = static_cast<clef_tt_fidelity>(a.u32("fidelity"));
           c.fp32_dest_acc = a.flag("fp32_dest_acc");
           c.bf16_activations = a.flag("bf16_activations");
           c.packer_l1_acc = a.flag("packer_l1_acc");
           return one(m.each(
               [&](uint32_t d) { return math::linear(rows(a.in(0), d), rows(a.in(1), d), c); }));
         }},
        {"all_reduce",
         [](HostMesh& m, const OpArgs& a) {
           const TensorView& x = a.in(0);
           Rows sum = rows(x, 0);
           for (uint32_t d = 1; d < x.meta.devices; ++d) sum = math::add(sum, rows(x, d));
           return one(m.each([&](uint32_t) { return sum; }));
         }},
        {"split_cols",
         [](HostMesh& m, const OpArgs& a) {
           const TensorView& x = a.in(0);
           std::vector<Rows> src;
           for (uint32_t d = 0; d < x.meta.devices; ++d) src.push_back(rows(x, d));
           std::vector<StoragePtr> out;
           uint32_t start = 0;
           for (uint32_t w : a.list) {
             out.push_back(m.each([&](uint32_t d) {
               Rows part(src[d].rows, w);
               for (uint32_t r = 0; r < part.rows; ++r) {
                 std::memcpy(part.row(r), src[d].row(r) + start, w * 4);
               }
               return part;
             }));
             start += w;
           }
           return out;
         }},
        {"add",
         [](HostMesh& m, const OpArgs& a) {
           return one(
               m.each([&](uint32_t d) { return math::add(rows(a.in(0), d), rows(a.in(1), d)); }));
         }},
        {"rms_norm",
         [](HostMesh& m, const OpArgs& a) {
           return one(m.each([&](uint32_t d) {
             return math::rms_norm(rows(a.in(0), d), values(a.in(1), d), a.u32("group"),
                                   a.f32("eps"), a.flag("one_plus"));
           }));
         }},
        {"swiglu",
         [](HostMesh& m, const OpArgs& a) {
           return one(m.each([&](uint32_t d) { return math::swiglu(rows(a.in(0), d)); }));
         }},
        {"split_query_gate",
         [](HostMesh& m, const OpArgs& a) {
           uint32_t heads = a.u32("heads"), dh = a.u32("head_dim");
           std::vector<StoragePtr> out;
           for (uint32_t half = 0; half < 2; ++half) {
             out.push_back(m.each(
                 [&](uint32_t d) { return math::pick_half(rows(a.in(0), d), heads, dh, half); }));
           }
           return out;
         }},
        {"rope",
         [](HostMesh& m, const OpArgs& a) {
           return one(m.each([&](uint32_t d) {
             return math::rope(rows(a.in(0), d), *a.rope, a.u32("head_dim"));
           }));
         }},
        {"append_rows",
         [](HostMesh& m, const OpArgs& a) {
           const TensorView* cache = a.maybe(0);
           return one(m.each([&](uint32_t d) {
             Rows tail = kept(rows(a.in(1), d), m.config_.kv_dtype);
             if (cache == nullptr) return tail;
             Rows all = rows(*cache, d);
             all.rows += tail.rows;
             all.v.insert(all.v.end(), tail.v.begin(), tail.v.end());
             return all;
           }));
         }},
        {"causal_attention",
         [](HostMesh& m, const OpArgs& a) {
           return one(m.each([&](uint32_t d) {
             return math::causal_attention(rows(a.in(0), d), rows(a.in(1), d), rows(a.in(2), d),
                                           a.u32("heads"), a.u32("kv_heads"), a.u32("head_dim"));
           }));
         }},
        {"mul_sigmoid",
         [](HostMesh& m, const OpArgs& a) {
           return one(m.each(
               [&](uint32_t d) { return math::mul_sigmoid(rows(a.in(0), d), rows(a.in(1), d)); }));
         }},
        {"causal_conv1d_silu",
         [](HostMesh& m, const OpArgs& a) {
           uint32_t kernel = a.u32("kernel");
           const TensorView* carry = a.maybe(2);
           std::vector<Rows> outs, carries;
           for (uint32_t d = 0; d < a.in(0).meta.devices; ++d) {
             Rows xs = rows(a.in(0), d);
             Rows prev = carry == nullptr ? Rows(kernel - 1, xs.cols) : rows(*carry, d);
             auto pair = math::causal_conv1d_silu(xs, values(a.in(1), d), prev, kernel);
             outs.push_back(std::move(pair.first));
             carries.push_back(std::move(pair.second));
           }
           return two(m.tiles(outs), m.tiles(carries));
         }},
        {"delta_gates",
         [](HostMesh& m, const OpArgs& a) {
           const clef_tt_dtype gates = m.config_.gdn_gate_dtype;
           auto g = m.each([&](uint32_t d) {
             return kept(math::decay_gate(rows(a.in(0), d), values(a.in(2), d), values(a.in(3), d)),
                         gates);
           });
           auto beta =
               m.each([&](uint32_t d) { return kept(math::sigmoid_all(rows(a.in(1), d)), gates); });
           return two(std::move(g), std::move(beta));
         }},
        {"gated_delta_rule",
         [](HostMesh& m, const OpArgs& a) {
           DeltaSpec spec{a.u32("key_heads"), a.u32("value_heads"), a.u32("key_dim"),
                          a.u32("value_dim")};
           const TensorView* state = a.maybe(3);
           std::vector<Rows> outs, states;
           for (uint32_t d = 0; d < a.in(0).meta.devices; ++d) {
             Rows s = state == nullptr ? Rows(spec.value_heads * spec.key_dim, spec.value_dim)
                                       : rows(*state, d);
             auto pair = math::gated_delta_rule(rows(a.in(0), d), rows(a.in(1), d),
                                                rows(a.in(2), d), s, spec);
             outs.push_back(std::move(pair.first));
             states.push_back(kept(std::move(pair.second), m.config_.gdn_state_dtype));
           }
           return two(m.tiles(outs), m.tiles(states));
         }},
        {"gated_rms_norm",
         [](HostMesh& m, const OpArgs& a) {
           return one(m.each([&](uint32_t d) {
             return math::gated_rms_norm(rows(a.in(0), d), rows(a.in(1), d), values(a.in(2), d),
                                         a.u32("group"), a.f32("eps"));
           }));
         }},
        {"layer_norm",
         [](HostMesh& m, const OpArgs& a) {
           return one(m.each([&](uint32_t d) {
             return math::layer_norm(rows(a.in(0), d), values(a.in(1), d), values(a.in(2), d),
                                     a.f32("eps"));
           }));
         }},
        {"add_bias",
         [](HostMesh& m, const OpArgs& a) {
           return one(m.each(
               [&](uint32_t d) { return math::add_bias(rows(a.in(0), d), values(a.in(1), d)); }));
         }},
        {"gelu",
         [](HostMesh& m, const OpArgs& a) {
           auto kind = static_cast<clef_tt_gelu_kind>(a.u32("kind"));
           return one(m.each([&](uint32_t d) { return math::gelu(rows(a.in(0), d), kind); }));
         }},
        {"rotary",
         [](HostMesh& m, const OpArgs& a) {
           return one(m.each([&](uint32_t d) {
             return math::rotary(rows(a.in(0), d), rows(a.in(1), d), rows(a.in(2), d),
                                 a.u32("head_dim"));
           }));
         }},
        {"segment_attention",
         [](HostMesh& m, const OpArgs& a) {
           std::vector<Segment> segments;
           for (size_t i = 0; i + 1 < a.list.size(); i += 2) {
             segments.push_back({a.list[i], a.list[i + 1]});
           }
           return one(m.each([&](uint32_t d) {
             return math::segment_attention(rows(a.in(0), d), rows(a.in(1), d), rows(a.in(2), d),
                                            a.u32("heads"), a.u32("head_dim"), segments);
           }));
         }},
        {"fold_rows",
         [](HostMesh& m, const OpArgs& a) {
           uint32_t group = a.u32("group");
           return one(m.each([&](uint32_t d) {
             Rows x = rows(a.in(0), d);
             x.rows /= group;
             x.cols *= group;
             return x;
           }));
         }},
    };
    auto kernel = kernels.find(a.op.name);
    if (kernel == kernels.end()) {
      throw Error(CLEF_TT_UNSUPPORTED, std::string("the host backend has no op ") + a.op.name);
    }
    return kernel->second(*this, a);
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
