// Trace capture and replay for the mock-device kit, and the refusals chips make inside a capture
// (ffi/ttnn-mock/setup.sh builds it into DIR/lib/libclef_tt_trace_shim.so; env.sh preloads it).
//
// ttnn 0.81.1's traces crash in tt-metal's mock mode, and mock mode accepts inside a capture
// what chips refuse. This library defines functions of libtt_metal.so under their mangled names.
// libtt_metal calls them through its PLT or through vtables relocated by symbol, so a preloaded
// definition wins:
// - Buffer::address() const returns 0 for a null Buffer: at capture,
//   program_dispatch::assemble_device_commands asks for the address of the program's
//   kernel-binary buffer, which mock mode never allocates;
// - trace_dispatch::issue_trace_commands is a no-op: replay writes the trace's commands into a
//   hugepage command queue that mock mode lacks, and a mock device has nothing to run anyway;
// - FDMeshCommandQueue::record_begin / record_end (what MeshDevice::begin_mesh_trace and
//   end_mesh_trace call; mock mode runs the fast-dispatch queue) mark a queue as capturing. On a
//   capturing queue, host writes into device buffers, reads from them, event records, finishes
//   and program loads of a program-cache miss throw std::runtime_error, which ttnn's bindings
//   turn into Python's RuntimeError. Chips refuse them all (TT_FATAL in
//   FDMeshCommandQueue::write_shard_to_device, read_shard_from_device,
//   enqueue_record_event_helper and MeshWorkloadImpl::load_binaries); mock mode returns before
//   those checks. Queues are told apart as on chips: queue 1 may write while queue 0 captures.
//   A refusal leaves the capture open: end_trace_capture then release_trace close it.
//
// It is preloaded into every process of a shell, cargo and rustc included: nothing runs at load
// time, and each real function is looked up on its first call, in the loaded libtt_metal.so
// (dlopen RTLD_NOLOAD + dlsym; RTLD_NEXT does not see it, because Python loads ttnn RTLD_LOCAL).
// A function that cannot be found aborts the process with a message naming it.
// CLEF_TT_TRACE_SHIM_LOG=1 prints every interposed call to stderr (Buffer::address only when
// `this` is null).
//
// No tt-metal headers exist here. Each function is an extern "C" function whose name is the
// mangled one (so __func__ is the symbol to look up); classes are opaque pointers (`this` is the
// first argument on x86-64 System V, after the hidden result pointer of a function returning a
// class that is not trivially copyable), and arguments passed by value are laid out as the callee
// reads them (checked against the 0.81.1 disassembly).

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace {

// --- finding the real functions ------------------------------------------------------------------

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "clef-tt mock kit (trace shim): %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

int find_metal(struct dl_phdr_info* info, size_t, void* out) {
  const char* name = info->dlpi_name;
  if (name == nullptr || *name == '\0') return 0;
  const char* slash = std::strrchr(name, '/');
  if (std::strncmp(slash ? slash + 1 : name, "libtt_metal.so", 14) != 0) return 0;
  *static_cast<std::string*>(out) = name;
  return 1;
}

void* metal() {
  static void* const handle = [] {
    std::string path;
    dl_iterate_phdr(find_metal, &path);
    if (path.empty()) die("libtt_metal.so is not loaded in this process");
    void* h = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (h == nullptr) die("dlopen(" + path + ", RTLD_NOLOAD) failed: " + dlerror());
    return h;
  }();
  return handle;
}

// libtt_metal.so's definition of `symbol` (never this library's own).
void* real(const char* symbol, const char* readable) {
  dlerror();
  void* fn = dlsym(metal(), symbol);
  if (fn == nullptr) {
    const char* err = dlerror();
    die(std::string("libtt_metal.so has no ") + readable + " (" + symbol +
        "); the shim is written for ttnn 0.81.1" + (err ? std::string(": ") + err : ""));
  }
  Dl_info mine{}, found{};
  if (dladdr(reinterpret_cast<void*>(&die), &mine) && dladdr(fn, &found) &&
      mine.dli_fbase == found.dli_fbase) {
    die(std::string("dlsym found the shim's own ") + readable + ", not libtt_metal.so's");
  }
  return fn;
}

// The real function behind the interposer it is used in (looked up once, on the first call).
#define REAL(type, readable) static const auto fn = reinterpret_cast<type>(real(__func__, readable))

bool logging() {
  static const bool on = [] {
    const char* v = std::getenv("CLEF_TT_TRACE_SHIM_LOG");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// --- which command queues are capturing ----------------------------------------------------------

std::mutex queues_mutex;
std::unordered_set<const void*>* capturing_queues;  // created on first use, never freed
std::atomic<int> open_captures{0};

bool capturing(const void* queue) {
  if (open_captures.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lock(queues_mutex);
  return capturing_queues != nullptr && capturing_queues->count(queue) != 0;
}

void set_capturing(const void* queue, bool on) {
  std::lock_guard<std::mutex> lock(queues_mutex);
  if (capturing_queues == nullptr) {
    if (!on) return;
    capturing_queues = new std::unordered_set<const void*>();
  }
  bool changed = on ? capturing_queues->insert(queue).second : capturing_queues->erase(queue) != 0;
  if (changed) open_captures.fetch_add(on ? 1 : -1, std::memory_order_release);
}

void log_call(const char* call, const void* self, const void* queue) {
  if (logging()) {
    std::fprintf(stderr, "clef-tt trace shim: %s this=%p capturing=%d\n", call, self,
                 queue ? static_cast<int>(capturing(queue)) : -1);
  }
}

// --- refusals ------------------------------------------------------------------------------------

constexpr const char* kWrite = "a host write into a device buffer";
constexpr const char* kRead = "a read from a device buffer";
// What chips say (their TT_FATAL messages).
constexpr const char* kWrites = "Writes are not supported during trace capture";
constexpr const char* kReads = "Reads are not supported during trace capture";
constexpr const char* kEvents = "Event Synchronization is not supported during trace capture";
constexpr const char* kLoads =
    "Cannot load new binaries during trace capture. This program is not yet in program cache. "
    "Warm up before capturing a trace";

[[noreturn]] void refuse(const char* what, const char* call, const char* chips) {
  throw std::runtime_error(std::string("clef-tt mock kit: ") + what + " (" + call +
                           ") inside a trace capture; chips refuse it: " + chips);
}

// Throws if `queue` is capturing.
void gate(const void* queue, const char* what, const char* call, const char* chips) {
  log_call(call, queue, queue);
  if (capturing(queue)) refuse(what, call, chips);
}

// std::optional<tt::tt_metal::BufferRegion> ({offset, size} and the flag): 24 trivially copyable
// bytes, passed by value on the stack.
struct OptionalBufferRegion {
  uint64_t offset;
  uint64_t size;
  bool engaged;
};
static_assert(sizeof(OptionalBufferRegion) == 24);

// tt::xy_pair: two size_t, passed in two registers.
struct XyPair {
  size_t x;
  size_t y;
};

}  // namespace

extern "C" {

// --- the two crashes -----------------------------------------------------------------------------

// tt::tt_metal::Buffer::address() const
uint64_t _ZNK2tt8tt_metal6Buffer7addressEv(const void* self) {
  if (self == nullptr) {
    log_call("Buffer::address() of a null Buffer: 0", self, nullptr);
    return 0;
  }
  REAL(uint64_t (*)(const void*), "Buffer::address() const");
  return fn(self);
}

// tt::tt_metal::trace_dispatch::issue_trace_commands(MeshDevice*, SystemMemoryManager&,
//     TraceDispatchMetadata const&, unsigned char, std::array<unsigned, 8> const&, tt::xy_pair)
// A no-op: a mock device has no command queue to write the replay into, and nothing to run.
void _ZN2tt8tt_metal14trace_dispatch20issue_trace_commandsEPNS0_11distributed10MeshDeviceERNS0_19SystemMemoryManagerERKNS1_21TraceDispatchMetadataEhRKSt5arrayIjLm8EENS_7xy_pairE(
    void* mesh_device, void*, const void*, unsigned char, const void*, XyPair) {
  log_call("trace_dispatch::issue_trace_commands (no-op)", mesh_device, nullptr);
}

// --- capture begin and end -----------------------------------------------------------------------

// tt::tt_metal::distributed::FDMeshCommandQueue::record_begin(MeshTraceId const&,
//     std::shared_ptr<MeshTraceDescriptor> const&)
void _ZN2tt8tt_metal11distributed18FDMeshCommandQueue12record_beginERKN4ttsl10StrongTypeIjNS1_14MeshTraceIdTagEEERKSt10shared_ptrINS1_19MeshTraceDescriptorEE(
    void* self, const void* trace_id, const void* descriptor) {
  REAL(void (*)(void*, const void*, const void*), "FDMeshCommandQueue::record_begin");
  log_call("FDMeshCommandQueue::record_begin", self, self);
  fn(self, trace_id, descriptor);
  set_capturing(self, true);
}

// tt::tt_metal::distributed::FDMeshCommandQueue::record_end(): end_mesh_trace calls it before it
// writes the trace into the trace region, a write that must go through.
void _ZN2tt8tt_metal11distributed18FDMeshCommandQueue10record_endEv(void* self) {
  REAL(void (*)(void*), "FDMeshCommandQueue::record_end");
  log_call("FDMeshCommandQueue::record_end", self, self);
  set_capturing(self, false);
  fn(self);
}

// FDMeshCommandQueue's destructors (complete and deleting): a queue destroyed inside a capture
// (a mesh closed without end_trace_capture) must not leave its address marked.
void _ZN2tt8tt_metal11distributed18FDMeshCommandQueueD1Ev(void* self) {
  REAL(void (*)(void*), "FDMeshCommandQueue::~FDMeshCommandQueue");
  log_call("FDMeshCommandQueue::~FDMeshCommandQueue", self, self);
  set_capturing(self, false);
  fn(self);
}

void _ZN2tt8tt_metal11distributed18FDMeshCommandQueueD0Ev(void* self) {
  REAL(void (*)(void*), "FDMeshCommandQueue::~FDMeshCommandQueue (deleting)");
  log_call("FDMeshCommandQueue::~FDMeshCommandQueue (deleting)", self, self);
  set_capturing(self, false);
  fn(self);
}

// --- host writes into device buffers -------------------------------------------------------------
// MeshCommandQueueBase's entry points (virtual, reached through the queues' vtables) and the
// _nolock ones that tensor transfers call directly. The outermost one reached is named.

// enqueue_write(std::shared_ptr<MeshBuffer> const&, DistributedHostBuffer const&, bool)
void _ZN2tt8tt_metal11distributed20MeshCommandQueueBase13enqueue_writeERKSt10shared_ptrINS1_10MeshBufferEERKNS0_21DistributedHostBufferEb(
    void* self, const void* buffer, const void* host, bool blocking) {
  REAL(void (*)(void*, const void*, const void*, bool), "MeshCommandQueueBase::enqueue_write");
  gate(self, kWrite, "MeshCommandQueueBase::enqueue_write", kWrites);
  fn(self, buffer, host, blocking);
}

// enqueue_write_shards(std::shared_ptr<MeshBuffer> const&, std::vector<ShardDataTransfer> const&,
//     bool)
void _ZN2tt8tt_metal11distributed20MeshCommandQueueBase20enqueue_write_shardsERKSt10shared_ptrINS1_10MeshBufferEERKSt6vectorINS1_17ShardDataTransferESaIS9_EEb(
    void* self, const void* buffer, const void* shards, bool blocking) {
  REAL(void (*)(void*, const void*, const void*, bool),
       "MeshCommandQueueBase::enqueue_write_shards");
  gate(self, kWrite, "MeshCommandQueueBase::enqueue_write_shards", kWrites);
  fn(self, buffer, shards, blocking);
}

// enqueue_write_mesh_buffer(std::shared_ptr<MeshBuffer> const&, void const*, bool)
void _ZN2tt8tt_metal11distributed20MeshCommandQueueBase25enqueue_write_mesh_bufferERKSt10shared_ptrINS1_10MeshBufferEEPKvb(
    void* self, const void* buffer, const void* src, bool blocking) {
  REAL(void (*)(void*, const void*, const void*, bool),
       "MeshCommandQueueBase::enqueue_write_mesh_buffer");
  gate(self, kWrite, "MeshCommandQueueBase::enqueue_write_mesh_buffer", kWrites);
  fn(self, buffer, src, blocking);
}

// enqueue_write_shard_to_sub_grid(MeshBuffer const&, void const*, MeshCoordinateRange const&,
//     bool, std::optional<BufferRegion>)
void _ZN2tt8tt_metal11distributed20MeshCommandQueueBase31enqueue_write_shard_to_sub_gridERKNS1_10MeshBufferEPKvRKNS1_19MeshCoordinateRangeEbSt8optionalINS0_12BufferRegionEE(
    void* self, const void* buffer, const void* src, const void* range, bool blocking,
    OptionalBufferRegion region) {
  REAL(void (*)(void*, const void*, const void*, const void*, bool, OptionalBufferRegion),
       "MeshCommandQueueBase::enqueue_write_shard_to_sub_grid");
  gate(self, kWrite, "MeshCommandQueueBase::enqueue_write_shard_to_sub_grid", kWrites);
  fn(self, buffer, src, range, blocking, region);
}

// enqueue_write_with_core_filter(MeshBuffer&, DistributedHostBuffer const&, bool,
//     CoreRangeSet const*)
void _ZN2tt8tt_metal11distributed20MeshCommandQueueBase30enqueue_write_with_core_filterERNS1_10MeshBufferERKNS0_21DistributedHostBufferEbPKNS0_12CoreRangeSetE(
    void* self, void* buffer, const void* host, bool blocking, const void* cores) {
  REAL(void (*)(void*, void*, const void*, bool, const void*),
       "MeshCommandQueueBase::enqueue_write_with_core_filter");
  gate(self, kWrite, "MeshCommandQueueBase::enqueue_write_with_core_filter", kWrites);
  fn(self, buffer, host, blocking, cores);
}

// enqueue_write_shards_nolock(MeshBuffer&, std::vector<ShardDataTransfer> const&, bool,
//     CoreRangeSet const*)
void _ZN2tt8tt_metal11distributed20MeshCommandQueueBase27enqueue_write_shards_nolockERNS1_10MeshBufferERKSt6vectorINS1_17ShardDataTransferESaIS6_EEbPKNS0_12CoreRangeSetE(
    void* self, void* buffer, const void* shards, bool blocking, const void* cores) {
  REAL(void (*)(void*, void*, const void*, bool, const void*),
       "MeshCommandQueueBase::enqueue_write_shards_nolock");
  gate(self, kWrite, "MeshCommandQueueBase::enqueue_write_shards_nolock", kWrites);
  fn(self, buffer, shards, blocking, cores);
}

// --- reads from device buffers -------------------------------------------------------------------

// enqueue_read(std::shared_ptr<MeshBuffer> const&, DistributedHostBuffer&,
//     std::optional<std::unordered_set<MeshCoordinate>> const&, bool)
void _ZN2tt8tt_metal11distributed20MeshCommandQueueBase12enqueue_readERKSt10shared_ptrINS1_10MeshBufferEERNS0_21DistributedHostBufferERKSt8optionalISt13unordered_setINS1_14MeshCoordinateESt4hashISC_ESt8equal_toISC_ESaISC_EEEb(
    void* self, const void* buffer, void* host, const void* shards, bool blocking) {
  REAL(void (*)(void*, const void*, void*, const void*, bool),
       "MeshCommandQueueBase::enqueue_read");
  gate(self, kRead, "MeshCommandQueueBase::enqueue_read", kReads);
  fn(self, buffer, host, shards, blocking);
}

// enqueue_read_shards(std::vector<ShardDataTransfer> const&, std::shared_ptr<MeshBuffer> const&,
//     bool)
void _ZN2tt8tt_metal11distributed20MeshCommandQueueBase19enqueue_read_shardsERKSt6vectorINS1_17ShardDataTransferESaIS4_EERKSt10shared_ptrINS1_10MeshBufferEEb(
    void* self, const void* shards, const void* buffer, bool blocking) {
  REAL(void (*)(void*, const void*, const void*, bool),
       "MeshCommandQueueBase::enqueue_read_shards");
  gate(self, kRead, "MeshCommandQueueBase::enqueue_read_shards", kReads);
  fn(self, shards, buffer, blocking);
}

// enqueue_read_mesh_buffer(void*, std::shared_ptr<MeshBuffer> const&, bool)
void _ZN2tt8tt_metal11distributed20MeshCommandQueueBase24enqueue_read_mesh_bufferEPvRKSt10shared_ptrINS1_10MeshBufferEEb(
    void* self, void* dst, const void* buffer, bool blocking) {
  REAL(void (*)(void*, void*, const void*, bool), "MeshCommandQueueBase::enqueue_read_mesh_buffer");
  gate(self, kRead, "MeshCommandQueueBase::enqueue_read_mesh_buffer", kReads);
  fn(self, dst, buffer, blocking);
}

// enqueue_read_shards_nolock(std::vector<ShardDataTransfer> const&,
//     std::shared_ptr<MeshBuffer> const&, bool, std::vector<MemoryPin>)
// The vector taken by value is not trivially copyable: the caller passes its address (and
// destroys it after the call).
void _ZN2tt8tt_metal11distributed20MeshCommandQueueBase26enqueue_read_shards_nolockERKSt6vectorINS1_17ShardDataTransferESaIS4_EERKSt10shared_ptrINS1_10MeshBufferEEbS3_INS0_9MemoryPinESaISE_EE(
    void* self, const void* shards, const void* buffer, bool blocking, void* pins) {
  REAL(void (*)(void*, const void*, const void*, bool, void*),
       "MeshCommandQueueBase::enqueue_read_shards_nolock");
  gate(self, kRead, "MeshCommandQueueBase::enqueue_read_shards_nolock", kReads);
  fn(self, shards, buffer, blocking, pins);
}

// --- event records and finishes ------------------------------------------------------------------

// tt::tt_metal::distributed::FDMeshCommandQueue::enqueue_record_event_helper(
//     std::span<SubDeviceId const>, bool notify_host, std::optional<MeshCoordinateRange> const&)
// Behind record_event and record_event_to_host. It returns a MeshEvent (not trivially copyable)
// through a hidden pointer, which comes before `this` and goes back in rax.
void* _ZN2tt8tt_metal11distributed18FDMeshCommandQueue27enqueue_record_event_helperESt4spanIKN4ttsl10StrongTypeIhNS0_14SubDeviceIdTagEEELm18446744073709551615EEbRKSt8optionalINS1_19MeshCoordinateRangeEE(
    void* result, void* self, const void* ids, size_t n_ids, bool notify_host, const void* range) {
  REAL(void* (*)(void*, void*, const void*, size_t, bool, const void*),
       "FDMeshCommandQueue::enqueue_record_event_helper");
  gate(self, "an event record (record_event)", "FDMeshCommandQueue::enqueue_record_event_helper",
       kEvents);
  return fn(result, self, ids, n_ids, notify_host, range);
}

// tt::tt_metal::distributed::FDMeshCommandQueue::finish_nolock(std::span<SubDeviceId const>)
// Behind finish (synchronize_device). On chips it records an event to the host through the
// helper above, which refuses inside a capture; in mock mode it returns before.
void _ZN2tt8tt_metal11distributed18FDMeshCommandQueue13finish_nolockESt4spanIKN4ttsl10StrongTypeIhNS0_14SubDeviceIdTagEEELm18446744073709551615EE(
    void* self, const void* ids, size_t n_ids) {
  REAL(void (*)(void*, const void*, size_t), "FDMeshCommandQueue::finish_nolock");
  gate(self, "a finish (synchronize_device)", "FDMeshCommandQueue::finish_nolock", kEvents);
  fn(self, ids, n_ids);
}

// --- program loads -------------------------------------------------------------------------------

// tt::tt_metal::distributed::MeshWorkloadImpl::load_binaries(MeshCommandQueue&)
// EnqueueMeshWorkload calls it for every workload it enqueues, cached or not. What chips refuse is
// a workload whose binaries were never sent to this mesh device (a program-cache miss):
// get_program_binary_status(mesh device id) is NotSent (0, also for an id it has never seen).
// The queue's mesh device is its first member (load_binaries itself reads it there).
void _ZN2tt8tt_metal11distributed16MeshWorkloadImpl13load_binariesERNS1_16MeshCommandQueueE(
    void* self, void* queue) {
  REAL(void (*)(void*, void*), "MeshWorkloadImpl::load_binaries");
  static const auto status = reinterpret_cast<uint8_t (*)(const void*, uint64_t)>(
      real("_ZNK2tt8tt_metal11distributed16MeshWorkloadImpl25get_program_binary_statusEm",
           "MeshWorkloadImpl::get_program_binary_status"));
  static const auto mesh_id = reinterpret_cast<int (*)(const void*)>(
      real("_ZNK2tt8tt_metal11distributed10MeshDevice2idEv", "MeshDevice::id() const"));
  log_call("MeshWorkloadImpl::load_binaries", self, queue);
  if (capturing(queue)) {
    const void* mesh_device = *reinterpret_cast<void* const*>(static_cast<char*>(queue) + 8);
    if (status(self, static_cast<uint64_t>(static_cast<int64_t>(mesh_id(mesh_device)))) == 0) {
      refuse("a program load (a program-cache miss)", "MeshWorkloadImpl::load_binaries", kLoads);
    }
  }
  fn(self, queue);
}

}  // extern "C"
