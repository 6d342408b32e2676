"""Every combination of norm x placement x position x activation initialises and trains: a finite
positive loss and finite, non-zero gradients, on a 1+1-layer model."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import losses
from model.transformer import Transformer
from test_transformer import SOURCE, TARGET_IN, TARGET_OUT, init, tiny_config

MATRIX = list(itertools.product(['layer', 'rms', 'batch', 'scale'], ['post', 'pre'],
                                ['sinusoidal', 'learned', 'rope', 'none'], ['relu', 'gelu', 'swiglu']))
# The later placements and ALiBi with every norm, and ALiBi with the first two placements, not
# the whole product again (the suite's time).
MATRIX += list(itertools.product(['layer', 'rms', 'batch', 'scale'], ['sandwich', 'deepnorm'],
                                 ['sinusoidal', 'alibi'], ['relu']))
MATRIX += list(itertools.product(['layer'], ['post', 'pre'], ['alibi'], ['relu', 'swiglu']))


@pytest.mark.parametrize('norm,norm_position,position,activation', MATRIX)
def test_component_matrix_trains(norm, norm_position, position, activation):
  model = Transformer(tiny_config(norm=norm, norm_position=norm_position, position=position,
                                  activation=activation, num_encoder_layers=1, num_decoder_layers=1))
  variables = init(model, train=True)
  params, state = variables['params'], {k: v for k, v in variables.items() if k != 'params'}

  def loss_fn(params):
    logits, _ = model.apply({'params': params, **state}, SOURCE, TARGET_IN, train=True,
                            rngs={'dropout': jax.random.PRNGKey(3)}, mutable=list(state))
    sums = losses.weighted_sums(logits, TARGET_OUT, TARGET_OUT != 0, 0.1)
    return sums['loss'] / sums['tokens']

  loss, grads = jax.value_and_grad(loss_fn)(params)
  assert np.isfinite(loss) and loss > 0
  grad_leaves = jax.tree.leaves(grads)
  assert all(np.isfinite(g).all() for g in grad_leaves)
  assert sum(float(jnp.abs(g).sum()) for g in grad_leaves) > 0
