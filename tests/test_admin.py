"""Admin (Liu et al. 2020): the profiled skip weights satisfy their recursion, and the placement
is Post-LN with those weights."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from model import admin
from model.blocks import RESIDUAL_VARIANCES
from model.transformer import Transformer
from tests.test_transformer import SOURCE, TARGET_IN, init, tiny_config
from training import train_state


def _admin_model(**overrides):
  return Transformer(tiny_config(norm_position='admin', num_encoder_layers=3, num_decoder_layers=2,
                                 **overrides))


def _recorded_variances(model, params):
  source, target = (jax.random.randint(k, admin.PROFILE_SHAPE, 4, 37)
                    for k in jax.random.split(jax.random.PRNGKey(5)))
  _, recorded = model.apply({'params': params}, source, target, mutable=[RESIDUAL_VARIANCES])
  return recorded[RESIDUAL_VARIANCES]


def test_profiled_weights_satisfy_the_recursion_on_the_profiling_batch():
  model = _admin_model()
  variables = init(model)
  params = admin.profiled_params(model, variables, seed=3)
  # One more pass over the same batch with the final weights must reproduce them: w_1 = 1 and
  # w_{i+1} = sqrt(w_i^2 Var[x_{i-1}] + Var[f_i]) down each stack, in float64 here.
  source_key, target_key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(3), 1))
  source = jax.random.randint(source_key, admin.PROFILE_SHAPE, 4, 37)
  target = jax.random.randint(target_key, admin.PROFILE_SHAPE, 4, 37)
  _, recorded = model.apply({'params': params}, source, target, mutable=[RESIDUAL_VARIANCES])
  recorded = recorded[RESIDUAL_VARIANCES]
  checked = 0
  for prefix, count, sublayers in (('encoder', 3, admin.ENCODER_SUBLAYERS),
                                   ('decoder', 2, admin.DECODER_SUBLAYERS)):
    want = 1.0
    for i in range(count):
      layer = f'{prefix}_layer_{i}'
      for sublayer in sublayers:
        weight = np.asarray(params[layer][f'{sublayer}_residual_weight'])
        np.testing.assert_allclose(weight, np.full(16, want), rtol=1e-5, err_msg=f'{layer}/{sublayer}')
        variance_x, variance_f = np.asarray(recorded[layer][f'{sublayer}_variances'][0], np.float64)
        want = np.sqrt(want ** 2 * variance_x + variance_f)
        checked += 1
  assert checked == 3 * 2 + 2 * 3
  # The weights grow down each stack: each one covers all that its stack added below it.
  encoder = [float(params[f'encoder_layer_{i}'][f'{s}_residual_weight'][0])
             for i in range(3) for s in admin.ENCODER_SUBLAYERS]
  assert encoder[0] == 1.0 and all(b > a for a, b in zip(encoder, encoder[1:]))


def test_with_unit_variance_norms_the_weights_sum_the_branch_variances():
  # Below the first sublayer each x is a LayerNorm output (unit variance, zero-mean features at
  # init), so w_i^2 = Var[x_0] + sum_{j<i} Var[f_j], Liu et al.'s form.
  model = _admin_model()
  params = admin.profiled_params(model, init(model), seed=0)
  recorded = _recorded_variances(model, params)
  total = None
  for i in range(3):
    for sublayer in admin.ENCODER_SUBLAYERS:
      variance_x, variance_f = np.asarray(recorded[f'encoder_layer_{i}'][f'{sublayer}_variances'][0], np.float64)
      if total is None:
        total = variance_x  # Var[x_0], the embedded source (the profiling batch is another one)
      else:
        np.testing.assert_allclose(variance_x, 1.0, rtol=1e-3)
      weight = float(params[f'encoder_layer_{i}'][f'{sublayer}_residual_weight'][0])
      if (i, sublayer) != (0, 'self_attention'):
        assert abs(weight ** 2 / total - 1) < 0.15, (i, sublayer, weight ** 2, total)
      total += variance_f


def test_admin_with_unit_weights_is_post_ln():
  model = _admin_model()
  params = init(model)['params']
  post = Transformer(tiny_config(norm_position='post', num_encoder_layers=3, num_decoder_layers=2))
  post_params = jax.tree_util.tree_map_with_path(lambda path, x: x, params)
  post_params = {layer: {k: v for k, v in tree.items() if not k.endswith('_residual_weight')}
                 if isinstance(tree, dict) else tree for layer, tree in post_params.items()}
  assert jax.tree.structure(post_params) == jax.tree.structure(init(post)['params'])
  np.testing.assert_array_equal(model.apply({'params': params}, SOURCE, TARGET_IN),
                                post.apply({'params': post_params}, SOURCE, TARGET_IN))
  profiled = admin.profiled_params(model, {'params': params}, seed=0)
  assert not np.allclose(model.apply({'params': profiled}, SOURCE, TARGET_IN),
                         post.apply({'params': post_params}, SOURCE, TARGET_IN))


def test_train_state_starts_from_the_profiled_weights():
  model = Transformer(tiny_config(norm_position='admin'))
  state = train_state.create_train_state(model, optax.sgd(0.1), seed=4)
  variables = model.init(jax.random.PRNGKey(4), jnp.ones((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32))
  want = admin.profiled_params(model, variables, seed=4)
  weight = want['decoder_layer_1']['ffn_residual_weight']
  assert float(weight[0]) > 1.0 and bool(jnp.all(weight == weight[0]))
  for got, expected in zip(jax.tree.leaves(state.params), jax.tree.leaves(want)):
    np.testing.assert_allclose(got, expected, rtol=1e-6)
