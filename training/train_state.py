"""The train state, and the functions that step and evaluate it (jitted by the trainer).

Dimensions: B pairs, S source length, T target length.
"""

from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

from model import admin, losses
from model.transformer import Transformer
from training import partitioning


@flax.struct.dataclass
class TrainState:
  step: jnp.ndarray
  params: Any
  opt_state: Any
  # BatchNorm running averages; an empty dict for every other norm.
  batch_stats: Any


def model_variables(params, batch_stats) -> dict:
  return {'params': params, **({'batch_stats': batch_stats} if batch_stats else {})}


def create_train_state(model: Transformer, tx: optax.GradientTransformation, seed: int,
                       mesh: jax.sharding.Mesh | None = None) -> TrainState:
  """Initialises parameters from `seed`; with a `mesh`, under `jax.jit`, replicated over it.

  With a mesh the state is created where it lives: each device computes its own copy, and no host
  copy is made and then transferred. Without one it is computed eagerly, which for a deep model
  is faster than compiling the init (analyses); both give bitwise the same values (the PRNG is
  counter-based). Shapes do not depend on the dummy inputs' lengths.
  """
  def init() -> TrainState:
    dummy = jnp.ones((1, 8), jnp.int32)
    variables = model.init(jax.random.PRNGKey(seed), dummy, dummy, train=False)
    params = admin.profiled_params(model, variables, seed)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      batch_stats=variables.get('batch_stats', {}))

  if mesh is None:
    return init()
  shardings = jax.tree.map(lambda _: partitioning.replicated(mesh), jax.eval_shape(init))
  return jax.jit(init, out_shardings=shardings)()


# What a batch of packed rows adds to the tokens (data.pack_length; model/transformer.py).
PACKING_FEATURES = ('encoder_segment_ids', 'decoder_segment_ids', 'encoder_positions',
                    'decoder_positions')


def packing_features(batch: dict) -> dict:
  """The packed-row features of `batch`, as keyword arguments of the model; none for unpacked rows."""
  return {name: batch[name] for name in PACKING_FEATURES if name in batch}


# On a CPU a step's activations outgrow the last-level cache and stream from memory; computed in
# slices of about this many padded tokens they stay in it, and the tiny and small Multi30k recipes
# train 1.07-1.35x faster per step on the two CPU models measured (docs/performance.md; 512 was
# at or near the best size on both in float32). bfloat16 activations take half the bytes, so twice
# the tokens fit: 1,024 is 1.01-1.07x 512 there. Accelerators want the whole batch at once.
CPU_MICROBATCH_TOKENS = {'float32': 512, 'bfloat16': 1024}


def microbatch_tokens(config: ml_collections.ConfigDict) -> int:
  """config.train.microbatch_tokens, with None resolved: CPU_MICROBATCH_TOKENS of the compute
  dtype on a CPU, else 0.

  BatchNorm normalises over the whole batch, so it is never sliced (check_config refuses an
  explicit size with it).
  """
  if config.train.microbatch_tokens is not None:
    return config.train.microbatch_tokens
  if jax.default_backend() != 'cpu' or config.model.norm == 'batch':
    return 0
  return CPU_MICROBATCH_TOKENS[config.model.dtype]


def microbatch_count(rows: int, length: int, tokens: int) -> int:
  """Slices of whole rows a [rows, length] batch is computed in: enough that each holds about
  `tokens` padded tokens (ceil(rows * length / tokens), at most one per row); 1 for tokens=0."""
  if not tokens:
    return 1
  return min(rows, -(-rows * length // tokens))


def split_rows(batch: dict, count: int) -> dict:
  """Each [B, ...] feature as [count, ceil(B / count), ...]; slice i holds rows i, i + count, ...

  Rows added to make B a multiple of `count` are all padding (token 0, weight 0, segment 0), as
  the empty rows of a bucket's last batch are. Strided rather than contiguous slices, so that
  with the batch sharded over devices every slice is spread over all of them.
  """
  rows = jax.tree.leaves(batch)[0].shape[0]
  padded = -(-rows // count) * count

  def split(feature):
    feature = jnp.pad(feature, [(0, padded - rows)] + [(0, 0)] * (feature.ndim - 1))
    return feature.reshape(padded // count, count, *feature.shape[1:]).swapaxes(0, 1)

  return jax.tree.map(split, batch)


def train_step(state: TrainState, batch: dict, *, model: Transformer, tx: optax.GradientTransformation,
               label_smoothing: float, dropout_key: jax.Array,
               microbatch_tokens: int = 0, loss_chunk_tokens: int = 0) -> tuple[TrainState, dict]:
  """One optimizer step on a (global) batch; the loss is the mean over its real target tokens.

  With `microbatch_tokens`, the forward and backward passes run over slices of the batch's rows
  (microbatch_count, split_rows) in a loop, and the step adds their loss sums and gradients
  before dividing by the batch's real target tokens: the same gradient as the whole batch's, up
  to float rounding, with each slice's own dropout masks. Not with BatchNorm, which normalises
  over the whole batch.

  With `loss_chunk_tokens`, the loss's normaliser is computed that many tokens at a time
  (losses.chunked_output_layer_sums) and the whole [B, T, V] logits are never formed.

  Dropout uses fold_in(dropout_key, step) (and the slice's index), so it does not depend on how
  many hosts or devices share the batch.
  """
  step_key = jax.random.fold_in(dropout_key, state.step)

  def sums_fn(params, rows: dict, key: jax.Array):
    (logits, hidden, table), updates = model.apply(
        model_variables(params, state.batch_stats), rows['encoder_input_tokens'],
        rows['decoder_input_tokens'], train=True, rngs={'dropout': key}, mutable=['batch_stats'],
        with_output_layer_input=True, **packing_features(rows))
    targets, weights = rows['decoder_target_tokens'], rows['decoder_target_weights']
    if loss_chunk_tokens:
      # The model's logits go unused here, and XLA drops their computation from the step.
      sums = losses.chunked_output_layer_sums(hidden, table, targets, weights, label_smoothing,
                                              chunk_tokens=loss_chunk_tokens)
    else:
      sums = losses.output_layer_sums(logits, hidden, table, targets, weights, label_smoothing)
    return sums, updates

  rows, length = batch['decoder_input_tokens'].shape
  count = microbatch_count(rows, max(length, batch['encoder_input_tokens'].shape[1]),
                           microbatch_tokens)
  if count == 1:
    def loss_fn(params):
      sums, updates = sums_fn(params, batch, step_key)
      return sums['loss'] / jnp.maximum(sums['tokens'], 1.0), (sums, updates)

    (loss, (sums, updates)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    batch_stats = updates.get('batch_stats', state.batch_stats)
  else:
    if state.batch_stats:
      raise ValueError('train_step: microbatch_tokens with BatchNorm would normalise each slice '
                       'apart; BatchNorm needs the whole batch (microbatch_tokens=0)')

    def slice_loss_sum(params, rows_slice: dict, key: jax.Array):
      sums, _ = sums_fn(params, rows_slice, key)
      return sums['loss'], sums

    def add_slice(carry, slice_and_index):
      rows_slice, index = slice_and_index
      (_, sums), grads = jax.value_and_grad(slice_loss_sum, has_aux=True)(
          state.params, rows_slice, jax.random.fold_in(step_key, index))
      return jax.tree.map(jnp.add, carry, (sums, grads)), None

    # Zero sums of output_layer_sums' structure (scalars), and zero gradients.
    zeros = jax.tree.map(jnp.zeros_like, (
        losses.output_layer_sums(jnp.zeros((1, 1, 1)), jnp.zeros((1, 1, 1)), jnp.zeros((1, 1)),
                                 jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1))),
        state.params))
    (sums, grad_sums), _ = jax.lax.scan(add_slice, zeros,
                                        (split_rows(batch, count), jnp.arange(count)))
    tokens = jnp.maximum(sums['tokens'], 1.0)
    loss, grads = sums['loss'] / tokens, jax.tree.map(lambda g: g / tokens, grad_sums)
    batch_stats = state.batch_stats
  param_updates, opt_state = tx.update(grads, state.opt_state, state.params)
  new_state = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, param_updates),
                            opt_state=opt_state, batch_stats=batch_stats)
  metrics = {'train_loss': loss, 'train_nll': sums['nll'] / jnp.maximum(sums['tokens'], 1.0),
             'grad_norm': optax.tree.norm(grads), 'target_tokens': sums['tokens']}
  return new_state, metrics


def empty_metrics_window() -> dict:
  """Device-side sums of the training metrics since the last logged record (see accumulate_metrics)."""
  zero = jnp.zeros((), jnp.float32)
  return {'steps': jnp.zeros((), jnp.int32), 'train_loss': zero, 'train_nll': zero,
          'target_tokens': zero, 'grad_norm': zero,
          # The first step whose loss or gradient norm was not finite (0: none yet), and its values.
          'nonfinite_step': jnp.zeros((), jnp.int32), 'nonfinite_loss': zero,
          'nonfinite_grad_norm': zero}


def metrics_window_to_json(host_window: dict) -> dict:
  """A window fetched to the host, as plain numbers for a checkpoint's JSON (float32 survives exactly)."""
  return {name: value.item() for name, value in host_window.items()}


def metrics_window_from_json(sums: dict) -> dict:
  """metrics_window_to_json's numbers back as a window of empty_metrics_window's dtypes."""
  return jax.tree.map(lambda empty, value: jnp.asarray(value, empty.dtype), empty_metrics_window(), sums)


def accumulate_metrics(window: dict, metrics: dict, step: jnp.ndarray) -> dict:
  """Adds one step's metrics (train_step's, after `step`) to `window`, on device.

  The host fetches the window only every log_every steps (and before evaluating or saving), so
  the training loop never waits for a step to finish in between.
  """
  first_bad = (window['nonfinite_step'] == 0) & ~(
      jnp.isfinite(metrics['train_loss']) & jnp.isfinite(metrics['grad_norm']))
  return {'steps': window['steps'] + 1,
          'train_loss': window['train_loss'] + metrics['train_loss'],
          'train_nll': window['train_nll'] + metrics['train_nll'],
          'target_tokens': window['target_tokens'] + metrics['target_tokens'],
          'grad_norm': metrics['grad_norm'],
          'nonfinite_step': jnp.where(first_bad, step, window['nonfinite_step']),
          'nonfinite_loss': jnp.where(first_bad, metrics['train_loss'], window['nonfinite_loss']),
          'nonfinite_grad_norm': jnp.where(first_bad, metrics['grad_norm'],
                                           window['nonfinite_grad_norm'])}


def eval_step(state: TrainState, batch: dict, *, model: Transformer) -> dict:
  """Sums of the unsmoothed loss over the batch's real target tokens."""
  logits = model.apply(model_variables(state.params, state.batch_stats), batch['encoder_input_tokens'],
                       batch['decoder_input_tokens'], train=False)
  return losses.weighted_sums(logits, batch['decoder_target_tokens'], batch['decoder_target_weights'])
