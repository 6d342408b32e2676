"""Variance of the residual stream layer by layer at initialisation: norms and residuals on/off.

The lectures' argument: with residual connections and no normalisation, x_(l+1) = x_l + f(x_l);
if a sublayer's output has variance a Var[x_l] and is uncorrelated with its input, the variance
grows by (1 + a) per sublayer, (1 + a)^n over n. Pre-LN (x + f(N(x))) feeds every sublayer a
unit-variance input, so each adds about the same variance: linear growth. Post-LN (N(x + f(x)))
resets the stream to unit variance after every sublayer. Without residual connections the
stream is f(...(f(x))): a product of per-sublayer gains, whatever the norm.

For each placement 'post', 'pre' and 'none' (every norm replaced by the identity, so the
wiring is x + f(x)) with residual connections on and off, this script measures the variance of
the encoder and decoder streams after the embedding (layer 0) and after every layer of a
--num_layers + --num_layers model, over the real tokens of the first --num_pairs pairs of
--split (decoder teacher-forced on their targets), averaged over --num_seeds initialisations.
The model runs with train=False (no dropout). Width, norm type, initialiser and positions come
from --config; layer counts, config.model.norm_position and config.model.residual are set here.

'none' needs no model change: flax's intercept_methods makes every norm module return its input
(the configured norm's parameters exist but go unused), including the final norm of 'pre'.

  python -m scripts.activation_stats --config=configs/multi30k.py:de_en_small --out=runs/analyses/activations.json

The JSON holds `settings`, the resolved `config`, and for each placement 'post', 'pre', 'none'
and each of 'residual', 'no_residual':
  'encoder', 'decoder'     [L+1] stream variance after the embedding and after each layer (mean
                           over the seeds); '<stack>_per_seed' [num_seeds][L+1] each seed's;
  '<stack>_growth_per_layer'  (var_L / var_0)^(1/L), the fitted per-layer factor
                              ((1 + a)^2 for the encoder's two sublayers, (1 + a)^3 for the decoder's),
                              and '<stack>_growth_per_layer_std' its standard deviation over seeds.
"""

import contextlib
import functools
from pathlib import Path

from absl import app, flags
import flax.linen as nn
import jax
import jax.numpy as jnp
from matplotlib.figure import Figure
import ml_collections
import numpy as np


from analysis import experiment
from data import tokenizer as tokenizer_lib
from model import norms
from model.blocks import DecoderLayer, EncoderLayer
from model.transformer import Transformer
from training import command_line, run_log

# Placement name -> (config.model.norm_position, whether norms are applied). Without norms 'post'
# and 'pre' wire alike (x + f(x)); 'pre' is the one used.
PLACEMENTS = {'post': ('post', True), 'pre': ('pre', True), 'none': ('pre', False)}
RESIDUAL = {'residual': True, 'no_residual': False}
STACKS = ('encoder', 'decoder')
_NORM_MODULES = tuple(norms.NORMS.values())


def _skip_norms(next_fun, args, kwargs, context):
  """Method interceptor: a norm's __call__(x, mask, train) returns x; everything else runs."""
  if isinstance(context.module, _NORM_MODULES) and context.method_name == '__call__':
    return args[0]
  return next_fun(*args, **kwargs)


def _is_stream_point(module: nn.Module, method_name: str) -> bool:
  """The outputs captured: embeddings + positions (layer 0) and every layer's teacher-forced pass."""
  return method_name == '__call__' and (isinstance(module, (EncoderLayer, DecoderLayer)) or
                                        module.name in ('encoder_positions', 'decoder_positions'))


def _masked_variance(x, token_mask):
  """Variance over all features of the real tokens: x [B, L, D], token_mask [B, L]."""
  weights = token_mask.astype(jnp.float32)[..., None]  # [B, L, 1]
  count = weights.sum() * x.shape[-1]
  mean = (x * weights).sum() / count
  return (jnp.square(x - mean) * weights).sum() / count


@functools.partial(jax.jit, static_argnames=('model', 'apply_norms'))
def stream_variances(model: Transformer, variables: dict, batch: dict, apply_norms: bool) -> dict:
  """{'encoder': [L+1], 'decoder': [L+1]} stream variances of the model at `variables`."""
  with contextlib.nullcontext() if apply_norms else nn.intercept_methods(_skip_norms):
    _, state = model.apply(variables, batch['encoder_input_tokens'], batch['decoder_input_tokens'],
                           train=False, capture_intermediates=_is_stream_point, mutable=['intermediates'])
  captured = state['intermediates']
  num_layers = {'encoder': model.config.num_encoder_layers, 'decoder': model.config.num_decoder_layers}
  variances = {}
  for stack in STACKS:
    token_mask = batch[f'{stack}_input_tokens'] != tokenizer_lib.PAD_ID  # [B, L]
    points = [f'{stack}_positions'] + [f'{stack}_layer_{i}' for i in range(num_layers[stack])]
    variances[stack] = jnp.stack([_masked_variance(captured[point]['__call__'][0], token_mask)
                                  for point in points])  # [L+1]
  return variances


def measure(config: ml_collections.ConfigDict, vocab_size: int, batch: dict, *, num_layers: int,
            seeds: list[int]) -> dict:
  """Seed-averaged stream variances of every placement x residual variant (module docstring)."""
  results = {}
  for placement, (norm_position, apply_norms) in PLACEMENTS.items():
    results[placement] = {}
    for residual_name, residual in RESIDUAL.items():
      model = Transformer.of(experiment.with_model(
          config, norm_position=norm_position, residual=residual, num_encoder_layers=num_layers,
          num_decoder_layers=num_layers).model, vocab_size)
      per_seed = [
          jax.device_get(stream_variances(model, experiment.init_variables(model, seed), batch,
                                          apply_norms))
          for seed in seeds]
      variant = {}
      for stack in STACKS:
        seeds_variances = np.array([v[stack] for v in per_seed], np.float64)  # [seeds, L+1]
        variances = seeds_variances.mean(0)
        variant[stack] = variances.tolist()
        variant[f'{stack}_per_seed'] = seeds_variances.tolist()
        variant[f'{stack}_growth_per_layer'] = float((variances[-1] / variances[0]) ** (1 / num_layers))
        growths = (seeds_variances[:, -1] / seeds_variances[:, 0]) ** (1 / num_layers)
        variant[f'{stack}_growth_per_layer_std'] = float(growths.std(ddof=1)) if len(seeds) > 1 else 0.0
      results[placement][residual_name] = variant
  return results


def plot(results: dict) -> Figure:
  """Stream variance per layer, log scale: one panel per stack, one line per variant (the seeds'
  mean), shaded over the seeds' range."""
  figure = Figure(figsize=(11, 4))
  colors = {'post': 'tab:red', 'pre': 'tab:blue', 'none': 'tab:green'}
  for axes, stack in zip(figure.subplots(1, 2), STACKS):
    for placement in PLACEMENTS:
      for residual_name, style in (('residual', '-'), ('no_residual', ':')):
        variances = results[placement][residual_name][stack]
        per_seed = np.array(results[placement][residual_name][f'{stack}_per_seed'])  # [seeds, L+1]
        axes.plot(range(len(variances)), variances, style, marker='o', color=colors[placement],
                  label=f'norm {placement}, {residual_name.replace("_", " ")}')
        axes.fill_between(range(len(variances)), per_seed.min(0), per_seed.max(0),
                          color=colors[placement], alpha=0.2)
    axes.set(title=f'{stack} residual stream variance at initialisation', xlabel='layer (0: embeddings)',
             ylabel='variance', yscale='log')
    axes.legend(fontsize='small')
  return figure


def run(config: ml_collections.ConfigDict, out: Path, vocab_size: int, batch: dict, *, num_layers: int,
        seeds: list[int], split: str) -> dict:
  """Measures on `batch` (pairs of `split`), writes `out` and its PNG; returns the results."""
  results = {
      'settings': {'num_layers': num_layers, 'seeds': seeds, 'split': split,
                   'num_pairs': len(batch['encoder_input_tokens']), 'dropout': 'off (train=False)'},
      'config': experiment.resolved(config),
      **measure(config, vocab_size, batch, num_layers=num_layers, seeds=seeds),
  }
  experiment.write(out, results, plot(results))
  return results


def define_flags() -> None:
  experiment.define_flags()
  flags.DEFINE_integer('num_layers', 12, 'Encoder and decoder layers: enough to tell linear from '
                       'exponential growth.', lower_bound=1)
  flags.DEFINE_integer('num_seeds', 3, 'Initialisations averaged over (seeds 0..n-1).', lower_bound=1)
  flags.DEFINE_integer('num_pairs', 64, 'Sentence pairs whose tokens the variance is taken over.',
                       lower_bound=1)
  flags.DEFINE_string('split', 'validation', 'Split the pairs come from (its first num_pairs pairs).')


def main(argv) -> None:
  del argv
  # What the script prints is its output; library INFO records go only where --verbosity asks.
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  config, out = experiment.config_and_out()
  num_pairs = flags.FLAGS.num_pairs
  vocab_size, (batch,) = experiment.load_batches_or_exit(config.data, flags.FLAGS.split, num_pairs,
                                                         batch_size=num_pairs)
  run(config, out, vocab_size, batch, num_layers=flags.FLAGS.num_layers,
      seeds=list(range(flags.FLAGS.num_seeds)), split=flags.FLAGS.split)
  print(f'wrote {out} and {out.with_suffix(".png")}')


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=command_line.parse_flags)
