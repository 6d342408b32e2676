"""A fusion boundary: makes XLA compute a value once instead of re-deriving it in every consumer.

XLA fuses cheap elementwise producers into each of their consumers, duplicating them. The
residual stream is a chain of such producers (x + dropout(f(x)) per sublayer, and in the backward
pass the matching chain of gradient sums), so without a boundary every consumer of layer k's
stream (its norm, the next residual add, the layout copies of the weight-gradient products)
recomputed all k earlier additions and dropout masks: work quadratic in depth. On the 2-core CPU
this was 40% of the tiny recipe's training step (docs/performance.md).

XLA does not duplicate a division by a value it cannot fold, and an optimization barrier hides
the constant 1 from it. x / 1 is exactly x in IEEE arithmetic (zeros, inf and nan included; CPU
XLA flushes subnormals in every arithmetic operation anyway), and so is the gradient g / 1. The
model's values and gradients change only by float32 rounding where XLA now sums gradient
contributions in another order (tests/test_fusion.py); forward-mode differentiation
(Hessian-vector products) passes through it like any division.
"""

import jax
import jax.numpy as jnp


def fusion_boundary(x: jnp.ndarray) -> jnp.ndarray:
  """x, exactly, materialised once in the forward and the backward pass."""
  one = jax.lax.optimization_barrier(jnp.ones((), x.dtype))
  return x / one
