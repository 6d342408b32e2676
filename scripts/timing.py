"""Timing helpers the benchmark scripts share: a median of repeated calls, and this CPU's matmul rate."""

import statistics
import time

import jax
import jax.numpy as jnp


def median_seconds(fn, repeats: int) -> float:
  """Median wall time of `repeats` calls of fn, each waited for."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def cpu_matmul_gflops(size: int = 2048, repeats: int = 5) -> float:
  """What XLA reaches on this machine for one float32 [size, size] matmul: the practical peak."""
  a = jnp.ones((size, size), jnp.float32)
  matmul = jax.jit(lambda x: x @ x).lower(a).compile()
  jax.block_until_ready(matmul(a))
  return 2 * size**3 / median_seconds(lambda: matmul(a), repeats) / 1e9
