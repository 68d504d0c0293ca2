"""The one place every ttnn call of a mesh goes through.

`Dispatcher.call(name, fn, *args, **kwargs)` runs `fn` and adds the call and its host time to
the statistics of `name` (the ttnn op's name, e.g. "linear", "experimental.paged_fill_cache"),
so a request's ttnn calls can be counted and timed. Exceptions from ttnn pass through unchanged
(the bridge turns them into device errors carrying ttnn's message).

A shadow hook can be installed (`Dispatcher.shadow = callable(name, fn, args, kwargs, result)`),
called after every successful call, and its `before(name, args)` (if it has one) before the call:
the golden-shadow mode (golden/, `CLEF_TT_GOLDEN=1`) recomputes every op with
`ttnn.get_golden_function(fn)`. It is None by default (no cost).

A test hook: `CLEF_TT_TTNN_REFUSE=name:n` makes the n-th call of `name` (counted per mesh)
instead ask ttnn for the matrix product of its first tensor argument with itself, a shape
ttnn's own validation refuses (TT_FATAL `a_shape[-1] == b_shape[-2]` unless the tensor is
square): how the tests see a real ttnn refusal reach the client and the worker go on.
"""

import os
import time


def _refusal():
    """(op name, call number) from CLEF_TT_TTNN_REFUSE, or None."""
    spec = os.environ.get("CLEF_TT_TTNN_REFUSE", "")
    name, _, n = spec.rpartition(":")
    return (name, int(n)) if name and n.isdigit() else None


class Dispatcher:
    """Counts and times ttnn calls per op name; see the module docstring."""

    def __init__(self, ttnn=None):
        self._stats = {}
        self.shadow = None
        self._ttnn = ttnn
        self._refuse = _refusal()
        self._seen = {}
        self._fast_mode = None if ttnn is not None else False

    def call(self, name, fn, *args, **kwargs):
        if self._refuse is not None and self._refuse[0] == name and self._ttnn is not None:
            self._seen[name] = self._seen.get(name, 0) + 1
            if self._seen[name] == self._refuse[1]:
                first = next(a for a in args if hasattr(a, "shape"))
                fn, args, kwargs = self._ttnn.matmul, (first, first), {}
        if self.shadow is not None:
            self.shadow.before(name, args)
        target = self._direct(fn)
        t0 = time.perf_counter()
        try:
            result = target(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            calls, seconds = self._stats.get(name, (0, 0.0))
            self._stats[name] = (calls + 1, seconds + dt)
        if self.shadow is not None:
            self.shadow(name, fn, args, kwargs, result)
        return result

    def _direct(self, fn):
        """The C++ op behind a ttnn operation wrapper where calling it directly is what the
        wrapper would do (ttnn's fast runtime mode, no comparison mode, no logging, no Python
        I/O recording): its per-call Python checks are 10-15% of an op's host time on the mock.
        Otherwise `fn` itself."""
        direct = getattr(fn, "function", None)
        if direct is None or not self._fast():
            return fn
        return direct

    def _fast(self):
        if self._fast_mode is None:
            ttnn = self._ttnn
            config = getattr(ttnn, "CONFIG", None)
            self._fast_mode = bool(
                config is not None
                and config.enable_fast_runtime_mode
                and not config.enable_comparison_mode
                and not config.enable_logging
                and not ttnn.graph.is_python_io_recording_enabled()
            )
        return self._fast_mode

    def stats(self):
        """{op name: (calls, host seconds)} since the last reset."""
        return dict(self._stats)

    def reset(self):
        self._stats = {}

    def total_calls(self):
        return sum(c for c, _ in self._stats.values())
