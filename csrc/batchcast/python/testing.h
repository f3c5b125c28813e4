// batchcast._C._testing: hooks that batchcast's own tests use (the simulated
// CUDA device, a stream that checks bytes in stream order). Fenced off from
// the module's API: nothing in the package uses it, and its stub says so.
// It lives in batchcast._C itself because it must share that module's
// simulated device.
#pragma once

#include <pybind11/pybind11.h>

namespace batchcast {

void bind_testing(pybind11::module_& m);

}  // namespace batchcast
