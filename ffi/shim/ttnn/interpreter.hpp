// The CPython the ttnn shim embeds: started once per process on first use, with the Python
// environment of the interpreter named by CLEF_TT_PYTHON (else $VIRTUAL_ENV/bin/python, else
// the interpreter the shim was built with), checked to be the CPython version the shim was
// built against and to import ttnn 0.81.1 and the op package (clef_tt_ttnn, beside the shim).
//
// Failures never end the process: every use after a failed start throws the same
// clef_tt::Error naming what was tried and the install command. Python exceptions become
// clef_tt::Errors too (python_error); none crosses the shim.
#pragma once

#include <pybind11/pybind11.h>

#include <mutex>
#include <string>

#include "core/errors.hpp"

namespace clef_tt::ttnn_bridge {

namespace py = pybind11;

// The interpreter, started (or throwing why it cannot be). The caller then holds the GIL
// through py::gil_scoped_acquire for every Python call.
void ensure_started();

// The op package's clef_tt_ttnn.Backend object; the GIL must be held.
py::object& python_backend();

// A Python exception (caught as error_already_set) as the shim's error: ValueError →
// invalid argument, MemoryError or an allocator's out-of-memory → out of memory, anything else
// (ttnn's TT_FATAL / TT_THROW) → device error; the message keeps ttnn's text (its failed
// condition). The GIL must be held.
[[noreturn]] void python_error(const char* what, py::error_already_set& e);

// One call into the ttnn runtime at a time in the whole process: ttnn releases the GIL inside
// its C++ calls and its host runtime is not thread-safe across meshes (two opens at once
// aborted the process). Taken before the GIL, by every call and every release of an object.
std::recursive_mutex& runtime_lock();

// Runs `body` under the runtime lock with the GIL held, turning Python exceptions into the
// shim's errors.
template <class F>
auto with_python(const char* what, F&& body) -> decltype(body()) {
  ensure_started();
  std::lock_guard<std::recursive_mutex> one(runtime_lock());
  py::gil_scoped_acquire gil;
  try {
    return body();
  } catch (py::error_already_set& e) {
    python_error(what, e);
  } catch (const py::cast_error& e) {
    throw Error(CLEF_TT_INTERNAL,
                std::string(what) + ": unexpected result from clef_tt_ttnn (" + e.what() + ")");
  }
}

}  // namespace clef_tt::ttnn_bridge
