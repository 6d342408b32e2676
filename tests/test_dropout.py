"""model/dropout.py: the draws are threefry-2x32 of each hash's flat index (a NumPy reference),
uniform and independent; dropout keeps elements at its stated probability and is unbiased."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import dropout

ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(key0, key1, x0, x1):
  """Threefry-2x32 with 20 rounds (Salmon et al. 2011) on uint32 NumPy arrays."""
  rotl = lambda v, r: (v << np.uint32(r)) | (v >> np.uint32(32 - r))
  ks = (np.uint32(key0), np.uint32(key1), np.uint32(key0) ^ np.uint32(key1) ^ np.uint32(0x1BD11BDA))
  with np.errstate(over='ignore'):
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for group in range(5):
      for r in ROTATIONS[group % 2]:
        x0 = x0 + x1
        x1 = rotl(x1, r) ^ x0
      x0, x1 = x0 + ks[(group + 1) % 3], x1 + ks[(group + 2) % 3] + np.uint32(group + 1)
  return x0, x1


def test_reference_threefry_known_answer():
  # Random123's known-answer vector for threefry2x32_20: key (0, 0), counter (0, 0).
  x0, x1 = _threefry2x32(0, 0, np.zeros(1, np.uint32), np.zeros(1, np.uint32))
  assert (int(x0[0]), int(x1[0])) == (0x6B200159, 0x99BA4EFE)


@pytest.mark.parametrize('shape', [(3, 10), (2, 2, 8), (5,)])
def test_draws_are_threefry_of_each_hash_index(shape):
  key = jax.random.key(7)
  draws = np.asarray(jax.jit(dropout.uniform_draws, static_argnums=1)(key, shape))
  keypair = np.asarray(jax.random.bits(key, (2,), jnp.uint32))
  groups = (*shape[:-1], -(-shape[-1] // 4))
  index = np.arange(np.prod(groups), dtype=np.uint32)
  x0, x1 = _threefry2x32(keypair[0], keypair[1], np.zeros_like(index), index)
  # Each hash's two words, little-endian halves: lo(x0), hi(x0), lo(x1), hi(x1).
  halves = np.stack([x0 & 0xFFFF, x0 >> 16, x1 & 0xFFFF, x1 >> 16], axis=-1).astype(np.uint16)
  expected = halves.reshape(*groups[:-1], groups[-1] * 4)[..., :shape[-1]]
  assert draws.dtype == np.uint16 and draws.shape == shape
  np.testing.assert_array_equal(draws, expected)


def test_draws_are_uniform_and_uncorrelated():
  n = 2**20
  draws = np.asarray(dropout.uniform_draws(jax.random.key(0), (n // 64, 64)), np.float64).ravel()
  counts = np.histogram(draws, bins=16, range=(0, 2**16))[0]
  chi2 = ((counts - n / 16) ** 2 / (n / 16)).sum()
  assert chi2 < 50  # 15 degrees of freedom: P(chi2 > 50) < 1e-5
  u = (draws - draws.mean()) / draws.std()
  for lag in (1, 2, 3, 4, 64):  # within one hash, across hashes, across rows
    assert abs(np.mean(u[:-lag] * u[lag:])) < 5 / np.sqrt(n)


@pytest.mark.parametrize('rate', [0.1, 0.3, 1 / 3, 0.5, 0.99])
def test_keep_threshold_is_within_half_a_step_of_the_rate(rate):
  keep = dropout.keep_threshold(rate) / 2**16
  assert abs(keep - (1 - rate)) <= 2**-17


def test_dropout_keeps_at_its_rate_and_is_unbiased():
  rate, shape = 0.3, (256, 128)
  x = jax.random.normal(jax.random.key(1), shape)
  layer = dropout.Dropout(rate)
  out, vjp = jax.vjp(lambda x: layer.apply({}, x, deterministic=False, rngs={'dropout': jax.random.key(2)}), x)
  keep_prob = dropout.keep_threshold(rate) / 2**16
  kept = np.asarray(out) != 0
  # Kept elements are x / keep_prob exactly; the others are zero.
  np.testing.assert_allclose(np.asarray(out)[kept], np.asarray(x)[kept] / keep_prob, rtol=1e-7)
  n = kept.size
  assert abs(kept.mean() - keep_prob) < 5 * np.sqrt(keep_prob * (1 - keep_prob) / n)
  # The gradient is the mask over the keep probability.
  (grad,) = vjp(jnp.ones(shape))
  np.testing.assert_allclose(np.asarray(grad), kept / keep_prob, rtol=1e-7)


def test_masks_follow_the_key():
  apply = lambda seed: dropout.Dropout(0.5).apply({}, jnp.ones((64, 64)), deterministic=False,
                                                  rngs={'dropout': jax.random.key(seed)})
  np.testing.assert_array_equal(apply(3), apply(3))
  assert (np.asarray(apply(3)) != np.asarray(apply(4))).mean() > 0.4


def test_identity_and_zero_cases():
  x = jnp.arange(12.0).reshape(3, 4)
  rngs = {'dropout': jax.random.key(0)}
  assert dropout.Dropout(0.3).apply({}, x, deterministic=True) is x
  assert dropout.Dropout(0.0).apply({}, x, deterministic=False, rngs=rngs) is x
  np.testing.assert_array_equal(dropout.Dropout(1.0).apply({}, x, deterministic=False, rngs=rngs), 0.0)
  bf16 = dropout.Dropout(0.3).apply({}, x.astype(jnp.bfloat16), deterministic=False, rngs=rngs)
  assert bf16.dtype == jnp.bfloat16


def test_shape_without_axes_is_rejected():
  with pytest.raises(ValueError, match='at least one axis'):
    dropout.uniform_draws(jax.random.key(0), ())
