// Errors of the shim: every failure is a clef_tt::Error carrying the status the C ABI returns.
// The entry points (abi.cpp) catch it — and anything else — and turn it into the calling
// thread's last error; no exception crosses the C ABI.
#pragma once

#include <stdexcept>
#include <string>

#include "clef_tt.h"

namespace clef_tt {

class Error : public std::runtime_error {
 public:
  Error(clef_tt_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  clef_tt_status status() const { return status_; }

 private:
  clef_tt_status status_;
};

// A refused argument: a null or foreign handle, a shape, dtype, role or placement.
[[noreturn]] inline void invalid(const std::string& message) {
  throw Error(CLEF_TT_INVALID_ARGUMENT, message);
}

// The device (or, in the host backend, a simulated device) failed.
[[noreturn]] inline void device_failure(const std::string& message) {
  throw Error(CLEF_TT_DEVICE_ERROR, message);
}

}  // namespace clef_tt
