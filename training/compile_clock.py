"""Wall seconds JAX spends tracing, lowering and compiling inside a block of code.

A first validation compiles its decoder as it runs: 33-36 s of a ~35 s validation on an H200, about
half of one on a 2-core CPU (docs/performance.md). A time budget that charged every later
validation the first one's compilation would plan far too few steps where validations are frequent,
so the trainer times the first validation with this clock and leaves the compilation out.

The clock listens to jax.monitoring's compile events (`/jax/core/compile/...`), each a span of wall
time, and counts the union of those in its own thread: spans that nest (a jitted function traced
inside another's trace) count once, and another thread's compilation (a checkpoint's background
save, say) not at all.
"""

import threading

import jax


class CompileClock:
  """Context manager: `seconds` is the compile time, in this thread, of the `with` block."""

  _PREFIX = '/jax/core/compile/'

  def __init__(self):
    self._spans: list[tuple[float, float]] = []
    self._thread = threading.get_ident()

  def _listen(self, event: str, start: float, end: float, **fields) -> None:
    del fields  # function names and the like
    if event.startswith(self._PREFIX) and threading.get_ident() == self._thread:
      self._spans.append((start, end))

  def __enter__(self) -> 'CompileClock':
    self._thread = threading.get_ident()
    jax.monitoring.register_event_time_span_listener(self._listen)
    return self

  def __exit__(self, *exc_info) -> None:
    jax.monitoring.unregister_event_time_span_listener(self._listen)

  @property
  def seconds(self) -> float:
    """The union of the compile spans seen so far, in seconds."""
    total, covered_to = 0.0, float('-inf')
    for start, end in sorted(self._spans):
      if end > covered_to:
        total += end - max(start, covered_to)
        covered_to = end
    return total
