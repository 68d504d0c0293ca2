// The embedded CPython of the ttnn shim (see interpreter.hpp).
#include "interpreter.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#ifndef CLEF_TT_PY_VERSION
#error "build.rs defines CLEF_TT_PY_VERSION (the CPython major.minor the shim embeds)"
#endif
#ifndef CLEF_TT_BUILD_PYTHON
#error "build.rs defines CLEF_TT_BUILD_PYTHON (the interpreter the shim was built with)"
#endif

namespace clef_tt::ttnn_bridge {

namespace {

const char* const kInstall =
    "install it with `pip install ttnn==0.81.1` (CPython 3.12 or 3.10) and name that "
    "interpreter in CLEF_TT_PYTHON; for a mock device: ffi/ttnn-mock/setup.sh";

struct State {
  std::once_flag once;
  // Why the interpreter could not start ("" once it did).
  std::string failure;
  // clef_tt_ttnn.Backend() (lives for the process; Python is never finalised).
  py::object* backend = nullptr;
};

State& state() {
  static State s;
  return s;
}

bool executable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

std::string dirname(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The interpreter whose environment the embedded CPython takes, and how it was chosen.
std::pair<std::string, std::string> choose_python() {
  if (const char* p = std::getenv("CLEF_TT_PYTHON"); p != nullptr && *p != '\0') {
    return {p, "CLEF_TT_PYTHON"};
  }
  if (const char* v = std::getenv("VIRTUAL_ENV"); v != nullptr && *v != '\0') {
    std::string p = std::string(v) + "/bin/python";
    if (executable(p)) return {p, "$VIRTUAL_ENV/bin/python"};
  }
  return {CLEF_TT_BUILD_PYTHON, "the interpreter the shim was built with"};
}

// "3.12" from a venv's pyvenv.cfg (`version_info = 3.12.1` or `version = 3.12.1`) beside the
// interpreter or one folder up; "" when there is none (a plain installation).
std::string venv_version(const std::string& python) {
  for (const std::string& dir : {dirname(python), dirname(dirname(python))}) {
    std::ifstream cfg(dir + "/pyvenv.cfg");
    std::string line;
    while (std::getline(cfg, line)) {
      size_t eq = line.find('=');
      if (eq == std::string::npos) continue;
      std::string key = line.substr(0, line.find_last_not_of(" \t", eq - 1) + 1);
      if (key != "version_info" && key != "version") continue;
      std::string value = line.substr(line.find_first_not_of(" \t", eq + 1));
      size_t second = value.find('.', value.find('.') + 1);
      return value.substr(0, second);
    }
  }
  return "";
}

// The folder of this shared library (the op package sits beside it).
std::string shim_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ensure_started), &info) == 0 || info.dli_fname == nullptr) {
    return ".";
  }
  return dirname(info.dli_fname);
}

void start(State& s) {
  auto [python, how] = choose_python();
  std::string tried = python + " (" + how + ")";
  if (!executable(python)) {
    s.failure = "no Python interpreter at " + tried +
                "; the ttnn backend needs one whose "
                "environment has ttnn: " +
                kInstall;
    return;
  }
  std::string found = venv_version(python);
  if (!found.empty() && found != CLEF_TT_PY_VERSION) {
    s.failure = tried + " is CPython " + found + ", this shim embeds CPython " +
                CLEF_TT_PY_VERSION + " (rebuild clef-tt with CLEF_TT_PYTHON naming a CPython " +
                found + " with pybind11, or use a CPython " + CLEF_TT_PY_VERSION +
                " environment with ttnn)";
    return;
  }
  std::string package_dir = shim_dir();
  std::ifstream probe(package_dir + "/clef_tt_ttnn/__init__.py");
  if (!probe) {
    s.failure = "the op package clef_tt_ttnn is not beside the shim (looked in " + package_dir +
                "/clef_tt_ttnn); copy ffi/shim/ttnn/clef_tt_ttnn there";
    return;
  }
  // Extension modules (numpy, ttnn) resolve CPython's symbols globally; the shim was loaded
  // with RTLD_LOCAL, so its libpython is re-opened with RTLD_GLOBAL first.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&Py_InitializeFromConfig), &info) != 0 &&
      info.dli_fname != nullptr) {
    dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  }
  if (!Py_IsInitialized()) {
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0;  // the host process keeps its signals
    config.parse_argv = 0;
    // The interpreter's path decides sys.prefix (a venv's pyvenv.cfg) and so site-packages.
    PyStatus status = PyConfig_SetBytesString(&config, &config.program_name, python.c_str());
    if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
      s.failure = "CPython " + std::string(CLEF_TT_PY_VERSION) + " did not start for " + tried +
                  ": " + (status.err_msg != nullptr ? status.err_msg : "unknown error");
      return;
    }
    // The GIL is taken per call from here on (by any thread).
    PyEval_SaveThread();
  }
  py::gil_scoped_acquire gil;
  try {
    py::module_ sys = py::module_::import("sys");
    sys.attr("path").attr("insert")(0, package_dir);
    // Backend() imports ttnn and checks its version (raising with the install command).
    s.backend = new py::object(py::module_::import("clef_tt_ttnn").attr("Backend")());
  } catch (py::error_already_set& e) {
    std::string prefix = "?";
    try {
      prefix = py::str(py::module_::import("sys").attr("prefix"));
    } catch (...) {
    }
    s.failure = std::string(e.what()) + " [Python: " + tried + ", CPython " + CLEF_TT_PY_VERSION +
                ", sys.prefix " + prefix + "]; " + kInstall;
  }
}

// ttnn's TT_FATAL text up to its backtrace, at most ~2 KB.
std::string trimmed(std::string text) {
  size_t bt = text.find("backtrace:");
  if (bt != std::string::npos) text.resize(bt);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.size() > 2000) text = text.substr(0, 2000) + " …";
  return text;
}

}  // namespace

void ensure_started() {
  State& s = state();
  std::call_once(s.once, [&s] { start(s); });
  if (s.backend == nullptr) {
    throw Error(CLEF_TT_DEVICE_ERROR, "the ttnn backend cannot start: " + s.failure);
  }
}

py::object& python_backend() { return *state().backend; }

std::recursive_mutex& runtime_lock() {
  static std::recursive_mutex m;
  return m;
}

void python_error(const char* what, py::error_already_set& e) {
  // The core names the ABI op already; `what` is said only where it adds (a result check).
  std::string op = what;
  std::string message = trimmed(e.what());
  if (op == "result check") message = op + ": " + message;
  bool oom = e.matches(PyExc_MemoryError) || message.find("Out of Memory") != std::string::npos ||
             message.find("out of memory") != std::string::npos;
  if (e.matches(PyExc_ValueError)) throw Error(CLEF_TT_INVALID_ARGUMENT, message);
  // A layer op (or a form of one) the package does not run: raised before any ttnn call.
  if (e.matches(PyExc_NotImplementedError)) throw Error(CLEF_TT_UNSUPPORTED, message);
  if (oom) throw Error(CLEF_TT_OUT_OF_MEMORY, message);
  throw Error(CLEF_TT_DEVICE_ERROR, message);
}

}  // namespace clef_tt::ttnn_bridge
