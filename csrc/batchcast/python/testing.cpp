#include "batchcast/python/testing.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "batchcast/cuda/runtime.h"
#include "batchcast/cuda/simulated_runtime.h"
#include "batchcast/cuda/transport.h"
#include "batchcast/producer/join_plan.h"
#include "batchcast/python/dlpack.h"

namespace py = pybind11;

namespace batchcast {

namespace {

// A stream of the simulated device that checks bytes in stream order: what a
// kernel reading a batch on a GPU stream is to the real device. It keeps no
// reference to the tensors it checks (only their address), so a batch can be
// dropped while its check is still queued, as a trainer drops a batch while
// its GPU work is still queued.
class CheckingStream {
 public:
  struct Counts {
    std::atomic<int64_t> checks{0};
    std::atomic<int64_t> mismatches{0};
  };
  explicit CheckingStream(int64_t delay_us) : delay_us_(delay_us), counts_(std::make_shared<Counts>()) {
    if (!cuda::simulating()) throw py::value_error("_testing.Stream() needs the simulated device");
    stream_ = cuda::runtime().stream_create();
  }
  ~CheckingStream() { cuda::runtime().stream_destroy(stream_); }

  void enter() {
    previous_.push_back(cuda::simulated::current_stream());
    cuda::simulated::set_current_stream(stream_);
  }
  void exit() {
    cuda::simulated::set_current_stream(previous_.empty() ? nullptr : previous_.back());
    if (!previous_.empty()) previous_.pop_back();
  }
  void check(py::handle tensor, py::handle expected_tensor) {
    const Tensor t = python::tensor_from_python(tensor);
    const Tensor expected = python::tensor_from_python(expected_tensor);
    if (!t.is_contiguous() || nbytes(t) != nbytes(expected) || t.scalar_type() != expected.scalar_type()) {
      throw py::value_error("check(): a contiguous tensor and an expected tensor of its dtype and size");
    }
    const void* at_address = t.data_ptr();
    Tensor want = clone(expected);
    auto counts = counts_;
    if (delay_us_ > 0) {  // this stream falls behind the host, as under a long kernel
      const int64_t us = delay_us_;
      cuda::runtime().launch_host_function(stream_, [us] { std::this_thread::sleep_for(std::chrono::microseconds(us)); });
    }
    cuda::runtime().launch_host_function(stream_, [at_address, want, counts] {
      counts->checks += 1;
      if (std::memcmp(at_address, want.data_ptr(), nbytes(want)) != 0) counts->mismatches += 1;
    });
  }
  void synchronize() { cuda::runtime().stream_synchronize(stream_); }
  int64_t checks() const { return counts_->checks; }
  int64_t mismatches() const { return counts_->mismatches; }

 private:
  cuda::Stream stream_ = nullptr;
  int64_t delay_us_;
  std::shared_ptr<Counts> counts_;
  std::vector<cuda::Stream> previous_;
};

}  // namespace

void bind_testing(py::module_& m) {
  py::module_ sim = m.def_submodule(
      "_testing", "Hooks of batchcast's own tests, not its API: the simulated CUDA device (set "
      "BATCHCAST_SIMULATED_CUDA before import)");
  sim.def("active", &cuda::simulating, "Whether this process runs on the simulated device");
  sim.def("current_context", &cuda::simulated::current_context_id,
          "The calling thread's current context: 0 none, else 1 + its device");
  sim.def("pinned_empty",
          [](int64_t bytes) {
            if (bytes <= 0) throw py::value_error("pinned_empty(bytes): bytes must be positive");
            void* p = cuda::simulated::take_pinned(static_cast<uint64_t>(bytes));
            return python::tensor_to_python(
                wrap(p, {bytes}, ScalarType::Byte, cpu_device(), [p] { cuda::simulated::give_back_pinned(p); }));
          },
          "A uint8 tensor of pinned memory, whose block is handed out again as soon as it is freed");
  py::class_<CheckingStream>(sim, "Stream")
      .def(py::init<int64_t>(), py::arg("delay_us") = 0,
           "A stream on which each check starts delay_us later than it would")
      .def("__enter__", [](CheckingStream& s) -> CheckingStream& { s.enter(); return s; },
           py::return_value_policy::reference)
      .def("__exit__", [](CheckingStream& s, py::args) { s.exit(); })
      .def("check", &CheckingStream::check, py::arg("tensor"), py::arg("expected"),
           "Queues a comparison of the tensor's bytes (by address) with expected's")
      .def("synchronize", [](CheckingStream& s) {
        py::gil_scoped_release release;
        s.synchronize();
      })
      .def_property_readonly("checks", &CheckingStream::checks)
      .def_property_readonly("mismatches", &CheckingStream::mismatches);
  // The producer's join plan alone, to test the order it gives a loader.
  py::class_<JoinPlan>(sim, "JoinPlan")
      .def(py::init([](bool join_now, int64_t samples, int64_t batches, int64_t epochs) {
             return JoinPlan(JoinPlanOptions{join_now, samples, batches, epochs});
           }),
           py::arg("join_now"), py::arg("samples_per_epoch"), py::arg("batches_per_epoch"),
           py::arg("epochs") = -1)
      .def("joined", [](JoinPlan& p, uint64_t member, int64_t joined_at) {
             p.joined(member, Frame{0, joined_at, 0});
           },
           py::arg("member"), py::arg("joined_at"), "A trainer present whose epochs begin at `joined_at`")
      .def("left", &JoinPlan::left, py::arg("member"))
      .def("steer", &JoinPlan::steer, py::arg("epoch"))
      .def("order", &JoinPlan::order, py::arg("fresh"));
}


}  // namespace batchcast
