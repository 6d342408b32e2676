"""Attention, masks, norms, positions and residual wiring against closed forms and NumPy."""


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import blocks, masks, norms, position
from model.attention import HeadProjection, MultiHeadAttention

RNG = np.random.default_rng(0)


def numpy_attention(x_q, x_kv, params, mask, num_heads, bias=0.0):
  """softmax(Q K^T / sqrt(H) + bias + mask) V, then the output projection, in float64 NumPy."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  proj = lambda x, name: np.einsum('btd,dnh->btnh', x, p[name]['kernel']) + p[name]['bias']
  q, k, v = proj(x_q, 'query'), proj(x_kv, 'key'), proj(x_kv, 'value')
  logits = np.einsum('btnh,bsnh->bnts', q, k) / np.sqrt(q.shape[-1]) + bias
  logits = np.where(mask, logits, -1e30)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = np.einsum('bnts,bsnh->btnh', probs, v)
  return np.einsum('btnh,nhd->btd', out, p['out']['kernel']) + p['out']['bias']


def test_head_projection_creates_dense_generals_parameters():
  """Q, K, V weights are those nn.DenseGeneral((N, H)) made before the projections were fused: the
  same names, shapes and initial values for the same key, so seeds and checkpoints carry over."""
  init = nn.initializers.xavier_uniform()

  class Dense(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.DenseGeneral((4, 8), kernel_init=init, name='query')(x)

  class Fused(nn.Module):
    @nn.compact
    def __call__(self, x):
      return HeadProjection(4, 8, init, name='query')(x.shape[-1])

  x = jnp.ones((1, 32))
  want = Dense().init(jax.random.PRNGKey(3), x)['params']
  got = Fused().init(jax.random.PRNGKey(3), x)['params']
  assert jax.tree.structure(got) == jax.tree.structure(want)
  jax.tree.map(np.testing.assert_array_equal, got, want)


@pytest.fixture(scope='module')
def attention_setup():
  module = MultiHeadAttention(d_model=16, num_heads=4)
  x = jnp.asarray(RNG.normal(size=(2, 5, 16)), jnp.float32)
  params = module.init(jax.random.PRNGKey(0), x, masks.causal_mask(5))['params']
  # Non-zero biases, so the reference checks them too.
  params = jax.tree.map(lambda a: a + 0.1 * jnp.asarray(RNG.normal(size=a.shape), a.dtype), params)
  return module, params, x


def test_self_attention_matches_numpy_with_padding_and_causal_mask(attention_setup):
  module, params, x = attention_setup
  token_mask = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
  mask = masks.decoder_self_mask(token_mask)
  got = module.apply({'params': params}, x, mask)
  want = numpy_attention(np.asarray(x), np.asarray(x), params, np.asarray(mask), 4)
  real = np.asarray(token_mask)
  np.testing.assert_allclose(np.asarray(got)[real], want[real], rtol=1e-4, atol=1e-5)


def test_cross_attention_matches_numpy(attention_setup):
  module, params, x = attention_setup
  source = jnp.asarray(RNG.normal(size=(2, 3, 16)), jnp.float32)
  mask = masks.padding_mask(jnp.ones((2, 5), bool), jnp.array([[1, 1, 1], [1, 0, 0]], bool))
  kv = module.apply({'params': params}, source, method=MultiHeadAttention.project_kv)
  got = module.apply({'params': params}, x, kv, mask, method=MultiHeadAttention.cross)
  want = numpy_attention(np.asarray(x), np.asarray(source), params, np.asarray(mask), 4)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_causal_output_ignores_future_tokens(attention_setup):
  module, params, x = attention_setup
  changed = x.at[:, 3:].set(jnp.asarray(RNG.normal(size=(2, 2, 16)), jnp.float32))
  run = lambda inputs: module.apply({'params': params}, inputs, masks.causal_mask(5))
  np.testing.assert_allclose(run(x)[:, :3], run(changed)[:, :3], rtol=1e-6, atol=1e-6)
  assert not np.allclose(run(x)[:, 3:], run(changed)[:, 3:])


def test_padding_contents_do_not_change_real_outputs(attention_setup):
  module, params, x = attention_setup
  token_mask = jnp.array([[1, 1, 1, 0, 0]] * 2, bool)
  changed = x.at[:, 3:].set(100.0)
  run = lambda inputs: module.apply({'params': params}, inputs, masks.padding_mask(token_mask, token_mask))
  np.testing.assert_allclose(run(x)[:, :3], run(changed)[:, :3], rtol=1e-6, atol=1e-6)


def test_fused_attention_path_equals_einsum_path(attention_setup):
  _, params, x = attention_setup
  mask = masks.decoder_self_mask(jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], bool))
  run = lambda impl: MultiHeadAttention(d_model=16, num_heads=4, impl=impl).apply({'params': params}, x, mask)
  np.testing.assert_allclose(run('jax')[:, :4], run('xla')[:, :4], rtol=1e-5, atol=1e-5)


def test_alibi_slopes_are_those_of_press_et_al():
  # Powers of two: 2^(-8/N), 2^(-16/N), ..., 2^(-8).
  np.testing.assert_allclose(position.alibi_slopes(8), [2.0 ** -k for k in range(1, 9)])
  np.testing.assert_allclose(position.alibi_slopes(4), [2.0 ** -k for k in (2, 4, 6, 8)])
  # Otherwise the 4-head slopes, then every other 8-head slope: their reference code for N = 6.
  np.testing.assert_allclose(position.alibi_slopes(6), [2.0 ** -k for k in (2, 4, 6, 8, 1, 3)])
  assert position.alibi_slopes(1).tolist() == [2.0 ** -8]


def test_alibi_attention_equals_the_closed_form_bias_and_depends_on_distance_only():
  x = jnp.asarray(RNG.normal(size=(2, 5, 16)), jnp.float32)
  module = MultiHeadAttention(d_model=16, num_heads=4, linear_bias=True)
  mask = masks.decoder_self_mask(jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], bool))
  positions = jnp.broadcast_to(jnp.arange(5), (2, 5))
  params = module.init(jax.random.PRNGKey(0), x, mask, positions)['params']
  distance = np.abs(np.arange(5)[:, None] - np.arange(5)[None, :])  # [T, S]
  bias = -(2.0 ** -np.arange(2, 10, 2))[None, :, None, None] * distance  # m_h = 2^-2, ..., 2^-8
  np.testing.assert_allclose(position.alibi_bias(positions, positions, 4), np.broadcast_to(bias, (2, 4, 5, 5)),
                             rtol=1e-6)
  got = module.apply({'params': params}, x, mask, positions)
  want = numpy_attention(np.asarray(x), np.asarray(x), params, np.asarray(mask), 4, bias)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got[1, :4], want[1, :4], rtol=1e-4, atol=1e-5)
  # Relative: shifting every position leaves the output unchanged.
  np.testing.assert_allclose(module.apply({'params': params}, x, mask, positions + 37), got, rtol=1e-5, atol=1e-6)
  # The fused path takes the same bias.
  fused = MultiHeadAttention(d_model=16, num_heads=4, linear_bias=True, impl='jax')
  np.testing.assert_allclose(fused.apply({'params': params}, x, mask, positions)[:, :4], got[:, :4],
                             rtol=1e-5, atol=1e-5)


def test_bfloat16_attention_keeps_float32_logits():
  x = jnp.asarray(RNG.normal(size=(1, 4, 8)), jnp.bfloat16)
  module = MultiHeadAttention(d_model=8, num_heads=2, dtype=jnp.bfloat16)
  variables = module.init(jax.random.PRNGKey(0), x, masks.causal_mask(4))
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(variables))
  jaxpr = jax.make_jaxpr(lambda v: module.apply(v, x, masks.causal_mask(4)))(variables)
  softmax_inputs = [eqn for eqn in jaxpr.eqns if eqn.primitive.name == 'reduce_max']
  assert softmax_inputs and all(e.invars[0].aval.dtype == jnp.float32 for e in softmax_inputs)
  assert module.apply(variables, x, masks.causal_mask(4)).dtype == jnp.bfloat16


def test_masks_are_the_explicit_matrices():
  np.testing.assert_array_equal(masks.causal_mask(3)[0, 0], np.tril(np.ones((3, 3), bool)))
  got = masks.padding_mask(jnp.array([[1, 1, 0]], bool), jnp.array([[1, 0]], bool))[0, 0]
  np.testing.assert_array_equal(got, [[1, 0], [1, 0], [0, 0]])
  got = masks.decoder_self_mask(jnp.array([[1, 1, 0]], bool))[0, 0]
  np.testing.assert_array_equal(got, [[1, 0, 0], [1, 1, 0], [0, 0, 0]])
  # Slot c of cache column k is entry c * K + k; hypothesis 0 went through columns 1, 0, 0 of
  # slots 0-2, hypothesis 1 through 1, 1, 1; at position 1 slot 2 is not written yet.
  history = jnp.array([[[1, 0, 0], [1, 1, 1]]])  # [B=1, K=2, C=3]
  got = masks.hypothesis_history_mask(history, jnp.int32(1))[0, 0]  # [K, C*K]
  np.testing.assert_array_equal(got, [[0, 1, 1, 0, 0, 0], [0, 1, 0, 1, 0, 0]])


# ---- positions ----

def test_sinusoidal_table_matches_closed_form():
  length, dim = 50, 16
  table = np.asarray(position.sinusoidal_table(length, dim))
  for pos in (0, 1, 7, 49):
    for i in range(dim // 2):
      angle = pos / 10000 ** (2 * i / dim)
      assert table[pos, 2 * i] == pytest.approx(np.sin(angle), abs=1e-6)
      assert table[pos, 2 * i + 1] == pytest.approx(np.cos(angle), abs=1e-6)


def test_sinusoidal_shift_is_a_fixed_rotation():
  """p_{pos+k} = M_k p_pos, M_k block-diagonal 2x2 rotations independent of pos."""
  dim, k = 16, 5
  table = np.asarray(position.sinusoidal_table(64, dim), np.float64)
  omega = 1.0 / 10000 ** (np.arange(0, dim, 2) / dim)
  m_k = np.zeros((dim, dim))
  for i, w in enumerate(omega):
    c, s = np.cos(w * k), np.sin(w * k)
    # (sin, cos)(a + b) = (sin a cos b + cos a sin b, cos a cos b - sin a sin b)
    m_k[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, s], [-s, c]]
  for pos in (0, 3, 20, 58):
    np.testing.assert_allclose(m_k @ table[pos], table[pos + k], atol=1e-5)


def test_rope_inner_product_depends_only_on_relative_position():
  q = jnp.asarray(RNG.normal(size=(1, 1, 1, 8)), jnp.float32)
  k = jnp.asarray(RNG.normal(size=(1, 1, 1, 8)), jnp.float32)
  at = lambda x, p: position.apply_rope(x, jnp.array([[p]]))[0, 0, 0]
  for offset in (0, 1, 3, 10):
    scores = [float(at(q, i + offset) @ at(k, i)) for i in (0, 2, 17, 40)]
    np.testing.assert_allclose(scores, scores[0], rtol=1e-4, atol=1e-4)
  assert abs(float(at(q, 5) @ at(k, 0)) - float(at(q, 6) @ at(k, 0))) > 1e-4


def test_rope_preserves_norms_and_position_zero_is_identity():
  x = jnp.asarray(RNG.normal(size=(2, 6, 3, 8)), jnp.float32)
  positions = jnp.asarray(RNG.integers(0, 500, size=(2, 6)))
  rotated = position.apply_rope(x, positions)
  np.testing.assert_allclose(jnp.linalg.norm(rotated, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)
  np.testing.assert_allclose(position.apply_rope(x, jnp.zeros((2, 6), int)), x, atol=1e-7)


def test_rope_matches_two_by_two_rotation_formula():
  x = np.asarray(RNG.normal(size=(8,)), np.float64)
  pos = 7
  got = np.asarray(position.apply_rope(jnp.asarray(x, jnp.float32)[None, None, None], jnp.array([[pos]])))[0, 0, 0]
  theta = pos * 10000.0 ** (-np.arange(0, 8, 2) / 8)
  a, b = x[:4], x[4:]
  want = np.concatenate([a * np.cos(theta) - b * np.sin(theta), b * np.cos(theta) + a * np.sin(theta)])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---- norms ----

X = RNG.normal(loc=1.5, scale=3.0, size=(3, 4, 8)).astype(np.float32)


def _apply_norm(name, x, mask=None, train=False, **kwargs):
  module = norms.NORMS[name](epsilon=1e-5)
  variables = module.init(jax.random.PRNGKey(0), x, mask, train)
  out, updates = module.apply(variables, x, mask, train, mutable=['batch_stats'], **kwargs)
  return out, variables, updates


def test_layer_norm_formula():
  out, _, _ = _apply_norm('layer', X)
  want = (X - X.mean(-1, keepdims=True)) / np.sqrt(X.var(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_rms_norm_formula():
  out, _, _ = _apply_norm('rms', X)
  np.testing.assert_allclose(out, X / np.sqrt((X ** 2).mean(-1, keepdims=True) + 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('name', ['layer', 'rms'])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_flax_layer_and_rms_norm_equal_the_formula_with_scale_bias_and_dtype(name, dtype):
  """flax's layers stand in for the hand-written ones: same parameters, float32 statistics,
  the output in the input's dtype."""
  module = norms.NORMS[name](epsilon=1e-5)
  x = jnp.asarray(X, dtype)
  variables = module.init(jax.random.PRNGKey(0), x)
  names = {'layer': ['bias', 'scale'], 'rms': ['scale']}[name]
  assert sorted(variables['params']) == names
  params = {key: RNG.normal(size=(8,)).astype(np.float32) for key in names}
  out = module.apply({'params': params}, x)
  assert out.dtype == dtype
  h = np.asarray(x, np.float32)
  if name == 'layer':
    want = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
    want = want * params['scale'] + params['bias']
  else:
    want = h / np.sqrt((h ** 2).mean(-1, keepdims=True) + 1e-5) * params['scale']
  tolerance = 1e-5 if dtype == jnp.float32 else 1e-2
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(jnp.asarray(want, dtype), np.float32),
                             rtol=tolerance, atol=tolerance)


def test_scale_norm_formula():
  out, _, _ = _apply_norm('scale', X)
  want = np.sqrt(8) * X / np.linalg.norm(X, axis=-1, keepdims=True)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_batch_norm_statistics_exclude_padding():
  mask = np.ones((3, 4), bool)
  mask[1, 2:] = False
  mask[2, 1:] = False
  garbage = X.copy()
  garbage[~mask] = 1e4  # padding contents must not matter
  out, _, updates = _apply_norm('batch', jnp.asarray(garbage), jnp.asarray(mask), train=True)
  real = X[mask]  # [tokens, D]
  mean, var = real.mean(0), real.var(0)
  np.testing.assert_allclose(np.asarray(out)[mask], (real - mean) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-4)
  stats = updates['batch_stats']
  np.testing.assert_allclose(stats['mean'], 0.1 * mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats['var'], 0.9 + 0.1 * var, rtol=1e-5)


def test_batch_norm_eval_uses_running_averages():
  _, variables, _ = _apply_norm('batch', X)
  running = {'mean': jnp.full((8,), 2.0), 'var': jnp.full((8,), 4.0)}
  module = norms.MaskedBatchNorm(epsilon=0.0)
  out = module.apply({'params': variables['params'], 'batch_stats': running}, jnp.asarray(X), None, False)
  np.testing.assert_allclose(out, (X - 2.0) / 2.0, rtol=1e-5, atol=1e-5)


# ---- residual wiring ----

def _toy_sublayer(h):
  return 2.0 * h + 1.0, 'aux'


def _toy_norm(h):
  return h / 10.0 - 3.0


def _toy_dropout(h):
  return 0.5 * h


def _toy_outer_norm(h):
  return h * 4.0 + 0.25


@pytest.mark.parametrize('residual', [True, False])
def test_each_placement_matches_its_formula(residual):
  x = jnp.asarray(RNG.normal(size=(2, 3, 4)), jnp.float32)
  f = lambda h: _toy_sublayer(h)[0]
  d, n, n2 = _toy_dropout, _toy_norm, _toy_outer_norm
  skip = x if residual else 0.0
  connect = lambda name, norms, alpha=1.0: blocks.PLACEMENTS[name].connect(x, _toy_sublayer, norms, d, residual, alpha)
  post, aux = connect('post', [n])
  np.testing.assert_allclose(post, n(skip + d(f(x))), rtol=1e-6)
  pre, _ = connect('pre', [n])
  np.testing.assert_allclose(pre, skip + d(f(n(x))), rtol=1e-6)
  sandwich, _ = connect('sandwich', [n, n2])
  np.testing.assert_allclose(sandwich, skip + d(n2(f(n(x)))), rtol=1e-6)
  deep, _ = connect('deepnorm', [n], alpha=2.5)
  np.testing.assert_allclose(deep, n(2.5 * skip + d(f(x))), rtol=1e-6)
  weight = jnp.asarray(RNG.uniform(0.5, 3.0, size=4), jnp.float32)  # Admin's per-feature w
  admin, _ = connect('admin', [n], alpha=weight)
  np.testing.assert_allclose(admin, n(weight * skip + d(f(x))), rtol=1e-6)
  assert aux == 'aux'
  assert [name for name, p in blocks.PLACEMENTS.items() if p.final_norm] == ['pre', 'sandwich']
  assert blocks.PLACEMENTS['sandwich'].norms_per_sublayer == 2
