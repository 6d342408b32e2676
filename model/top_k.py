"""An exact top-k over the last axis that is faster than `jax.lax.top_k` on a CPU.

Beam search ranks each beam's whole vocabulary every step; XLA's CPU TopK sorts its whole input
row by row, so ranking a few blocks instead pays (model/decoding.py).
"""

import jax
import jax.numpy as jnp


# Block width of `top_k_by_blocks`: on the 2-core Zen 5 VM, [160 | 640, 8000] -> 10 took 0.65 |
# 2.8 ms with blocks of 32 against 1.6 | 6.5 ms for lax.top_k; wider blocks were slower.
_TOP_K_BLOCK = 32


def top_k_by_blocks(x, k, block=_TOP_K_BLOCK):
  """`jax.lax.top_k(x, k)` over the last axis, exactly (ties too: lower index first), faster on CPU.

  The k largest values of a row lie in the k blocks of `block` consecutive entries with the
  largest maxima (ties: lower block first): an entry in any other block has k block maxima ahead
  of it. So only those k blocks, in their row order, are ranked: XLA's CPU TopK sorts its whole
  input row by row, the block maxima are one vectorised pass.

  Args:
    x: [..., V] float.
    k: values to return per row.
    block: entries per block; rows of fewer than k blocks (or V not a multiple of `block`) use
      lax.top_k as it is.

  Returns:
    (values [..., k], indices int32 [..., k]), as lax.top_k.
  """
  vocab = x.shape[-1]
  if vocab % block or vocab // block < k:
    return jax.lax.top_k(x, k)
  blocks = x.reshape(*x.shape[:-1], vocab // block, block)  # [..., V/block, block]
  _, chosen = jax.lax.top_k(blocks.max(axis=-1), k)  # [..., k]
  # In row order, so ties among the candidates still go to the lower index.
  chosen = jnp.sort(chosen, axis=-1)
  candidates = jnp.take_along_axis(blocks, chosen[..., None], axis=-2)  # [..., k, block]
  values, positions = jax.lax.top_k(candidates.reshape(*x.shape[:-1], k * block), k)
  blocks_of = jnp.take_along_axis(chosen, positions // block, axis=-1)
  return values, (blocks_of * block + positions % block).astype(jnp.int32)
