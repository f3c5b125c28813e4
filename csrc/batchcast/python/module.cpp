// batchcast._C: converts between Python objects and the C++ core, nothing
// more. Options cross as keyword arguments and statistics as dicts, both by
// one generic path (their visit() list, declared once: common/fields.h); errors keep their type; reports of the core
// reach the Python handler on the caller's thread; blocking calls release the
// GIL and check for signals about every 100 ms.
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cctype>
#include <cxxabi.h>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <array>
#include <string>
#include <vector>
#include <thread>
#include <type_traits>

#include <unistd.h>

#include "batchcast/common/error.h"
#include "batchcast/common/fork.h"
#include "batchcast/common/threads.h"
#include "batchcast/python/dlpack.h"
#include "batchcast/python/testing.h"
#include "batchcast/consumer/consumer.h"
#include "batchcast/cuda/runtime.h"
#include "batchcast/cuda/transport.h"
#include "batchcast/producer/producer.h"
#include "batchcast/protocol/message.h"

namespace py = pybind11;
using namespace batchcast;

namespace {

// ---- reports: queued from any thread, handed to Python on the caller's ----

py::object& report_handler() {
  static py::object* handler = new py::object();  // never destroyed: outlives finalization
  return *handler;
}

class ReportQueue {
 public:
  void push(const Report& r) {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() < 1000) queue_.push_back(r);  // bounded: a flood is not kept
    pending_ = true;
  }
  // With the GIL. The handler may raise (warnings as errors): that propagates.
  void flush() {
    if (!pending_.load(std::memory_order_relaxed)) return;
    std::deque<Report> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      out.swap(queue_);
      pending_ = false;
    }
    py::object& handler = report_handler();
    if (!handler) return;
    for (const Report& r : out) handler(static_cast<int>(r.level), r.kind, r.message);
  }

 private:
  std::mutex mu_;
  std::deque<Report> queue_;
  std::atomic<bool> pending_{false};
};

// Called from a blocked core call (GIL released) on the caller's thread.
std::function<void()> interrupt_hook(std::shared_ptr<ReportQueue> reports) {
  return [reports] {
    py::gil_scoped_acquire gil;
    reports->flush();
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  };
}

// ---- options in, statistics out ---------------------------------------------

// The constructors take every option as a keyword argument: the options'
// visit() list (their one declaration, common/fields.h) gives the names, the
// types each value is converted to and checked against, and the defaults.
// `options()` tells Python the same list, from which the stub's constructors
// are written and checked (scripts/stubs.py).
template <typename T>
struct PyType {
  static std::string name() {
    if constexpr (std::is_same_v<T, std::string>) return "str";
    else if constexpr (std::is_same_v<T, bool>) return "bool";
    else if constexpr (std::is_integral_v<T>) return "int";
    else if constexpr (std::is_floating_point_v<T>) return "float";
    else if constexpr (std::is_same_v<T, Placement>) return "Placement";
    else if constexpr (std::is_same_v<T, MappedRing::ReleaseAfter>) return "ReleaseAfter";
    else if constexpr (std::is_same_v<T, PadLeaves>) return "list[tuple[list[str], float]]";
    else static_assert(sizeof(T) == 0, "an option of a type the binding cannot name");
  }
};
template <typename T>
struct PyType<std::optional<T>> {
  static std::string name() { return PyType<T>::name() + " | None"; }
};

template <typename Options>
std::string option_names() {
  std::string out;
  Options().visit([&](const char* name, auto&) { out += (out.empty() ? "" : ", ") + std::string(name); });
  return out;
}

template <typename Options>
Options options_from(const char* what, const py::kwargs& given) {
  Options o;
  int taken = 0;
  o.visit([&](const char* name, auto& field) {
    if (!given.contains(name)) return;
    using T = std::decay_t<decltype(field)>;
    const py::handle value = given[name];
    // An int option takes no float, a str no number: pybind11's casters refuse them.
    try {
      field = value.cast<T>();
    } catch (const py::cast_error&) {
      throw py::type_error(std::string("batchcast._C.") + what + ": option " + name + " takes " +
                           PyType<T>::name() + ", not " + std::string(py::repr(value)));
    }
    taken += 1;
  });
  if (taken != static_cast<int>(py::len(given))) {
    for (auto item : given) {
      bool known = false;
      const std::string key = py::str(item.first);
      Options().visit([&](const char* name, auto&) { known = known || key == name; });
      if (!known) {
        throw py::type_error(std::string("batchcast._C.") + what + " has no option '" + key +
                             "' (its options: " + option_names<Options>() + ")");
      }
    }
  }
  if (!given.contains("name")) throw py::type_error(std::string("batchcast._C.") + what + " needs name=");
  return o;
}

// [(name, Python type, default as Python writes it)], in the list's order.
template <typename Options>
py::list describe_options() {
  py::list out;
  Options().visit([&](const char* name, const auto& field) {
    using T = std::decay_t<decltype(field)>;
    out.append(py::make_tuple(name, PyType<T>::name(), py::repr(py::cast(field))));
  });
  return out;
}

struct ToDict {
  py::dict& out;
  template <typename T>
  void operator()(const char* name, const T& value) const {
    out[name] = py::cast(value);
  }
  void operator()(const char* name, const std::vector<ConsumerInfo>& consumers) const {
    py::list list;
    for (const ConsumerInfo& c : consumers) {
      py::dict d;
      c.visit(ToDict{d});
      list.append(d);
    }
    out[name] = list;
  }
};

template <typename Stats>
py::dict to_dict(const Stats& stats) {
  py::dict d;
  stats.visit(ToDict{d});
  return d;
}

// ---- batches ----------------------------------------------------------------

// Leaves travel to and from Python as a list whose items are either a tensor
// or a (ListKind, [str, ...]) tuple for a per-sample list.
std::vector<Leaf> leaves_from_python(const py::list& leaves) {
  std::vector<Leaf> out;
  out.reserve(leaves.size());
  for (const py::handle& item : leaves) {
    if (python::is_tensor(item)) {
      out.emplace_back(python::tensor_from_python(item));
    } else {
      auto pair = item.cast<std::pair<ListKind, std::vector<std::string>>>();
      out.emplace_back(Items{pair.first, std::move(pair.second)});
    }
  }
  return out;
}

py::list leaves_to_python(std::vector<ViewLeaf>& leaves) {
  py::list out(leaves.size());
  std::size_t i = 0;
  for (ViewLeaf& leaf : leaves) {
    if (auto* view = std::get_if<RingView>(&leaf)) {
      out[i++] = python::view_to_python(std::move(*view));
    } else if (auto* t = std::get_if<Tensor>(&leaf)) {
      out[i++] = python::tensor_to_python(std::move(*t));
    } else {
      auto& items = std::get<Items>(leaf);
      out[i++] = py::make_tuple(items.kind, py::cast(items.values));
    }
  }
  return out;
}

// A core object with the report queue its callbacks feed. In a forked child
// (a DataLoader worker of the trainer, a process of its own pool) the copy of
// the core object is the parent's: it is never destroyed there (common/fork.h),
// closing it does nothing, and any other call says what happened.
template <typename Core>
struct Bound {
  std::shared_ptr<ReportQueue> reports = std::make_shared<ReportQueue>();
  std::unique_ptr<Core> core;
  Birthplace born;
  int64_t pid = ::getpid();

  Bound() = default;
  Bound(const Bound&) = delete;
  Bound& operator=(const Bound&) = delete;
  ~Bound() {
    if (!born.here()) leave_behind(core);
  }
  // Whether there is a core object this process may call.
  bool usable() const { return core && born.here(); }
  Core& live() {
    if (!born.here()) {
      throw Error(std::string("this batchcast ") + kind() + " was made by process " + std::to_string(pid) +
                  "; process " + std::to_string(::getpid()) +
                  " is a fork of it and cannot use it (its connection, threads and memory are the parent's): "
                  "make a new " + kind() + " in the child");
    }
    if (!core) throw std::runtime_error("this batchcast object is closed");
    return *core;
  }
  static const char* kind() { return std::is_same_v<Core, Producer> ? "Producer" : "Consumer"; }
};

template <typename Options>
Options with_hooks(Options options, const std::shared_ptr<ReportQueue>& reports) {
  options.reporter = [reports](const Report& r) { reports->push(r); };
  options.interrupt = interrupt_hook(reports);
  return options;
}

// Runs `call` with the GIL released. Not a scoped guard, on purpose: taking
// the GIL back can end this thread (a daemon thread while the interpreter
// exits: CPython ends it with pthread_exit, which unwinds its stack), and an
// unwinding that starts in a destructor is std::terminate: the process
// would abort at exit ("terminate called without an active exception").
// From here the thread ends quietly.
template <typename Call>
auto without_gil(Call call) -> decltype(call()) {
  PyThreadState* state = PyEval_SaveThread();
  try {
    if constexpr (std::is_void_v<decltype(call())>) {
      call();
      PyEval_RestoreThread(state);
    } else {
      auto result = call();
      PyEval_RestoreThread(state);
      return result;
    }
  } catch (abi::__forced_unwind&) {
    throw;  // the thread is being ended (by the interrupt hook, or just above): let it
  } catch (...) {
    PyEval_RestoreThread(state);
    throw;
  }
}

// Runs `call` on the core with the GIL released, then hands queued reports
// to Python (with the GIL).
template <typename Core, typename Call>
auto released(Bound<Core>& b, Call call) {
  Core& core = b.live();
  using Result = decltype(call(core));
  if constexpr (std::is_void_v<Result>) {
    without_gil([&] { call(core); });
    b.reports->flush();
  } else {
    Result result = without_gil([&] { return call(core); });
    b.reports->flush();
    return result;
  }
}

using BoundProducer = Bound<Producer>;
using BoundConsumer = Bound<Consumer>;

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "batchcast C++ core";
  m.attr("PROTOCOL_VERSION") = protocol::kVersion;

  // Base first: pybind11 tries the most recently registered translator first.
  static py::exception<Error>& error = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<ProducerLost>(m, "ProducerLost", error.ptr());
  py::register_exception<LoaderError>(m, "LoaderError", error.ptr());
  py::register_exception<NameInUse>(m, "NameInUse", error.ptr());
  py::register_exception<Refused>(m, "Refused", error.ptr());
  py::register_exception<RebatchError>(m, "RebatchError", error.ptr());
  py::register_exception<Stopped>(m, "Stopped", error.ptr());
  py::register_exception<Stalled>(m, "Stalled", error.ptr());
  py::register_exception<EpochsExhausted>(m, "EpochsExhausted", error.ptr());
  py::register_exception<Evicted>(m, "Evicted", error.ptr());
  py::register_exception<GroupError>(m, "GroupError", error.ptr());
  py::register_exception<CudaError>(m, "CudaError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  py::enum_<Placement>(m, "Placement")
      .value("AUTO", Placement::Auto)
      .value("HOST", Placement::Host)
      .value("CUDA", Placement::Cuda);
  py::enum_<MappedRing::ReleaseAfter>(m, "ReleaseAfter")
      .value("STREAM", MappedRing::ReleaseAfter::Stream)
      .value("DEVICE", MappedRing::ReleaseAfter::Device);
  py::enum_<ListKind>(m, "ListKind").value("TEXT", ListKind::Text).value("JSON", ListKind::Json);
  py::enum_<Report::Level>(m, "ReportLevel")
      .value("DEBUG", Report::Level::Debug)
      .value("INFO", Report::Level::Info)
      .value("NOTICE", Report::Level::Notice)
      .value("WARNING", Report::Level::Warning);

  m.def("cuda_built", &cuda::built, "Whether this build has the CUDA transport");
  m.def(
      "dtypes",
      [] {
        std::vector<std::string> names;
        for (uint8_t d = 0; d < protocol::kDTypeCount; ++d) {
          names.emplace_back(protocol::dtype_name(static_cast<protocol::DType>(d)));
        }
        return names;
      },
      "The dtypes batchcast shares, as torch names them, in wire order");
  m.def("tensor_crossing", &python::crossing,
        "How tensors cross the binding: 'exchange' (torch's DLPack C exchange API) or 'capsules' "
        "(torch.utils.dlpack: a torch without it, or BATCHCAST_DLPACK_CAPSULES set)");
  m.def("exit_with_process", &exit_with_process, py::arg("pid"), py::arg("code") = 1,
        "Ends this process (_exit(code)) once process `pid` has exited (a thread waits for it)");
  m.def("cuda_device_count", &cuda::device_count, "GPUs visible to this process (0 without a driver)");
  bind_testing(m);  // batchcast._C._testing: hooks of the tests, not the API
  m.def(
      "set_report_handler", [](py::object handler) { report_handler() = std::move(handler); },
      "handler(level: int, kind: str, message: str), called on the caller's thread");

  py::class_<BoundProducer>(m, "Producer")
      .def(py::init([](const py::kwargs& options) {
             auto b = std::make_unique<BoundProducer>();
             ProducerOptions o = options_from<ProducerOptions>("Producer", options);
             b->core = std::make_unique<Producer>(with_hooks(std::move(o), b->reports));
             return b;
           }),
           "Producer(**options): the keywords of ProducerOptions (see options())")
      .def_static("options", &describe_options<ProducerOptions>,
                  "[(name, type, default)] of every option, in order")
      .def("wait_for_consumers",
           [](BoundProducer& b, int64_t count, double timeout) {
             return released(b, [&](Producer& p) { return p.wait_for_consumers(count, timeout); });
           },
           py::arg("count"), py::arg("timeout") = -1.0)
      .def("begin_epoch",
           [](BoundProducer& b, int64_t epoch) {
             released(b, [&](Producer& p) { p.begin_epoch(epoch); });
           },
           "Begins epoch `epoch`, ordered (order_epoch) by where the consumers present joined mid-epoch")
      .def("order_epoch",
           [](BoundProducer& b, std::vector<int64_t> fresh) {
             return released(b, [&](Producer& p) { return p.order_epoch(std::move(fresh)); });
           },
           "The epoch's order of dataset indices, given the loader's fresh one (join_now)")
      .def("publish",
           [](BoundProducer& b, const py::list& leaves, const std::string& layout, int64_t samples,
              std::optional<uint64_t> lease, bool in_place, std::optional<std::vector<int64_t>> indices) {
             Batch batch;
             batch.samples = samples;
             batch.layout = layout;
             batch.leaves = leaves_from_python(leaves);
             if (indices) batch.indices = std::move(*indices);
             // Seconds spent waiting for ring space.
             return released(b, [&](Producer& p) { return p.publish(batch, lease, in_place); });
           },
           py::arg("leaves"), py::arg("layout"), py::arg("samples"), py::arg("lease") = py::none(),
           py::arg("in_place") = false, py::arg("indices") = py::none())
      .def("lease",
           [](BoundProducer& b, int64_t limit) -> py::object {
             std::optional<Producer::Lease> l =
                 released(b, [&](Producer& p) { return p.lease(limit); });
             if (!l) return py::none();
             return py::make_tuple(l->seq, l->fd, l->ring_bytes, py::cast(l->offsets), py::cast(l->bytes));
           },
           py::arg("limit"))
      .def("lease_out", [](BoundProducer& b, uint64_t seq) { return b.live().lease_out(seq); }, py::arg("seq"))
      .def("return_leases", [](BoundProducer& b) { return b.live().return_leases(); })
      .def("return_lease", [](BoundProducer& b, uint64_t seq) { b.live().return_lease(seq); },
           py::arg("seq"))
      .def("host_ring",
           [](BoundProducer& b) -> py::object {
             // Bytes of the producer's own mapping of the memory leases are in
             // (a host ring, or a GPU ring's pinned mirror), valid while the
             // producer is open (None before the first lease).
             auto [data, bytes] = b.live().host_memory();
             if (data == nullptr) return py::none();
             return python::tensor_to_python(
                 borrow(data, {static_cast<int64_t>(bytes)}, ScalarType::Byte, cpu_device()));
           })
      .def("end_epoch", [](BoundProducer& b) { released(b, [](Producer& p) { p.end_epoch(); }); })
      .def("fail",
           [](BoundProducer& b, const std::string& message, bool cannot_share) {
             const auto cause = cannot_share ? protocol::LoaderFailed::Cause::CannotShare
                                             : protocol::LoaderFailed::Cause::LoaderRaised;
             released(b, [&](Producer& p) { p.fail(message, cause); });
           },
           py::arg("message"), py::arg("cannot_share") = false)
      .def("finish", [](BoundProducer& b) { released(b, [](Producer& p) { p.finish(); }); })
      .def("stop",
           [](BoundProducer& b) {
             if (b.usable()) b.core->stop();
           })
      .def("close",
           [](BoundProducer& b) {
             if (!b.usable()) return;
             released(b, [](Producer& p) { p.close(); });
           })
      .def("stats",
           [](BoundProducer& b, bool reports) {
             py::dict d = to_dict(b.live().stats());
             // Events of a producer whose own thread is busy loading; not from a
             // watch of batchcast's own (reports=False): they are said on a
             // thread of the user's.
             if (reports) b.reports->flush();
             return d;
           },
           py::arg("reports") = true)
      .def("note_loader_workers",
           [](BoundProducer& b, std::vector<int64_t> pids) { b.live().note_loader_workers(std::move(pids)); },
           py::arg("pids"), "The loader's worker processes alive now (stats()['loader_workers'], the status)")
      .def("consumer_count", [](BoundProducer& b) { return b.live().consumer_count(); })
      .def_property_readonly("endpoint", [](BoundProducer& b) { return b.live().endpoint(); });

  py::class_<BoundConsumer>(m, "Consumer")
      .def(py::init([](const py::kwargs& options) {
             auto b = std::make_unique<BoundConsumer>();
             ConsumerOptions o = with_hooks(options_from<ConsumerOptions>("Consumer", options), b->reports);
             without_gil([&] { b->core = std::make_unique<Consumer>(std::move(o)); });
             b->reports->flush();
             return b;
           }),
           "Consumer(**options): the keywords of ConsumerOptions (see options())")
      .def_static("options", &describe_options<ConsumerOptions>,
                  "[(name, type, default)] of every option, in order")
      .def("begin_epoch", [](BoundConsumer& b) { return released(b, [](Consumer& c) { return c.begin_epoch(); }); })
      .def("next",
           [](BoundConsumer& b, bool indices) -> py::object {
             std::optional<ViewBatch> batch = released(b, [indices](Consumer& c) { return c.next_views(indices); });
             if (!batch) return py::none();
             if (!indices) return py::make_tuple(batch->layout, leaves_to_python(batch->leaves), batch->samples);
             Tensor ids = empty({static_cast<int64_t>(batch->indices.size())}, ScalarType::Long, cpu_device());
             if (!batch->indices.empty()) {
               std::memcpy(ids.mutable_data_ptr(), batch->indices.data(), batch->indices.size() * sizeof(int64_t));
             }
             return py::make_tuple(batch->layout, leaves_to_python(batch->leaves), batch->samples,
                                   python::tensor_to_python(std::move(ids)), batch->indexed);
           },
           py::arg("indices") = false,
           "(layout, leaves, samples), or None at the epoch's end; with indices=True also each sample's "
           "identity (an int64 tensor) and whether those are dataset indices (else positions in the "
           "producer's epoch)")
      .def("close",
           [](BoundConsumer& b) {
             if (!b.usable()) return;
             released(b, [](Consumer& c) { c.close(); });
           })
      .def_property_readonly("finished", [](BoundConsumer& b) { return b.live().finished(); })
      .def_property_readonly("samples_per_epoch", [](BoundConsumer& b) { return b.live().samples_per_epoch(); })
      .def_property_readonly("own_samples_per_epoch",
                             [](BoundConsumer& b) { return b.live().own_samples_per_epoch(); })
      .def_property_readonly("batches_per_epoch", [](BoundConsumer& b) { return b.live().batches_per_epoch(); })
      .def("position", [](BoundConsumer& b) { return b.live().position(); },
           "(epoch, stream position of the first sample not taken yet), to resume from")
      .def("stats",
           [](BoundConsumer& b) {
             py::dict d = to_dict(b.live().stats());
             b.reports->flush();  // what the consumer's threads reported since the last call
             return d;
           });

}
