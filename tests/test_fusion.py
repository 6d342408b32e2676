"""fusion_boundary changes nothing that is computed: values, gradients, forward-over-reverse."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import blocks, losses
from model.fusion import fusion_boundary
from model.transformer import Transformer
from tests.test_transformer import SOURCE, TARGET_IN, TARGET_OUT, tiny_config


def _bits(x):
  return np.asarray(x, np.float32).view(np.uint32)


def test_identity_on_normal_zero_and_non_finite_values():
  # Subnormals are left out: XLA on CPU flushes them to zero in every arithmetic operation, and
  # the boundary only ever receives the result of one (a residual addition).
  x = jnp.array([0.0, -0.0, 1.2e-38, -3.5, 1e30, jnp.inf, -jnp.inf, jnp.nan], jnp.float32)
  np.testing.assert_array_equal(_bits(jax.jit(fusion_boundary)(x)), _bits(x))
  y = jax.jit(fusion_boundary)(x.astype(jnp.bfloat16))
  assert y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(_bits(y), _bits(x.astype(jnp.bfloat16)))


def test_hessian_vector_product_passes_through():
  """Forward-over-reverse (scripts/hessian.py) works and matches the chain without boundaries."""
  w = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4)

  def chain(x, boundary):
    for row in w:
      x = boundary(x + jnp.tanh(x * row))
    return jnp.sum(x ** 3)

  x = jnp.linspace(0.1, 0.9, 4, dtype=jnp.float32)
  v = jnp.array([1.0, -2.0, 0.5, 3.0], jnp.float32)
  hvp = lambda boundary: jax.jvp(jax.grad(lambda x: chain(x, boundary)), (x,), (v,))[1]
  np.testing.assert_allclose(hvp(fusion_boundary), hvp(lambda h: h), rtol=1e-6)


@pytest.mark.parametrize('norm_position', ['pre', 'post'])
def test_model_loss_and_gradients_equal_those_without_boundaries(norm_position, monkeypatch):
  model = Transformer(tiny_config(norm_position=norm_position, dropout_rate=0.3))
  params = model.init(jax.random.PRNGKey(0), SOURCE, TARGET_IN)['params']

  def loss(params):
    logits = model.apply({'params': params}, SOURCE, TARGET_IN, train=True,
                         rngs={'dropout': jax.random.PRNGKey(1)})
    return losses.weighted_sums(logits, TARGET_OUT, TARGET_OUT > 0, label_smoothing=0.1)['loss']

  with_boundaries = jax.jit(jax.value_and_grad(loss))(params)
  monkeypatch.setattr(blocks, 'fusion_boundary', lambda x: x)
  without = jax.jit(jax.value_and_grad(loss))(params)
  # Equal up to float32 rounding: XLA may sum the gradient contributions in another order.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               with_boundaries, without)
