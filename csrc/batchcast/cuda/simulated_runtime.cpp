// The simulated device behind cuda::Runtime (simulated_runtime.h says what it
// models): its contexts, memory, IPC handles, and the calls on its streams and
// events (simulated_stream.h: what a stream and an event are); its options
// and visible devices are in simulated_options.cpp. Host-only code: it builds
// everywhere, with or without the toolkit.
#include "batchcast/cuda/simulated_runtime.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "batchcast/common/error.h"
#include "batchcast/common/fd.h"
#include "batchcast/cuda/simulated_stream.h"
#include "batchcast/protocol/message.h"

namespace batchcast::cuda {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMemoryMagic[8] = {'b', 'c', 's', 'i', 'm', 'm', 'e', 'm'};
constexpr char kEventMagic[8] = {'b', 'c', 's', 'i', 'm', 'e', 'v', 't'};
constexpr int kEvents = 1 << 14;  // events one process can have at once
constexpr std::size_t kTableHeader = 4096;

[[noreturn]] void fail(const char* call, const char* error, const std::string& why) {
  throw CudaError(std::string("batchcast: ") + call + " failed: " + error + " (simulated device: " + why + ")");
}

using simulated::complete;
using simulated::EventState;
using simulated::SimEvent;
using simulated::SimStream;
using simulated::visible_devices;
using simulated::wait_for;

thread_local void* t_context = nullptr;  // the calling thread's current context
thread_local int t_device = 0;           // the runtime's remembered device
thread_local Stream t_stream = nullptr;  // the current stream (torch's, on a GPU)

simulated::Options seen(simulated::Options options, const std::vector<int>& visible) {
  options.devices = static_cast<int>(visible.size());
  return options;
}

class SimulatedRuntime final : public Runtime {
 public:
  explicit SimulatedRuntime(simulated::Options options)
      : physical_(visible_devices(options.devices)),
        options_(seen(options, physical_)),
        rng_(options.seed * 1000003u + static_cast<uint64_t>(::getpid())) {}

  bool built() const override { return true; }
  bool simulated() const override { return true; }
  bool device_memory_on_host() const override { return true; }
  Stream current_stream() override { return t_stream; }
  void* stream_alloc(uint64_t bytes) override { return simulated::stream_alloc(bytes); }
  int device_count() noexcept override { return options_.devices; }

  std::string device_uuid(int device) override {
    valid_device(device, "cudaGetDeviceProperties");
    std::string uuid = "simulated-gpu";
    uuid.resize(protocol::kUuidBytes, '\0');
    uuid.back() = static_cast<char>(physical_[static_cast<std::size_t>(device)]);  // as the machine numbers it
    return uuid;
  }

  bool can_access_peer(int device, int peer) override {
    valid_device(device, "cudaDeviceCanAccessPeer");
    valid_device(peer, "cudaDeviceCanAccessPeer");
    return device != peer;
  }

  bool context_switching() noexcept override { return true; }
  bool current_context(void** context) noexcept override {
    *context = t_context;
    return true;
  }
  bool set_current_context(void* context) noexcept override {
    if (context != nullptr && context_device(context) < 0) return false;
    t_context = context;
    return true;
  }
  void* primary_context(int device) noexcept override {
    if (device < 0 || device >= options_.devices) return nullptr;
    return &primaries_[device];
  }
  bool current_device(int* device) noexcept override {
    *device = t_context != nullptr ? context_device(t_context) : t_device;
    return true;
  }
  void set_device(int device) override {
    valid_device(device, "cudaSetDevice");
    t_device = device;
    t_context = primary_context(device);
  }

  void* device_alloc(uint64_t bytes) override {
    need_context();
    Fd fd(::memfd_create("batchcast-simulated-gpu", MFD_CLOEXEC));
    if (!fd.valid()) throw SystemError("memfd_create (simulated GPU memory)", errno);
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
      fail("cudaMalloc", "cudaErrorMemoryAllocation", "ftruncate: " + std::string(std::strerror(errno)));
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) fail("cudaMalloc", "cudaErrorMemoryAllocation", "mmap failed");
    std::lock_guard<std::mutex> lock(mu_);
    device_.emplace(static_cast<std::byte*>(p), Allocation{std::move(fd), Mapping(p, bytes)});
    return p;
  }

  void device_free(void* memory) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    device_.erase(static_cast<std::byte*>(memory));
  }

  void* host_alloc(uint64_t bytes) override {
    need_context();
    const uint64_t size = std::max<uint64_t>(4096, (bytes + 4095) / 4096 * 4096);
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail("cudaHostAlloc", "cudaErrorMemoryAllocation", "mmap failed");
    std::lock_guard<std::mutex> lock(mu_);
    pinned_[static_cast<std::byte*>(p)] = size;
    return p;
  }

  void host_free(void* memory) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pinned_.find(static_cast<std::byte*>(memory));
    if (it == pinned_.end()) return;
    ::munmap(it->first, it->second);
    pinned_.erase(it);
  }

  bool is_pinned(const void* memory) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    return find(pinned_, static_cast<const std::byte*>(memory), 1) ||
           find(registered_, static_cast<const std::byte*>(memory), 1);
  }

  void host_register(void* memory, uint64_t bytes) override {
    need_context();
    std::lock_guard<std::mutex> lock(mu_);
    const auto* p = static_cast<const std::byte*>(memory);
    if (bytes == 0 || find(registered_, p, 1) || find(registered_, p + bytes - 1, 1) ||
        find(pinned_, p, 1)) {
      fail("cudaHostRegister", "cudaErrorHostMemoryAlreadyRegistered", "already pinned");
    }
    registered_[static_cast<std::byte*>(memory)] = bytes;
  }

  void host_unregister(void* memory) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    registered_.erase(static_cast<std::byte*>(memory));
  }

  Stream stream_create() override {
    need_context();
    auto* stream = new SimStream([this] { delay(); });
    std::lock_guard<std::mutex> lock(mu_);
    streams_.insert(stream);
    return stream;
  }

  void stream_destroy(Stream stream) noexcept override {
    auto* s = static_cast<SimStream*>(stream);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (streams_.erase(s) == 0) return;
    }
    delete s;  // runs what is queued first
  }

  void stream_synchronize(Stream stream) override {
    need_context();
    if (stream != nullptr) static_cast<SimStream*>(stream)->synchronize();
  }

  void stream_wait(Stream stream, Event event) override {
    need_context();
    const SimEvent e = *static_cast<SimEvent*>(event);
    const uint32_t record = e.state->recorded.load();  // the latest record, as of this call
    run_on(stream, [e, record] { wait_for(e, record); }, /*delayed=*/false);
  }

  void launch_host_function(Stream stream, std::function<void()> fn) override {
    need_context();
    run_on(stream, std::move(fn), /*delayed=*/true);
  }

  Event event_create(unsigned) override {
    need_context();
    std::lock_guard<std::mutex> lock(mu_);
    if (!table_.data()) create_table();
    if (free_events_.empty()) fail("cudaEventCreate", "cudaErrorMemoryAllocation", "too many events");
    const int index = free_events_.back();
    free_events_.pop_back();
    EventState* state = table_state(table_.data(), index);
    // A fresh event: never recorded, so a wait on it is a no-op.
    state->recorded.store(0);
    state->completed.store(0);
    return new SimEvent{state, ::getpid(), index, false};
  }

  void event_destroy(Event event) noexcept override {
    std::unique_ptr<SimEvent> e(static_cast<SimEvent*>(event));
    if (!e || e->imported) return;
    std::lock_guard<std::mutex> lock(mu_);
    free_events_.push_back(e->index);
  }

  void event_record(Event event, Stream stream) override {
    need_context();
    EventState* state = static_cast<SimEvent*>(event)->state;
    const uint32_t record = state->recorded.fetch_add(1) + 1;
    run_on(stream, [state, record] { complete(state, record); }, /*delayed=*/false);
  }

  void event_synchronize(Event event) override {
    need_context();
    const SimEvent& e = *static_cast<SimEvent*>(event);
    wait_for(e, e.state->recorded.load());
  }

  void copy_async(void* dst, const void* src, uint64_t bytes, Copy kind, Stream stream) override {
    need_context();
    const auto* from = static_cast<const std::byte*>(src);
    auto* to = static_cast<std::byte*>(dst);
    {
      std::lock_guard<std::mutex> lock(mu_);
      const bool to_device = kind != Copy::DeviceToHost;
      const bool from_device = kind != Copy::HostToDevice;
      if ((to_device && !find(device_, to, bytes)) ||
          (from_device && !find(device_, from, bytes) && !find(imported_, from, bytes))) {
        fail("cudaMemcpyAsync", "cudaErrorInvalidValue",
             "a copy of " + std::to_string(bytes) + " bytes outside every device allocation");
      }
    }
    run_on(stream, [to, from, bytes] { std::memcpy(to, from, bytes); }, /*delayed=*/true);
  }

  void device_synchronize() override {
    need_context();
    std::vector<SimStream*> streams;
    {
      std::lock_guard<std::mutex> lock(mu_);
      streams.assign(streams_.begin(), streams_.end());
    }
    for (SimStream* s : streams) s->synchronize();
  }

  std::string memory_handle(void* device_memory) override {
    need_context();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = device_.find(static_cast<std::byte*>(device_memory));
    if (it == device_.end()) fail("cudaIpcGetMemHandle", "cudaErrorInvalidValue", "not an allocation");
    return handle(kMemoryMagic, it->second.fd.get(), it->second.mapping.size());
  }

  void* open_memory_handle(const std::string& h) override {
    need_context();
    auto [pid, fd, bytes] = parse(h, kMemoryMagic, "cudaIpcOpenMemHandle");
    // As cudaIpcOpenMemHandle: readable and writable (nothing protects it).
    Mapping m = map_from(pid, fd, bytes, "cudaIpcOpenMemHandle", PROT_READ | PROT_WRITE);
    std::byte* base = m.data();
    std::lock_guard<std::mutex> lock(mu_);
    imported_.emplace(base, std::move(m));
    return base;
  }

  void close_memory_handle(void* memory) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    imported_.erase(static_cast<std::byte*>(memory));
  }

  std::string event_handle(Event event) override {
    need_context();
    const SimEvent& e = *static_cast<SimEvent*>(event);
    if (e.imported) fail("cudaIpcGetEventHandle", "cudaErrorInvalidResourceHandle", "an imported event");
    std::lock_guard<std::mutex> lock(mu_);
    return handle(kEventMagic, table_fd_.get(), static_cast<uint64_t>(e.index));
  }

  Event open_event_handle(const std::string& h) override {
    need_context();
    auto [pid, fd, index] = parse(h, kEventMagic, "cudaIpcOpenEventHandle");
    if (index >= static_cast<uint64_t>(kEvents)) {
      fail("cudaIpcOpenEventHandle", "cudaErrorInvalidValue", "no such event");
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_pair(pid, fd);
    auto it = tables_.find(key);
    if (it == tables_.end()) {
      it = tables_.emplace(key, map_from(pid, fd, table_bytes(), "cudaIpcOpenEventHandle", PROT_READ | PROT_WRITE))
               .first;
    }
    return new SimEvent{table_state(it->second.data(), static_cast<int>(index)), pid, static_cast<int>(index),
                        true};
  }

  // Test hooks (simulated_runtime.h).
  void* take_pinned(uint64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = cached_.rbegin(); it != cached_.rend(); ++it) {
        if (pinned_.at(static_cast<std::byte*>(*it)) >= bytes) {
          void* p = *it;
          cached_.erase(std::next(it).base());
          return p;
        }
      }
    }
    return host_alloc(bytes);
  }
  void give_back_pinned(void* memory) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    cached_.push_back(memory);
  }
  void stream_free(void* memory, Stream stream) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto* s = static_cast<SimStream*>(stream);
      if (s != nullptr && streams_.count(s) != 0) {
        try {
          s->push([memory] { std::free(memory); }, /*delayed=*/false);
          return;
        } catch (...) {  // no memory to queue it: free it now (as the stream is gone)
        }
      }
    }
    std::free(memory);
  }
  uint64_t context_id(void* context) const {
    return context == nullptr ? 0 : static_cast<uint64_t>(context_device(context)) + 1;
  }

 private:
  struct Allocation {
    Fd fd;
    Mapping mapping;
  };

  template <typename Map>
  static bool find(const Map& map, const std::byte* p, uint64_t bytes) {
    auto it = map.upper_bound(const_cast<std::byte*>(p));
    if (it == map.begin()) return false;
    --it;
    const uint64_t size = size_of(it->second);
    const auto offset = static_cast<uint64_t>(p - it->first);
    return offset <= size && bytes <= size - offset;
  }
  static uint64_t size_of(const Allocation& a) { return a.mapping.size(); }
  static uint64_t size_of(const Mapping& m) { return m.size(); }
  static uint64_t size_of(uint64_t bytes) { return bytes; }

  void valid_device(int device, const char* call) const {
    if (device < 0 || device >= options_.devices) {
      fail(call, "cudaErrorInvalidDevice", "cuda:" + std::to_string(device) + " with " +
                                               std::to_string(options_.devices) + " simulated device(s)");
    }
  }

  int context_device(void* context) const {
    const auto* c = static_cast<const char*>(context);
    if (c < primaries_ || c >= primaries_ + options_.devices) return -1;
    return static_cast<int>(c - primaries_);
  }

  // As the real runtime: a call made with no current context binds the
  // current device's primary context and leaves it current.
  void need_context() {
    if (t_context == nullptr) t_context = primary_context(t_device);
  }

  void delay() {
    int64_t us = 0;
    {
      std::lock_guard<std::mutex> lock(rng_mu_);
      if (options_.max_delay_us > 0) us = static_cast<int64_t>(rng_() % (options_.max_delay_us + 1));
    }
    if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
  }

  // The default stream runs an operation at once, in the calling thread.
  static void run_on(Stream stream, std::function<void()> op, bool delayed) {
    if (stream == nullptr) {
      op();
      return;
    }
    static_cast<SimStream*>(stream)->push(std::move(op), delayed);
  }

  static std::size_t table_bytes() { return kTableHeader + kEvents * sizeof(EventState); }
  static EventState* table_state(std::byte* table, int index) {
    return reinterpret_cast<EventState*>(table + kTableHeader) + index;
  }

  void create_table() {
    table_fd_ = Fd(::memfd_create("batchcast-simulated-events", MFD_CLOEXEC));
    if (!table_fd_.valid()) throw SystemError("memfd_create (simulated events)", errno);
    if (::ftruncate(table_fd_.get(), static_cast<off_t>(table_bytes())) != 0) {
      throw SystemError("ftruncate (simulated events)", errno);
    }
    void* p = ::mmap(nullptr, table_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, table_fd_.get(), 0);
    if (p == MAP_FAILED) throw SystemError("mmap (simulated events)", errno);
    table_ = Mapping(p, table_bytes());
    for (int i = kEvents - 1; i >= 0; --i) free_events_.push_back(i);
  }

  static std::string handle(const char* magic, int fd, uint64_t value) {
    std::string h(protocol::kHandleBytes, '\0');
    const int64_t pid = ::getpid();
    const int64_t fd64 = fd;
    std::memcpy(h.data(), magic, 8);
    std::memcpy(h.data() + 8, &pid, 8);
    std::memcpy(h.data() + 16, &fd64, 8);
    std::memcpy(h.data() + 24, &value, 8);
    return h;
  }

  static std::tuple<int64_t, int, uint64_t> parse(const std::string& h, const char* magic, const char* call) {
    if (h.size() != protocol::kHandleBytes || std::memcmp(h.data(), magic, 8) != 0) {
      fail(call, "cudaErrorInvalidValue", "not a handle of the simulated device");
    }
    int64_t pid = 0, fd = 0;
    uint64_t value = 0;
    std::memcpy(&pid, h.data() + 8, 8);
    std::memcpy(&fd, h.data() + 16, 8);
    std::memcpy(&value, h.data() + 24, 8);
    if (pid == ::getpid()) {
      // As on a GPU: IPC handles open only in another process.
      fail(call, "cudaErrorInvalidContext", "a handle opened in the process that exported it");
    }
    return {pid, static_cast<int>(fd), value};
  }

  static Mapping map_from(int64_t pid, int fd, uint64_t bytes, const char* call, int prot = PROT_READ) {
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
    Fd file;
    do {
      file = Fd(::open(path.c_str(), ((prot & PROT_WRITE) ? O_RDWR : O_RDONLY) | O_CLOEXEC));
    } while (!file.valid() && errno == EINTR);
    if (!file.valid()) fail(call, "cudaErrorMapBufferObjectFailed", "cannot open " + path);
    struct stat st {};
    if (::fstat(file.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes) {
      fail(call, "cudaErrorInvalidValue", path + " is smaller than the handle says");
    }
    void* p = ::mmap(nullptr, bytes, prot, MAP_SHARED, file.get(), 0);
    if (p == MAP_FAILED) fail(call, "cudaErrorMapBufferObjectFailed", "mmap of " + path);
    return Mapping(p, bytes);
  }

  const std::vector<int> physical_;  // each visible device's number on the machine
  const simulated::Options options_; // devices: those visible
  char primaries_[8] = {};  // the devices' primary contexts (their addresses)
  std::mutex rng_mu_;
  std::mt19937_64 rng_;
  std::mutex mu_;
  std::map<std::byte*, Allocation> device_;   // this process's device memory
  std::map<std::byte*, Mapping> imported_;    // other processes' device memory
  std::map<std::byte*, uint64_t> pinned_;     // pinned host memory: base, bytes
  std::map<std::byte*, uint64_t> registered_;  // the caller's memory pinned in place
  std::vector<void*> cached_;                 // pinned blocks given back (take_pinned)
  std::set<SimStream*> streams_;
  Fd table_fd_;  // this process's events
  Mapping table_;
  std::vector<int> free_events_;
  std::map<std::pair<int64_t, int>, Mapping> tables_;  // other processes' events
};

SimulatedRuntime* g_simulated = nullptr;

SimulatedRuntime& active_simulation(const char* what) {
  if (!runtime().simulated()) {
    throw InvalidArgument(std::string(what) + " needs the simulated device (set BATCHCAST_SIMULATED_CUDA)");
  }
  return *g_simulated;
}

}  // namespace

Runtime& simulated_runtime(const std::string& spec) {
  static SimulatedRuntime* runtime = [&] {
    g_simulated = new SimulatedRuntime(simulated::parse_options(spec));  // never destroyed
    return g_simulated;
  }();
  return *runtime;
}

namespace simulated {

bool active() { return runtime().simulated(); }
Stream current_stream() { return t_stream; }
void set_current_stream(Stream stream) { t_stream = stream; }
void* take_pinned(uint64_t bytes) { return active_simulation("take_pinned").take_pinned(bytes); }
void give_back_pinned(void* memory) noexcept {
  if (g_simulated != nullptr) g_simulated->give_back_pinned(memory);
}
void* stream_alloc(uint64_t bytes) {
  void* p = std::malloc(std::max<uint64_t>(bytes, 1));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void stream_free(void* memory, Stream stream) noexcept {
  if (g_simulated != nullptr) {
    g_simulated->stream_free(memory, stream);
  } else {
    std::free(memory);
  }
}
uint64_t current_context_id() { return active_simulation("current_context_id").context_id(t_context); }
uint64_t primary_context_id(int device) {
  SimulatedRuntime& s = active_simulation("primary_context_id");
  return s.context_id(s.primary_context(device));
}

}  // namespace simulated
}  // namespace batchcast::cuda
