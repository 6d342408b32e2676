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

Attention's two batched products (`einsum`) are rounded the same way: bfloat16 operands, float32
sums, and in the backward pass the cotangent rounded to bfloat16 before both gradient products. Left
to autodiff, the float32 cotangent of the float32 logits made XLA convert the queries, keys and
values to float32 for the backward products, and keep copies of them in both dtypes.

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


def einsum(spec: str, lhs, rhs, out_dtype=None):
  """jnp.einsum(spec, lhs, rhs) of two operands of one dtype, returned in `out_dtype` (default:
  theirs). In float32 it is jnp.einsum's product; in a narrower dtype the sums are float32 and
  the backward products take the cotangent rounded to the operands' dtype (`_rounded_einsum`).

  `spec` is 'lhs,rhs->out' with every operand axis in the output or the other operand (no axis
  summed inside one operand), as attention's 'BTNH,BSNH->BNTS' and 'BNTS,BSNH->BTNH'.
  """
  if lhs.dtype != rhs.dtype:
    raise ValueError(f'products.einsum {spec!r}: operands of one dtype expected, got '
                     f'{lhs.dtype} and {rhs.dtype}')
  out_dtype = jnp.dtype(out_dtype or lhs.dtype)
  if lhs.dtype == jnp.float32:
    return jnp.einsum(spec, lhs, rhs).astype(out_dtype)
  return _rounded_einsum(spec, out_dtype, lhs, rhs)


def _einsum(spec, out_dtype, lhs, rhs):
  return jnp.einsum(spec, lhs, rhs, preferred_element_type=jnp.float32).astype(out_dtype)


_rounded_einsum = jax.custom_vjp(_einsum, nondiff_argnums=(0, 1))


def _rounded_einsum_forward(spec, out_dtype, lhs, rhs):
  # _einsum, not _rounded_einsum: see _rounded_product_forward.
  return _einsum(spec, out_dtype, lhs, rhs), (lhs, rhs)


def _rounded_einsum_backward(spec, out_dtype, residuals, out_grad):
  del out_dtype
  lhs, rhs = residuals
  operands, out = spec.split('->')
  lhs_axes, rhs_axes = operands.split(',')
  out_grad = out_grad.astype(lhs.dtype)
  lhs_grad = _float32_einsum(lhs_axes, (out_grad, out), (rhs, rhs_axes))
  rhs_grad = _float32_einsum(rhs_axes, (out_grad, out), (lhs, lhs_axes))
  return lhs_grad.astype(lhs.dtype), rhs_grad.astype(rhs.dtype)


def _float32_einsum(out_axes: str, first, second):
  """The einsum of two (operand, axes) pairs into `out_axes` with float32 sums, the operand that
  holds the output's first axis of its own taken first.

  XLA's CPU product of two bfloat16 operands into float32 exists for a batched product only in
  some operand orders (for attention's 'BTNH,BNTS->BSNH' it fails to run, for 'BNTS,BTNH->BSNH'
  not), and this order is one that runs for each of attention's gradient products.
  """
  own = [axis for axis in out_axes if (axis in first[1]) != (axis in second[1])]
  if own and own[0] in second[1]:
    first, second = second, first
  return jnp.einsum(f'{first[1]},{second[1]}->{out_axes}', first[0], second[0],
                    preferred_element_type=jnp.float32)


_rounded_einsum.defvjp(_rounded_einsum_forward, _rounded_einsum_backward)
