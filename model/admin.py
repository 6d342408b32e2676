"""Admin's profiled initialisation of the skip weights (Liu et al. 2020, "Understanding the
Difficulty of Training Transformers", section 4.3; the 'admin' placement of model/blocks.py).

Each sublayer i of a stack computes x_i = N(w_i * x_{i-1} + f_i(x_{i-1})). Admin starts w_1 at 1
and each later weight at the standard deviation the previous sum had at initialisation:

  w_{i+1}^2 = Var[w_i * x_{i-1}] + Var[f_i(x_{i-1})] = w_i^2 Var[x_{i-1}] + Var[f_i(x_{i-1})],

which, with unit-variance norm outputs, is w_i^2 = Var[x_0] + sum_{j<i} Var[f_j(x_{j-1})]: the
skip term keeps up with everything the branch has added below it, so no single sublayer's output
dominates the sum early in training (the amplification Liu et al. blame for Post-LN's failures),
while the model stays a Post-LN one. The recursion runs over the encoder's sublayers (self-
attention, FFN per layer), and separately over the decoder's (self-attention, cross-attention,
FFN), the way the authors' fairseq code profiles them. Variances are over all elements of a
batch; the weights then train as ordinary parameters.

The profile is a forward pass over a batch of random tokens drawn from the run's seed (the
authors profile their first training batch): at initialisation these variances depend on the
weights and the shapes, hardly on which tokens are fed, and so the weights are a function of the
config and seed alone, computed where the other parameters are. Profiled on three Multi30k
validation batches instead (16 pairs padded to 32 tokens), the weights of a d_model 64, 12+12
and a d_model 128, 4+4 model came within 0.97-1.05x of the random-token ones (2026-11-25). Each pass fixes one more
weight of the chain, so after (2 N + 3 M) passes every weight of an N + M layer model equals
the recursion above; the passes are one `lax.fori_loop`.

Dimensions: B batch, L length, D model width.
"""

import jax
import jax.numpy as jnp

from model.blocks import PLACEMENTS, RESIDUAL_VARIANCES
from model.special_tokens import UNK_ID
from model.transformer import Transformer

# Sublayers of an encoder and of a decoder layer, in the order the stream passes them.
ENCODER_SUBLAYERS = ('self_attention', 'ffn')
DECODER_SUBLAYERS = ('self_attention', 'cross_attention', 'ffn')

# Shape of the random profiling batch, source and target alike: [B, L].
PROFILE_SHAPE = (16, 32)


def _stacks(model: Transformer):
  cfg = model.config
  return ([(f'encoder_layer_{i}', ENCODER_SUBLAYERS) for i in range(cfg.num_encoder_layers)],
          [(f'decoder_layer_{i}', DECODER_SUBLAYERS) for i in range(cfg.num_decoder_layers)])


def weights_from_variances(model: Transformer, params, variances):
  """`params` with every skip weight set by the recursion from the recorded variances.

  Args:
    model: the Transformer (its config names the layers).
    params: parameters with an `<sublayer>_residual_weight` [D] in every layer.
    variances: the `RESIDUAL_VARIANCES` collection of one pass: per layer and sublayer a
      one-tuple of float32 [2] named `<sublayer>_variances`, (Var[x], Var[f(x)]).
  """
  params = dict(params)
  for stack in _stacks(model):
    weight = jnp.ones((), jnp.float32)  # w_1
    for layer, sublayers in stack:
      layer_params = dict(params[layer])
      for sublayer in sublayers:
        (recorded,) = variances[layer][f'{sublayer}_variances']
        variance_x, variance_f = recorded[0], recorded[1]
        layer_params[f'{sublayer}_residual_weight'] = jnp.full((model.config.d_model,), weight)
        weight = jnp.sqrt(weight ** 2 * variance_x + variance_f)
      params[layer] = layer_params
  return params


def profiled_params(model: Transformer, variables: dict, seed: int):
  """variables['params'] with Admin's skip weights (a no-op for every other placement).

  Args:
    model: the Transformer.
    variables: freshly initialised variables ('params' and, for BatchNorm, 'batch_stats').
    seed: the run's seed; the random profiling batch is drawn from it.
  """
  cfg = model.config
  if not PLACEMENTS[cfg.norm_position].trained_residual_weight:
    return variables['params']
  source_key, target_key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), 1))
  # Ordinary tokens only: no padding, so every element of the batch counts in the variances.
  source = jax.random.randint(source_key, PROFILE_SHAPE, UNK_ID + 1, cfg.source_vocab_size)  # [B, L]
  target = jax.random.randint(target_key, PROFILE_SHAPE, UNK_ID + 1, cfg.target_vocab_size)  # [B, L]

  # model.init records a profile too (every collection is mutable there): leave it out.
  variables = {name: tree for name, tree in variables.items() if name != RESIDUAL_VARIANCES}

  def one_pass(_, params):
    _, recorded = model.apply({**variables, 'params': params}, source, target,
                              mutable=[RESIDUAL_VARIANCES])
    return weights_from_variances(model, params, recorded[RESIDUAL_VARIANCES])

  passes = len(ENCODER_SUBLAYERS) * cfg.num_encoder_layers + len(DECODER_SUBLAYERS) * cfg.num_decoder_layers
  return jax.lax.fori_loop(0, passes, one_pass, variables['params'])
