// Tensors across the binding as DLPack capsules: torch.utils.dlpack on the
// Python side, torch's stable ABI on the core's. _C so links no
// libtorch_python (whose C++ ABI changes with every torch release), and the
// capsules' deleters never need the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include "batchcast/common/batch.h"
#include "batchcast/tensor/tensor.h"

namespace batchcast::python {

// Whether `object` is a torch.Tensor.
bool is_tensor(pybind11::handle object);
// The core's tensor over a torch.Tensor's memory (no copy); it keeps the
// Python tensor's storage alive. Lazy conjugate and negative bits are
// resolved first (DLPack has none: it would hand over the unconjugated
// values). Throws InvalidArgument for a dtype or device batchcast cannot share.
Tensor tensor_from_python(pybind11::handle object);
// A torch.Tensor over the core tensor's memory (no copy).
pybind11::object tensor_to_python(Tensor tensor);
// A torch.Tensor over a view of the ring (no copy, no core tensor in
// between); it holds the view's slots until torch frees it.
pybind11::object view_to_python(RingView view);
// How tensors cross: "exchange" (torch's C exchange API, no Python call per
// tensor: torch 2.10 and later) or "capsules" (torch.utils.dlpack: a torch
// without that API, or BATCHCAST_DLPACK_CAPSULES set).
const char* crossing();

}  // namespace batchcast::python
