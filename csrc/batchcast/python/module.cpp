// batchcast._C: converts between Python objects and the C++ core. No logic
// lives here; the GIL is released around every call that can block.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "batchcast/common/error.h"
#include "batchcast/consumer/consumer.h"
#include "batchcast/cuda/transport.h"
#include "batchcast/producer/producer.h"

namespace py = pybind11;
using namespace batchcast;

namespace {

// Leaves travel to and from Python as a list whose items are either a tensor
// or a (kind, [str, ...]) tuple for a per-sample list.
std::vector<Leaf> leaves_from_python(const py::list& leaves) {
  std::vector<Leaf> out;
  out.reserve(leaves.size());
  for (const py::handle& item : leaves) {
    if (THPVariable_Check(item.ptr())) {
      out.emplace_back(THPVariable_Unpack(item.ptr()));
    } else {
      auto pair = item.cast<std::pair<int, std::vector<std::string>>>();
      if (pair.first != 1 && pair.first != 2) throw InvalidArgument("unknown list kind");
      out.emplace_back(Items{static_cast<ListKind>(pair.first), std::move(pair.second)});
    }
  }
  return out;
}

py::list leaves_to_python(std::vector<Leaf>& leaves) {
  py::list out;
  for (Leaf& leaf : leaves) {
    if (auto* t = std::get_if<at::Tensor>(&leaf)) {
      out.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(*t))));
    } else {
      auto& items = std::get<Items>(leaf);
      out.append(py::make_tuple(static_cast<int>(items.kind), py::cast(items.values)));
    }
  }
  return out;
}

py::dict producer_stats(const ProducerStats& s) {
  py::list consumers;
  for (const auto& c : s.consumers) {
    py::dict d;
    d["id"] = c.id;
    d["pid"] = c.pid;
    d["first_epoch"] = c.first_epoch;
    d["slots_held"] = c.slots_held;
    d["batches_sent"] = c.batches_sent;
    d["leaving"] = c.leaving;
    consumers.append(d);
  }
  py::dict d;
  d["batches_published"] = s.batches_published;
  d["bytes_published"] = s.bytes_published;
  d["publish_seconds"] = s.publish_seconds;
  d["wait_seconds"] = s.wait_seconds;
  d["joins"] = s.joins;
  d["leaves"] = s.leaves;
  d["crashes"] = s.crashes;
  d["evictions"] = s.evictions;
  d["refused"] = s.refused;
  d["dropped_messages"] = s.dropped_messages;
  d["ring_bytes"] = s.ring_bytes;
  d["ring_device"] = s.ring_device;
  d["slots_in_use"] = s.slots_in_use;
  d["consumers"] = consumers;
  return d;
}

py::dict consumer_stats(const ConsumerStats& s) {
  py::dict d;
  d["id"] = s.id;
  d["epoch"] = s.epoch;
  d["batches"] = s.batches;
  d["samples"] = s.samples;
  d["loader_batches"] = s.loader_batches;
  d["views"] = s.views;
  d["copies"] = s.copies;
  d["spills"] = s.spills;
  d["slots_held"] = s.slots_held;
  d["dropped_messages"] = s.dropped_messages;
  d["device"] = s.device;
  d["transfer"] = s.transfer;
  d["ipc_memory_opens"] = s.ipc_memory_opens;
  d["ipc_event_opens"] = s.ipc_event_opens;
  d["transfers"] = s.transfers;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "batchcast C++ core";
  m.attr("PROTOCOL_VERSION") = protocol::kVersion;

  // Base first: pybind11 tries the most recently registered translator first.
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  py::register_exception<ProducerLost>(m, "ProducerLost", error.ptr());
  py::register_exception<LoaderError>(m, "LoaderError", error.ptr());
  py::register_exception<NameInUse>(m, "NameInUse", error.ptr());
  py::register_exception<Refused>(m, "Refused", error.ptr());
  py::register_exception<RebatchError>(m, "RebatchError", error.ptr());
  py::register_exception<Stopped>(m, "Stopped", error.ptr());
  py::register_exception<Evicted>(m, "Evicted", error.ptr());
  py::register_exception<CudaError>(m, "CudaError", error.ptr());
  m.def("cuda_built", &cuda::built, "Whether this build has the CUDA transport");
  m.def("cuda_device_count", &cuda::device_count, "GPUs visible to this process (0 without a driver)");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  py::class_<Producer>(m, "Producer")
      .def(py::init([](const std::string& name, const std::string& runtime_dir, int64_t slots,
                       uint64_t ring_bytes, int64_t samples_per_epoch, double straggler_timeout,
                       int64_t catch_up_window, int cuda_device, double linger) {
             return std::make_unique<Producer>(ProducerOptions{name, runtime_dir, slots, ring_bytes,
                                                               samples_per_epoch, straggler_timeout,
                                                               catch_up_window, cuda_device, linger});
           }),
           py::arg("name"), py::arg("runtime_dir") = "", py::arg("slots") = 8,
           py::arg("ring_bytes") = 0, py::arg("samples_per_epoch") = -1,
           py::arg("straggler_timeout") = 0.0, py::arg("catch_up_window") = -1,
           py::arg("cuda_device") = -1, py::arg("linger") = 30.0)
      .def("wait_for_consumers", &Producer::wait_for_consumers, py::arg("count"),
           py::arg("timeout") = -1.0, py::call_guard<py::gil_scoped_release>())
      .def("begin_epoch", &Producer::begin_epoch)
      .def("publish",
           [](Producer& p, const py::list& leaves, const std::string& layout, int64_t samples) {
             Batch batch{0, samples, layout, leaves_from_python(leaves)};
             py::gil_scoped_release release;
             return p.publish(batch);  // seconds spent waiting for ring space
           })
      .def("end_epoch", &Producer::end_epoch)
      .def("fail", &Producer::fail)
      .def("finish", &Producer::finish, py::call_guard<py::gil_scoped_release>())
      .def("stop", &Producer::stop)
      .def("close", &Producer::close, py::call_guard<py::gil_scoped_release>())
      .def("stats", [](const Producer& p) { return producer_stats(p.stats()); })
      .def("consumer_count", &Producer::consumer_count)
      .def_property_readonly("endpoint", &Producer::endpoint);

  py::class_<Consumer>(m, "Consumer")
      .def(py::init([](const std::string& name, int64_t batch_size, bool drop_last, double timeout,
                       const std::string& runtime_dir, bool catch_up, const std::string& device,
                       int cuda_device) {
             Placement placement = Placement::Auto;
             if (device == "cpu") {
               placement = Placement::Host;
             } else if (device == "cuda") {
               placement = Placement::Cuda;
             } else if (!device.empty()) {
               throw InvalidArgument("device must be '', 'cpu' or 'cuda'");
             }
             py::gil_scoped_release release;
             return std::make_unique<Consumer>(ConsumerOptions{name, batch_size, drop_last, timeout,
                                                               catch_up, runtime_dir, placement,
                                                               cuda_device});
           }),
           py::arg("name"), py::arg("batch_size"), py::arg("drop_last") = false,
           py::arg("timeout") = 30.0, py::arg("runtime_dir") = "", py::arg("catch_up") = false,
           py::arg("device") = "", py::arg("cuda_device") = -1)
      .def("begin_epoch", &Consumer::begin_epoch, py::call_guard<py::gil_scoped_release>())
      .def("next",
           [](Consumer& c) -> py::object {
             std::optional<Batch> batch;
             {
               py::gil_scoped_release release;
               batch = c.next();
             }
             if (!batch) return py::none();
             return py::make_tuple(batch->layout, leaves_to_python(batch->leaves), batch->samples);
           })
      .def("close", &Consumer::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("finished", &Consumer::finished)
      .def_property_readonly("samples_per_epoch", &Consumer::samples_per_epoch)
      .def_property_readonly("batches_per_epoch", &Consumer::batches_per_epoch)
      .def("stats", [](const Consumer& c) { return consumer_stats(c.stats()); });
}
