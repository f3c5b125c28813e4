#include "batchcast/python/dlpack.h"

#include <Python.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "batchcast/common/error.h"
#include "batchcast/protocol/message.h"

namespace py = pybind11;

namespace batchcast::python {
namespace {

// ---- DLPack's C ABI (dlpack.h): the "dltensor" capsule of version 0.8,
// and version 1's managed tensor and C exchange API (DLPack 1.3), which torch
// offers as torch.Tensor.__dlpack_c_exchange_api__ ----
enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 };
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6 };
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};
struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  DLPackExchangeAPIHeader* prev_api;
};
// The two calls used: a torch.Tensor to an owning managed tensor, and an
// owning managed tensor (stolen) to a torch.Tensor; both return 0 or -1 with
// a Python exception set, and synchronize no stream.
struct DLPackExchangeAPI {
  DLPackExchangeAPIHeader header;
  void* managed_tensor_allocator;
  int (*managed_tensor_from_py_object_no_sync)(void* py_object, DLManagedTensorVersioned** out);
  int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersioned* tensor, void** out_py_object);
  void* dltensor_from_py_object_no_sync;
  void* current_work_stream;
};

constexpr const char* kCapsule = "dltensor";
constexpr const char* kUsedCapsule = "used_dltensor";

struct DTypeCode {
  ScalarType dtype;
  DLDataType code;
};
// From the one table of dtypes batchcast shares (protocol/message.h).
#define BATCHCAST_DTYPE_DLPACK(wire, bytes, name, scalar, code, bits) {ScalarType::scalar, {code, bits, 1}},
constexpr DTypeCode kDTypes[] = {BATCHCAST_DTYPES(BATCHCAST_DTYPE_DLPACK)};
#undef BATCHCAST_DTYPE_DLPACK

// torch's Python functions, looked up once (never released: they outlive
// the interpreter's finalization of this module).
// The C exchange API (torch 2.10 and later: no Python call per tensor) when
// this torch has one of DLPack's major version 1, else the capsule functions.
struct Torch {
  py::object tensor_type, to_dlpack, from_dlpack;
  const DLPackExchangeAPI* exchange = nullptr;
};
const Torch& torch_module() {
  static const Torch* torch = [] {
    py::module_ dlpack = py::module_::import("torch.utils.dlpack");
    auto* t = new Torch{py::module_::import("torch").attr("Tensor"), dlpack.attr("to_dlpack"),
                        dlpack.attr("from_dlpack")};
    if (std::getenv("BATCHCAST_DLPACK_CAPSULES") == nullptr &&
        py::hasattr(t->tensor_type, "__dlpack_c_exchange_api__")) {
      py::object api = t->tensor_type.attr("__dlpack_c_exchange_api__");
      if (PyCapsule_IsValid(api.ptr(), "dlpack_exchange_api")) {
        const auto* exchange =
            static_cast<const DLPackExchangeAPI*>(PyCapsule_GetPointer(api.ptr(), "dlpack_exchange_api"));
        if (exchange != nullptr && exchange->header.version.major == 1 &&
            exchange->managed_tensor_from_py_object_no_sync != nullptr &&
            exchange->managed_tensor_to_py_object_no_sync != nullptr) {
          t->exchange = exchange;  // lives as long as torch (the process)
        }
      }
      PyErr_Clear();
    }
    return t;
  }();
  return *torch;
}

}  // namespace

const char* crossing() { return torch_module().exchange != nullptr ? "exchange" : "capsules"; }

namespace {

// What torch takes over: what keeps the memory alive (a core tensor, or the
// ring slots of a view) and the shape and strides the DLTensor points to, in
// a managed tensor of either version. One allocation: the shape and strides
// of up to kInlineDims dimensions are kept inline.
struct Exported {
  static constexpr std::size_t kInlineDims = 6;

  DLManagedTensor managed{};
  DLManagedTensorVersioned versioned{};
  std::optional<Tensor> tensor;
  std::shared_ptr<const void> keep;

  explicit Exported(std::size_t ndim) : ndim_(ndim) {
    if (ndim > kInlineDims) heap_.resize(2 * ndim);
  }
  std::size_t ndim() const { return ndim_; }
  int64_t* shape() { return heap_.empty() ? inline_.data() : heap_.data(); }
  int64_t* strides() { return shape() + ndim_; }

 private:
  std::size_t ndim_;
  std::array<int64_t, 2 * kInlineDims> inline_{};
  std::vector<int64_t> heap_;  // beyond kInlineDims dimensions
};

void delete_exported(DLManagedTensor* managed) { delete static_cast<Exported*>(managed->manager_ctx); }
void delete_exported_versioned(DLManagedTensorVersioned* managed) {
  delete static_cast<Exported*>(managed->manager_ctx);
}

// A capsule never consumed (from_dlpack raised) frees what it holds.
void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsule)) return;  // consumed: torch owns it
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsule));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

}  // namespace

bool is_tensor(py::handle object) {
  return PyObject_IsInstance(object.ptr(), torch_module().tensor_type.ptr()) == 1;
}

namespace {

[[noreturn]] void cannot_share(py::handle object, const std::string& why) {
  throw InvalidArgument("batchcast cannot share this tensor (" + py::str(object.attr("dtype")).cast<std::string>() +
                        " on " + py::str(object.attr("device")).cast<std::string>() + "): " + why);
}

// The DLTensor as the core's tensor; give_back() runs once, when torch frees
// it (or at once when it cannot be wrapped).
Tensor import_dltensor(py::handle object, const DLTensor& t, std::function<void()> give_back);

}  // namespace

namespace {

// Whether tensor.NAME() is True: a bit of the tensor, read through its method
// (cheaper than resolving it always: two calls that dispatch an operator).
bool tensor_bit(py::handle tensor, const char* name) {
  PyObject* method = PyUnicode_InternFromString(name);  // interned: the same object each call
  if (method == nullptr) throw py::error_already_set();
  PyObject* result = PyObject_CallMethodNoArgs(tensor.ptr(), method);
  Py_DECREF(method);
  if (result == nullptr) throw py::error_already_set();
  const bool set = result == Py_True;
  Py_DECREF(result);
  return set;
}

}  // namespace

Tensor tensor_from_python(py::handle object) {
  const Torch& torch = torch_module();
  // DLPack has no place for torch's lazy conjugate and negative bits (an
  // export silently drops them): a tensor with one is resolved first.
  py::object resolved = py::reinterpret_borrow<py::object>(object);
  if (tensor_bit(resolved, "is_conj")) resolved = resolved.attr("resolve_conj")();
  if (tensor_bit(resolved, "is_neg")) resolved = resolved.attr("resolve_neg")();
  if (torch.exchange != nullptr) {
    DLManagedTensorVersioned* managed = nullptr;
    if (torch.exchange->managed_tensor_from_py_object_no_sync(resolved.ptr(), &managed) != 0 || managed == nullptr) {
      py::error_already_set error;
      cannot_share(object, error.what());
    }
    return import_dltensor(object, managed->dl_tensor, [managed] {
      if (managed->deleter != nullptr) managed->deleter(managed);
    });
  }
  py::object capsule;
  try {
    capsule = torch.to_dlpack(resolved);
  } catch (py::error_already_set& e) {
    cannot_share(object, e.what());
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsule));
  if (managed == nullptr) throw py::error_already_set();
  PyCapsule_SetName(capsule.ptr(), kUsedCapsule);  // ours now: its deleter runs once, below or with the tensor
  return import_dltensor(object, managed->dl_tensor, [managed] {
    if (managed->deleter != nullptr) managed->deleter(managed);
  });
}

namespace {

Tensor import_dltensor(py::handle object, const DLTensor& t, std::function<void()> give_back) {
  const DTypeCode* found = nullptr;
  for (const DTypeCode& d : kDTypes) {
    if (d.code.code == t.dtype.code && d.code.bits == t.dtype.bits && d.code.lanes == t.dtype.lanes) found = &d;
  }
  Device device = cpu_device();
  if (t.device.device_type == kDLCUDA) {
    device = cuda_device(t.device.device_id);
  } else if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost) {
    found = nullptr;
  }
  if (found == nullptr) {
    give_back();
    cannot_share(object, std::string("batchcast shares tensors of dtype ") + protocol::dtype_names() +
                             ", on the CPU or a CUDA GPU; convert it in the loader (tensor.view(torch.uint8) "
                             "keeps its bytes, without a copy)");
  }
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  const std::vector<int64_t> strides =
      t.strides != nullptr ? std::vector<int64_t>(t.strides, t.strides + t.ndim) : contiguous_strides(shape);
  void* data = static_cast<std::byte*>(t.data) + t.byte_offset;
  try {
    return wrap_strided(data, shape, strides, found->dtype, device, give_back);
  } catch (...) {
    give_back();
    throw;
  }
}

}  // namespace

namespace {

DLDataType dlpack_dtype(ScalarType dtype) {
  for (const DTypeCode& d : kDTypes) {
    if (d.dtype == dtype) return d.code;
  }
  throw InvalidArgument("batchcast cannot hand out tensors of dtype " + dtype_name(dtype));
}

DLDevice dlpack_device(const Device& device) {
  return DLDevice{device.is_cuda() ? kDLCUDA : kDLCPU, device.is_cuda() ? device.index() : 0};
}

// Hands `data` to torch as a torch.Tensor of e's shape and strides; `e`
// holds what keeps the memory alive, and torch frees it through its deleter.
py::object export_to_python(std::unique_ptr<Exported> exported, void* data, const Device& device, ScalarType dtype) {
  Exported& e = *exported;
  DLTensor& t = e.managed.dl_tensor;
  t.data = data;
  t.device = dlpack_device(device);
  t.ndim = static_cast<int32_t>(e.ndim());
  t.dtype = dlpack_dtype(dtype);
  t.shape = e.shape();
  t.strides = e.strides();
  t.byte_offset = 0;
  const Torch& torch = torch_module();
  if (torch.exchange != nullptr) {
    e.versioned.version = DLPackVersion{1, 0};
    e.versioned.manager_ctx = &e;
    e.versioned.deleter = &delete_exported_versioned;
    e.versioned.dl_tensor = t;
    void* out = nullptr;
    exported.release();  // torch's now: the call takes it over, failing or not (dlpack.h)
    if (torch.exchange->managed_tensor_to_py_object_no_sync(&e.versioned, &out) != 0 || out == nullptr) {
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(static_cast<PyObject*>(out));
  }
  e.managed.manager_ctx = &e;
  e.managed.deleter = &delete_exported;
  PyObject* capsule = PyCapsule_New(&e.managed, kCapsule, &capsule_destructor);
  if (capsule == nullptr) throw py::error_already_set();
  exported.release();  // the capsule's now
  return torch.from_dlpack(py::reinterpret_steal<py::object>(capsule));
}

}  // namespace

py::object tensor_to_python(Tensor tensor) {
  const auto sizes = tensor.sizes();
  const auto strides = tensor.strides();
  auto exported = std::make_unique<Exported>(sizes.size());
  std::copy(sizes.begin(), sizes.end(), exported->shape());
  std::copy(strides.begin(), strides.end(), exported->strides());
  void* data = tensor.data_ptr();
  const Device device = tensor.device();
  const ScalarType dtype = tensor.scalar_type();
  exported->tensor.emplace(std::move(tensor));
  return export_to_python(std::move(exported), data, device, dtype);
}

py::object view_to_python(RingView view) {
  const std::size_t ndim = view.shape.size();
  auto exported = std::make_unique<Exported>(ndim);
  int64_t* shape = exported->shape();
  int64_t* strides = exported->strides();
  std::copy(view.shape.begin(), view.shape.end(), shape);
  contiguous_strides(shape, ndim, strides);
  exported->keep = std::move(view.keep);
  return export_to_python(std::move(exported), view.data, view.device, view.dtype);
}

}  // namespace batchcast::python
