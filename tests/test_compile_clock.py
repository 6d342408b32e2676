"""training/periodic_actions.py (CompileClock): the compile time inside a block, and nothing else."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from training.periodic_actions import CompileClock


def _fresh_function(salt: float):
  """A jitted function no earlier test compiled (the constant makes it a new program)."""
  @jax.jit
  def function(x):
    for _ in range(20):
      x = jnp.tanh(x @ x.T + salt)
    return x
  return function


def _spans_of(block) -> list[tuple[float, float]]:
  """Every compile span jax reports in this thread while `block` runs: the clock's raw input."""
  spans, thread = [], threading.get_ident()

  def listen(event, start, end, **fields):
    if event.startswith('/jax/core/compile/') and threading.get_ident() == thread:
      spans.append((start, end))

  jax.monitoring.register_event_time_span_listener(listen)
  try:
    block()
  finally:
    jax.monitoring.unregister_event_time_span_listener(listen)
  return spans


def test_a_first_call_counts_its_compiling_and_a_second_call_counts_nothing():
  function, x = _fresh_function(0.125), jnp.ones((8, 8))
  start = time.perf_counter()
  with CompileClock() as first:
    function(x).block_until_ready()
    time.sleep(0.2)  # not compiling
  wall = time.perf_counter() - start
  assert 0 < first.seconds <= wall - 0.2
  with CompileClock() as second:
    function(x).block_until_ready()
  assert second.seconds == 0


def test_the_clock_is_the_union_of_the_spans_jax_reports():
  function, x = _fresh_function(0.25), jnp.ones((8, 8))
  with CompileClock() as clock:
    spans = _spans_of(lambda: function(x).block_until_ready())
  # A reference union on a microsecond grid.
  assert spans
  grid = np.zeros(int((max(e for _, e in spans) - min(s for s, _ in spans)) * 1e6) + 2, bool)
  origin = min(s for s, _ in spans)
  for start, end in spans:
    grid[int((start - origin) * 1e6):int((end - origin) * 1e6)] = True
  assert abs(clock.seconds - grid.sum() / 1e6) < 1e-4


def test_overlapping_spans_count_once():
  clock = CompileClock()
  for start, end in [(0.0, 1.0), (0.5, 1.5), (0.6, 0.7), (3.0, 4.0)]:
    clock._listen('/jax/core/compile/jaxpr_trace_duration', start, end)
  clock._listen('/jax/some/other/event', 10.0, 20.0)
  assert clock.seconds == 2.5


def test_another_threads_compiling_and_compiling_after_the_block_are_not_counted():
  x = jnp.ones((8, 8))
  with CompileClock() as clock:
    worker = threading.Thread(target=lambda: _fresh_function(0.5)(x).block_until_ready())
    worker.start()
    worker.join()
  _fresh_function(0.75)(x).block_until_ready()
  assert clock.seconds == 0
