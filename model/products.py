"""Matrix products of activations with weights in a compute dtype narrower than float32.

In float32 a product is lax.dot_general's. In bfloat16 (model.dtype) both operands are rounded to
it and every product, forward and backward, accumulates in float32 and returns float32, rounded to
bfloat16 afterwards. That is what a GPU's bfloat16 product does anyway; on a CPU it is also what
lets XLA use its bfloat16 kernels at all. On an AMD EPYC Zen 4 (docs/performance.md) XLA multiplies
bfloat16 at about twice its float32 rate only when
- the product's result is float32 (with a bfloat16 result it converts the operands to float32
  first), and
- the operand it contracts over its first axis is not a transpose of another array (the weight
  gradient x^T g contracts the token axis of both): otherwise it converts both to float32 too.
So the backward pass is written out: the output's cotangent rounded to bfloat16, and the weight
gradient read from a transposed copy of x made in a form XLA does not fold back into the product.

Dimensions: M rows (tokens), K contracted, N out.
"""

import math

import jax
import jax.numpy as jnp


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
  """lax.dot_general, taken by flax's Dense and DenseGeneral (their `dot_general`): a product of
  `lhs` [..., K...] with `rhs` [K..., N...] over lhs's last and rhs's first axes, in a dtype
  narrower than float32, runs as `_rounded_product`; every other product as lax.dot_general."""
  (lhs_contracting, rhs_contracting), batch = dimension_numbers
  count = len(lhs_contracting)
  weights_product = (not batch[0] and lhs.dtype == rhs.dtype and lhs.dtype != jnp.float32
                     and tuple(lhs_contracting) == tuple(range(lhs.ndim - count, lhs.ndim))
                     and tuple(rhs_contracting) == tuple(range(count))
                     and preferred_element_type in (None, lhs.dtype))
  if not weights_product:
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
  batch_shape, out_shape = lhs.shape[:lhs.ndim - count], rhs.shape[count:]
  contracted = math.prod(rhs.shape[:count])
  product = _rounded_product(lhs.reshape(-1, contracted),
                             rhs.reshape(contracted, -1))  # [M, N]
  return product.reshape(*batch_shape, *out_shape)


def dense(x, kernel):
  """x [..., K] times kernel [K, ...] in x's dtype (the kernel cast to it): [..., ...]."""
  return dot_general(x, kernel.astype(x.dtype), (((x.ndim - 1,), (0,)), ((), ())))


def transposed_copy(x):
  """x [M, K] transposed, [K, M]: for a product, x^T g. An array of its own for a narrow dtype on a
  CPU; x.T, which XLA folds into the product, for float32 or elsewhere.

  XLA folds a plain transpose into the product that reads it (as a contraction over the first
  axis), which its CPU backend runs in float32 for a bfloat16 operand. A transpose of a reshaped
  x is not folded: the copy costs a pass over x, the product then runs at the bfloat16 rate.
  """
  rows, columns = x.shape
  if x.dtype == jnp.float32 or jax.default_backend() != 'cpu' or columns % 16:
    return x.T
  split = x.reshape(rows, columns // 16, 16)  # [M, K / 16, 16]
  return jnp.transpose(split, (1, 2, 0)).reshape(columns, rows)  # [K, M]


def _product(x, w):
  """x [M, K] times w [K, N], both of one narrow dtype: accumulated in float32, rounded to it."""
  return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)


_rounded_product = jax.custom_vjp(_product)


def _rounded_product_forward(x, w):
  # _product, not _rounded_product: forward-mode differentiation of the gradient (Hessian-vector
  # products, scripts/hessian.py) cannot pass a custom_vjp call.
  return _product(x, w), (x, w)


def _rounded_product_backward(residuals, out_grad):
  x, w = residuals
  out_grad = out_grad.astype(x.dtype)  # [M, N]
  x_grad = jax.lax.dot_general(out_grad, w, (((1,), (1,)), ((), ())),
                               preferred_element_type=jnp.float32)  # [M, K]
  w_grad = jnp.dot(transposed_copy(x), out_grad, preferred_element_type=jnp.float32)  # [K, N]
  return x_grad.astype(x.dtype), w_grad.astype(w.dtype)


_rounded_product.defvjp(_rounded_product_forward, _rounded_product_backward)
