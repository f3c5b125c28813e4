// batchcast._status: what `batchcast status` needs (the runtime directory and
// the producers in it), converted for Python and nothing more. It links the
// wire only (no torch), so the command line answers without loading torch.
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "batchcast/common/endpoint.h"
#include "batchcast/common/error.h"
#include "batchcast/protocol/message.h"
#include "batchcast/status/status.h"

namespace py = pybind11;

PYBIND11_MODULE(_status, m) {
  m.doc() = "batchcast's status queries, without torch";
  // Local: pybind11 tries the newest global translator first, and a global one
  // here would turn every error of batchcast._C into a plain RuntimeError.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const batchcast::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const batchcast::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  m.attr("PROTOCOL_VERSION") = batchcast::protocol::kVersion;
  m.def(
      "runtime_dir",
      [](const std::string& override_dir) { return batchcast::runtime_dir(override_dir); },
      py::arg("override_dir") = "",
      "The per-user runtime directory (created 0700 if missing): override_dir, else "
      "$BATCHCAST_RUNTIME_DIR, else $XDG_RUNTIME_DIR/batchcast, else /tmp/batchcast-<uid>");
  m.def(
      "list_producers",
      [](const std::string& runtime_dir, const std::string& name, double timeout, bool clean) {
        std::vector<batchcast::ProducerListing> listings;
        {
          py::gil_scoped_release release;
          listings = batchcast::list_producers(runtime_dir, name, timeout, clean);
        }
        py::list out;
        for (const auto& p : listings) {
          py::dict d;
          d["name"] = p.name;
          d["endpoint"] = p.endpoint;
          d["alive"] = p.alive;
          d["status"] = p.status;
          d["note"] = p.note;
          out.append(d);
        }
        return out;
      },
      py::arg("runtime_dir") = "", py::arg("name") = "", py::arg("timeout") = 1.0,
      py::arg("clean") = true,
      "Producers of this user here, each asked for its status (JSON text); dead ones' files "
      "removed");
}
