"""model/products.py: float32 products are lax's own; bfloat16 products and their gradients are
the float32 products of the rounded operands, rounded."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import products

RNG = np.random.default_rng(0)


def _normal(*shape, dtype=jnp.float32):
  return jnp.asarray(RNG.normal(size=shape), dtype)


@pytest.mark.parametrize('shape', [(24, 32), (24, 20), (1, 16)])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_transposed_copy_is_the_transpose(shape, dtype):
  x = _normal(*shape, dtype=dtype)
  copy = jax.jit(products.transposed_copy)(x)
  assert copy.dtype == dtype
  np.testing.assert_array_equal(np.asarray(copy, np.float32), np.asarray(x.T, np.float32))


def test_float32_products_are_lax_dot_general():
  x, kernel = _normal(3, 5, 16), _normal(16, 4, 8)  # [B, L, D], [D, N, H]
  np.testing.assert_array_equal(jax.jit(products.dense)(x, kernel),
                                jax.jit(lambda x, k: jnp.einsum('...D,DNH->...NH', x, k))(x, kernel))


def _rounded_reference(x, w, out_grad):
  """The product and its gradients in float32 from the bfloat16-rounded operands and cotangent,
  each rounded to bfloat16 as products.py's are."""
  as32 = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)
  x32, w32, g32 = as32(x), as32(w), as32(out_grad)
  out = (x32 @ w32).astype(jnp.bfloat16)
  return out, (g32 @ w32.T).astype(jnp.bfloat16), (x32.T @ g32).astype(jnp.bfloat16)


@pytest.mark.parametrize('rows, contracted, out', [(40, 32, 24), (40, 20, 24)])
def test_bfloat16_product_and_gradients_accumulate_in_float32(rows, contracted, out):
  x = _normal(rows, contracted, dtype=jnp.bfloat16)
  w = _normal(contracted, out, dtype=jnp.bfloat16)
  out_grad = _normal(rows, out, dtype=jnp.bfloat16)
  product = lambda x, w: products.dense(x, w)
  got, vjp = jax.vjp(jax.jit(product), x, w)
  x_grad, w_grad = vjp(out_grad)
  want, want_x_grad, want_w_grad = _rounded_reference(x, w, out_grad)
  for value, reference in ((got, want), (x_grad, want_x_grad), (w_grad, want_w_grad)):
    assert value.dtype == jnp.bfloat16
    # float32 sums in another order, then one bfloat16 rounding: at most one unit of its last
    # place (2^-8 relative) apart.
    np.testing.assert_allclose(np.asarray(value, np.float32), np.asarray(reference, np.float32),
                               rtol=2 ** -7, atol=1e-2)


def test_dense_layers_take_the_rounded_product_over_several_contracted_axes():
  """DenseGeneral over (N, H), as attention's output projection, in bfloat16 against float32."""
  x = _normal(2, 6, 4, 8)  # [B, T, N, H]
  layer = lambda dtype: nn.DenseGeneral(16, axis=(-2, -1), dtype=dtype, param_dtype=jnp.float32,
                                        dot_general=products.dot_general)
  variables = layer(jnp.float32).init(jax.random.key(0), x)
  loss = lambda dtype: lambda v, x: (layer(dtype).apply(v, x).astype(jnp.float32) ** 2).sum()
  grads = {dtype: jax.grad(loss(dtype))(variables, x) for dtype in (jnp.float32, jnp.bfloat16)}
  for got, want in zip(jax.tree.leaves(grads[jnp.bfloat16]), jax.tree.leaves(grads[jnp.float32])):
    assert got.dtype == jnp.float32  # the parameters' gradient, whatever the compute dtype
    np.testing.assert_allclose(got, want, rtol=3e-2, atol=3e-2 * float(jnp.abs(want).max()))


def test_bfloat16_hessian_vector_products_pass_the_written_out_gradient():
  """Forward-mode differentiation of the written-out gradient (scripts/hessian.py) is defined and
  equals the closed form."""
  x = _normal(8, 16, dtype=jnp.bfloat16)
  w, direction = _normal(16, 4), _normal(16, 4)
  grad = jax.grad(lambda w: (products.dense(x, w).astype(jnp.float32) ** 2).sum())
  _, hvp = jax.jvp(grad, (w,), (direction,))
  # The loss is quadratic in the rounded weights: the Hessian-vector product is 2 x^T x v, with
  # x^T x and v rounded as the products round them.
  x32 = x.astype(jnp.float32)
  rounded = direction.astype(jnp.bfloat16).astype(jnp.float32)
  np.testing.assert_allclose(hvp, 2 * x32.T @ (x32 @ rounded), rtol=3e-2,
                             atol=3e-2 * float(jnp.abs(hvp).max()))


@pytest.mark.parametrize('spec, lhs_shape, rhs_shape, out_dtype', [
    ('BTNH,BSNH->BNTS', (2, 5, 3, 8), (2, 7, 3, 8), jnp.float32),  # attention's logits
    ('BNTS,BSNH->BTNH', (2, 3, 5, 7), (2, 7, 3, 8), jnp.bfloat16),  # its weighted values
])
def test_bfloat16_einsum_and_gradients_accumulate_in_float32(spec, lhs_shape, rhs_shape,
                                                             out_dtype):
  """Attention's batched products in bfloat16: the float32 einsum of the rounded operands, and
  gradients from the cotangent rounded to bfloat16, each rounded once."""
  lhs = _normal(*lhs_shape, dtype=jnp.bfloat16)
  rhs = _normal(*rhs_shape, dtype=jnp.bfloat16)
  got, vjp = jax.vjp(jax.jit(lambda a, b: products.einsum(spec, a, b, out_dtype)), lhs, rhs)
  out_grad = _normal(*got.shape, dtype=out_dtype)
  lhs_grad, rhs_grad = vjp(out_grad)
  as32 = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)
  # The float32 reference and its gradients are autodiff's of jnp.einsum.
  reference = lambda a, b: jnp.einsum(spec, a, b, precision=jax.lax.Precision.HIGHEST)
  want, want_vjp = jax.vjp(reference, as32(lhs), as32(rhs))
  want_lhs_grad, want_rhs_grad = want_vjp(as32(out_grad))
  assert got.dtype == out_dtype
  assert lhs_grad.dtype == rhs_grad.dtype == jnp.bfloat16
  for value, reference in ((got, want.astype(out_dtype)), (lhs_grad, want_lhs_grad),
                           (rhs_grad, want_rhs_grad)):
    # float32 sums in another order, then at most one bfloat16 rounding.
    np.testing.assert_allclose(np.asarray(value, np.float32), np.asarray(reference, np.float32),
                               rtol=2 ** -7, atol=1e-2)


def test_float32_einsum_is_jnp_einsum():
  lhs, rhs = _normal(2, 5, 3, 8), _normal(2, 7, 3, 8)
  np.testing.assert_array_equal(products.einsum('BTNH,BSNH->BNTS', lhs, rhs),
                                jnp.einsum('BTNH,BSNH->BNTS', lhs, rhs))


def test_einsum_rejects_operands_of_two_dtypes():
  with pytest.raises(ValueError, match='one dtype expected, got bfloat16 and float32'):
    products.einsum('ij,jk->ik', _normal(2, 3, dtype=jnp.bfloat16), _normal(3, 4))


def test_bfloat16_einsum_hessian_vector_products_pass_the_written_out_gradient():
  """As for `dense`: forward-mode differentiation of the einsum's written-out gradient is defined
  and equals the closed form 2 A^T A v of the quadratic loss |A w|^2 per batch entry."""
  a = _normal(3, 6, 8, dtype=jnp.bfloat16)  # [B, T, H]
  w, direction = _normal(3, 8, 5), _normal(3, 8, 5)  # [B, H, S]
  loss = lambda w: (products.einsum('BTH,BHS->BTS', a, w.astype(jnp.bfloat16), jnp.float32)
                    ** 2).sum()
  _, hvp = jax.jvp(jax.grad(loss), (w,), (direction,))
  a32 = a.astype(jnp.float32)
  rounded = direction.astype(jnp.bfloat16).astype(jnp.float32)
  want = 2 * np.einsum('BTH,BTK,BKS->BHS', a32, a32, rounded)
  np.testing.assert_allclose(hvp, want, rtol=3e-2, atol=3e-2 * float(jnp.abs(want).max()))
