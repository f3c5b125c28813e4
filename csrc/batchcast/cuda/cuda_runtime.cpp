// The real CUDA runtime behind cuda::Runtime: each call is the libcudart call
// of the same name, its error turned into a CudaError that names the call.
// Compiled only where the CUDA toolkit (or torch's own CUDA runtime) is found.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "batchcast/common/error.h"
#include "batchcast/cuda/runtime.h"
#include "batchcast/protocol/message.h"

namespace batchcast::cuda {
namespace {

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state for the next call
    throw CudaError(std::string("batchcast: ") + call + " failed: " + cudaGetErrorName(status) + " (" +
                    cudaGetErrorString(status) + ")");
  }
}

cudaStream_t as_stream(Stream s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(Event e) { return static_cast<cudaEvent_t>(e); }

// The driver's context calls, through entry points the runtime hands out: this
// file links the runtime only.
using CUcontext = void*;
struct ContextCalls {
  int (*get)(CUcontext*) = nullptr;                  // cuCtxGetCurrent
  int (*set)(CUcontext) = nullptr;                   // cuCtxSetCurrent
  int (*device)(int*, int) = nullptr;                // cuDeviceGet
  int (*retain_primary)(CUcontext*, int) = nullptr;  // cuDevicePrimaryCtxRetain
  bool usable() const { return get && set && device && retain_primary; }
};

const ContextCalls& context_calls() {
  static const ContextCalls calls = [] {
    ContextCalls c;
    auto find = [](const char* name) -> void* {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult found{};
      if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
          found != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return nullptr;
      }
      return fn;
    };
    c.get = reinterpret_cast<int (*)(CUcontext*)>(find("cuCtxGetCurrent"));
    c.set = reinterpret_cast<int (*)(CUcontext)>(find("cuCtxSetCurrent"));
    c.device = reinterpret_cast<int (*)(int*, int)>(find("cuDeviceGet"));
    c.retain_primary = reinterpret_cast<int (*)(CUcontext*, int)>(find("cuDevicePrimaryCtxRetain"));
    return c;
  }();
  return calls;
}

class CudaRuntime final : public Runtime {
 public:
  bool built() const override { return true; }

  int device_count() noexcept override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }

  std::string device_uuid(int device) override {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    return std::string(reinterpret_cast<const char*>(prop.uuid.bytes), protocol::kUuidBytes);
  }

  bool can_access_peer(int device, int peer) override {
    int can = 0;
    check(cudaDeviceCanAccessPeer(&can, device, peer), "cudaDeviceCanAccessPeer");
    return can != 0;
  }

  bool context_switching() noexcept override { return context_calls().usable(); }

  bool current_context(void** context) noexcept override {
    const ContextCalls& calls = context_calls();
    return calls.get != nullptr && calls.get(context) == 0;
  }

  bool set_current_context(void* context) noexcept override {
    const ContextCalls& calls = context_calls();
    return calls.set != nullptr && calls.set(context) == 0;
  }

  // Retained once per device for the life of the process.
  void* primary_context(int device) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    if (device < 0) return nullptr;
    if (static_cast<std::size_t>(device) >= primary_.size()) primary_.resize(device + 1, nullptr);
    if (primary_[device] == nullptr) {
      const ContextCalls& calls = context_calls();
      int handle = 0;
      CUcontext ctx = nullptr;
      if (calls.usable() && calls.device(&handle, device) == 0 && calls.retain_primary(&ctx, handle) == 0) {
        primary_[device] = ctx;
      }
    }
    return primary_[device];
  }

  bool current_device(int* device) noexcept override {
    if (cudaGetDevice(device) == cudaSuccess) return true;
    cudaGetLastError();
    return false;
  }

  void set_device(int device) override { check(cudaSetDevice(device), "cudaSetDevice"); }

  void* device_alloc(uint64_t bytes) override {
    // Plain cudaMalloc: one allocation exported once, whatever allocator
    // settings torch runs with (expandable segments cannot be exported this way).
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc of the ring");
    return p;
  }
  void device_free(void* memory) noexcept override {
    cudaFree(memory);
    cudaGetLastError();
  }

  void* host_alloc(uint64_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc of the staging buffer");
    return p;
  }
  void host_free(void* memory) noexcept override {
    cudaFreeHost(memory);
    cudaGetLastError();
  }

  void host_register(void* memory, uint64_t bytes) override {
    check(cudaHostRegister(memory, bytes, cudaHostRegisterDefault), "cudaHostRegister of the workers' memory");
  }
  void host_unregister(void* memory) noexcept override {
    cudaHostUnregister(memory);
    cudaGetLastError();
  }

  // As torch's is_pinned(): what the driver says about the address.
  bool is_pinned(const void* memory) noexcept override {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, memory) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return attr.type == cudaMemoryTypeHost;
  }

  Stream stream_create() override {
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    return stream;
  }
  void stream_destroy(Stream stream) noexcept override {
    cudaStreamDestroy(as_stream(stream));
    cudaGetLastError();
  }
  void stream_synchronize(Stream stream) override {
    check(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
  }
  void stream_wait(Stream stream, Event event) override {
    check(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0), "cudaStreamWaitEvent");
  }

  void launch_host_function(Stream stream, std::function<void()> fn) override {
    auto* owned = new std::function<void()>(std::move(fn));
    const cudaError_t status = cudaLaunchHostFunc(
        as_stream(stream),
        [](void* data) {
          std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()>*>(data));
          (*f)();
        },
        owned);
    if (status != cudaSuccess) delete owned;
    check(status, "cudaLaunchHostFunc");
  }

  Event event_create(unsigned flags) override {
    unsigned cuda_flags = cudaEventDisableTiming;
    if (flags & kInterprocess) cuda_flags |= cudaEventInterprocess;
    if (flags & kBlockingSync) cuda_flags |= cudaEventBlockingSync;
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cuda_flags),
          (flags & kInterprocess) ? "cudaEventCreate (interprocess)" : "cudaEventCreate");
    return e;
  }
  void event_destroy(Event event) noexcept override {
    cudaEventDestroy(as_event(event));
    cudaGetLastError();
  }
  void event_record(Event event, Stream stream) override {
    check(cudaEventRecord(as_event(event), as_stream(stream)), "cudaEventRecord");
  }
  void event_synchronize(Event event) override {
    check(cudaEventSynchronize(as_event(event)), "cudaEventSynchronize");
  }

  void copy_async(void* dst, const void* src, uint64_t bytes, Copy kind, Stream stream) override {
    static constexpr cudaMemcpyKind kKinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToDevice,
                                                cudaMemcpyDeviceToHost};
    static constexpr const char* kCalls[] = {"cudaMemcpyAsync (host to device)",
                                             "cudaMemcpyAsync (device to device)",
                                             "cudaMemcpyAsync (device to host)"};
    const auto k = static_cast<int>(kind);
    check(cudaMemcpyAsync(dst, src, bytes, kKinds[k], as_stream(stream)), kCalls[k]);
  }

  void device_synchronize() override { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

  std::string memory_handle(void* device_memory) override {
    cudaIpcMemHandle_t h;
    check(cudaIpcGetMemHandle(&h, device_memory), "cudaIpcGetMemHandle");
    static_assert(sizeof(h) == protocol::kHandleBytes, "cudaIpcMemHandle_t size");
    return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
  }
  void* open_memory_handle(const std::string& handle) override {
    if (handle.size() != protocol::kHandleBytes) throw CudaError("batchcast: bad memory handle");
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    void* p = nullptr;
    check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    return p;
  }
  void close_memory_handle(void* memory) noexcept override {
    cudaIpcCloseMemHandle(memory);
    cudaGetLastError();
  }
  std::string event_handle(Event event) override {
    cudaIpcEventHandle_t h;
    check(cudaIpcGetEventHandle(&h, as_event(event)), "cudaIpcGetEventHandle");
    static_assert(sizeof(h) == protocol::kHandleBytes, "cudaIpcEventHandle_t size");
    return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
  }
  Event open_event_handle(const std::string& handle) override {
    if (handle.size() != protocol::kHandleBytes) throw CudaError("batchcast: bad event handle");
    cudaIpcEventHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    cudaEvent_t e = nullptr;
    check(cudaIpcOpenEventHandle(&e, h), "cudaIpcOpenEventHandle");
    return e;
  }

 private:
  std::mutex mu_;
  std::vector<CUcontext> primary_;
};

}  // namespace

Runtime& cuda_runtime() {
  static CudaRuntime* runtime = new CudaRuntime();  // never destroyed: used until exit
  return *runtime;
}

}  // namespace batchcast::cuda
