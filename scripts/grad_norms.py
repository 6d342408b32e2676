"""Gradient norms at initialisation, layer by layer, Post-LN vs Pre-LN (Xiong et al. 2020, Figure 3).

Xiong et al. show that at initialisation the gradient of the last layer's FFN W2 is
O(d sqrt(ln d)) for Post-LN whatever the depth L but O(d sqrt(ln d / L)) for Pre-LN, and observe
that Post-LN gradients grow with the layer index (large near the output, the reason it needs a
learning-rate warmup) while Pre-LN ones are flat. This script measures, for both placements:
  - per layer of a --num_layers + --num_layers model (6+6), the Frobenius norm of the gradient
    of every FFN kernel (W1, W2) and attention projection kernel (query, key, value, out; self-
    and cross-attention), averaged over --num_seeds initialisations (seeds 0..n-1);
  - the last decoder layer's W2 gradient norm, averaged the same way, for each of --depths
    (encoder and decoder layers alike, 6+6 up to 14+14).

The loss is train.py's training loss (cross entropy with config.train.label_smoothing, mean over
real target tokens) on one batch: the first --num_pairs pairs of --split, real data as in
Xiong et al. It is evaluated with train=False, without dropout: the gradient is then a
function of the initialisation and the data alone. Every seed sees the same batch. Width,
norm, initialiser and positions come from --config; the layer counts and
config.model.norm_position are set here.

  python -m scripts.grad_norms --config=configs/multi30k.py:de_en_small --out=runs/analyses/grad_norms.json

Cost: one compilation per placement and depth, and a gradient per seed, placement and depth.

The JSON holds `settings`, the resolved `config`, and for 'post' and 'pre':
  '<stack>_<matrix>'           [L] mean gradient norm per layer, in layer order, for stack
                               'encoder' or 'decoder' and matrix 'ffn_w1', 'ffn_w2',
                               'self_attention_{query,key,value,out}' (and for the decoder
                               'cross_attention_{query,key,value,out}');
  '<stack>_<matrix>_per_seed'  [num_seeds][L] the same per seed;
  'depth_sweep'                {str(layers): mean last-decoder-layer W2 gradient norm};
  'depth_sweep_per_seed'       {str(layers): [num_seeds] per seed}.
"""

import functools
from pathlib import Path

from absl import app, flags
import jax
import jax.numpy as jnp
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
import ml_collections
import numpy as np


from analysis import experiment
from model.transformer import Transformer
from training import command_line, run_log

PLACEMENTS = ('post', 'pre')
_PROJECTIONS = ('query', 'key', 'value', 'out')


def _layer_matrices(attentions: tuple[str, ...]) -> dict[str, tuple[str, str]]:
  """JSON name -> (submodule, dense) of the kernels measured in one layer."""
  return {'ffn_w1': ('ffn', 'w1'), 'ffn_w2': ('ffn', 'w2'),
          **{f'{attention}_{projection}': (attention, projection)
             for attention in attentions for projection in _PROJECTIONS}}


MATRICES = {'encoder': _layer_matrices(('self_attention',)),
            'decoder': _layer_matrices(('self_attention', 'cross_attention'))}


@functools.partial(jax.jit, static_argnames=('model', 'label_smoothing'))
def kernel_gradient_norms(model: Transformer, variables: dict, batch: dict,
                          label_smoothing: float) -> dict:
  """{'<stack>_<matrix>': [L] gradient Frobenius norm per layer} at `variables`."""

  def mean_loss(params):
    sums = experiment.loss_sums(model, {**variables, 'params': params}, batch, label_smoothing)
    return sums['loss'] / jnp.maximum(sums['tokens'], 1.0)

  grads = jax.grad(mean_loss)(variables['params'])
  num_layers = {'encoder': model.config.num_encoder_layers, 'decoder': model.config.num_decoder_layers}
  return {f'{stack}_{name}': jnp.stack([jnp.linalg.norm(grads[f'{stack}_layer_{i}'][sub][dense]['kernel'])
                                        for i in range(num_layers[stack])])  # [L]
          for stack, matrices in MATRICES.items() for name, (sub, dense) in matrices.items()}


def measure(config: ml_collections.ConfigDict, vocab_size: int, batch: dict, *, num_layers: int,
            seeds: list[int], depths: list[int]) -> dict:
  """Per-layer norms at `num_layers` and the depth sweep, for Post-LN and Pre-LN (module docstring)."""
  results = {}
  for placement in PLACEMENTS:
    per_depth = {}  # layers -> [seeds] of {'<stack>_<matrix>': [L] norms}
    for depth in sorted({num_layers, *depths}):
      model = Transformer.of(experiment.with_model(
          config, norm_position=placement, num_encoder_layers=depth, num_decoder_layers=depth).model, vocab_size)
      per_depth[depth] = [
          jax.device_get(kernel_gradient_norms(model, experiment.init_variables(model, seed), batch,
                                               config.train.label_smoothing))
          for seed in seeds]
    placement_results = {}
    for name in per_depth[num_layers][0]:
      per_seed = np.array([norms[name] for norms in per_depth[num_layers]])  # [seeds, L]
      placement_results[name] = per_seed.mean(0).tolist()
      placement_results[f'{name}_per_seed'] = per_seed.tolist()
    last_w2 = {depth: [float(norms['decoder_ffn_w2'][-1]) for norms in per_depth[depth]] for depth in depths}
    placement_results['depth_sweep'] = {str(depth): float(np.mean(v)) for depth, v in last_w2.items()}
    placement_results['depth_sweep_per_seed'] = {str(depth): v for depth, v in last_w2.items()}
    results[placement] = placement_results
  return results


def plot(results: dict) -> Figure:
  """W1 and W2 per layer (encoder solid, decoder dashed), and the depth sweep; log scale. Lines are
  the seeds' mean, shaded bands their range (min to max)."""
  figure = Figure(figsize=(15, 4))
  w1_axes, w2_axes, depth_axes = figure.subplots(1, 3)
  colors = {'post': 'tab:red', 'pre': 'tab:blue'}
  for placement in PLACEMENTS:
    for axes, matrix in ((w1_axes, 'ffn_w1'), (w2_axes, 'ffn_w2')):
      for stack, style in (('encoder', '-'), ('decoder', '--')):
        norms = results[placement][f'{stack}_{matrix}']
        per_seed = np.array(results[placement][f'{stack}_{matrix}_per_seed'])  # [seeds, L]
        layers = range(1, len(norms) + 1)
        axes.plot(layers, norms, style, marker='o', color=colors[placement],
                  label=f'{placement}-LN {stack}')
        axes.fill_between(layers, per_seed.min(0), per_seed.max(0), color=colors[placement],
                          alpha=0.2)
    sweep = results[placement]['depth_sweep']
    depths = [int(d) for d in sweep]
    per_seed = np.array(list(results[placement]['depth_sweep_per_seed'].values()))  # [depths, seeds]
    depth_axes.plot(depths, list(sweep.values()), marker='o', color=colors[placement],
                    label=f'{placement}-LN')
    depth_axes.fill_between(depths, per_seed.min(1), per_seed.max(1), color=colors[placement],
                            alpha=0.2)
  for axes, title in ((w1_axes, 'FFN W1 gradient norm'), (w2_axes, 'FFN W2 gradient norm')):
    axes.set(title=title, xlabel='layer', yscale='log')
  depth_axes.set(title='last decoder layer W2 gradient norm', xlabel='layers (encoder = decoder)',
                 yscale='log')
  for axes in (w1_axes, w2_axes, depth_axes):
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.legend()
  return figure


def run(config: ml_collections.ConfigDict, out: Path, vocab_size: int, batch: dict, *, num_layers: int,
        seeds: list[int], depths: list[int], split: str) -> dict:
  """Measures on `batch` (pairs of `split`), writes `out` and its PNG; returns the results."""
  results = {
      'settings': {'num_layers': num_layers, 'seeds': seeds, 'depths': depths, 'split': split,
                   'num_pairs': len(batch['encoder_input_tokens']),
                   'target_tokens': float(batch['decoder_target_weights'].sum()),
                   'dropout': 'off (train=False)'},
      'config': experiment.resolved(config),
      **measure(config, vocab_size, batch, num_layers=num_layers, seeds=seeds, depths=depths),
  }
  experiment.write(out, results, plot(results))
  return results


def define_flags() -> None:
  experiment.define_flags()
  flags.DEFINE_integer('num_layers', 6, 'Encoder and decoder layers of the per-layer measurement.',
                       lower_bound=1)
  flags.DEFINE_integer('num_seeds', 10, 'Initialisations averaged over (seeds 0..n-1).', lower_bound=1)
  flags.DEFINE_list('depths', ['6', '8', '10', '12', '14'], 'Layer counts of the depth sweep.')
  flags.DEFINE_integer('num_pairs', 64, 'Sentence pairs in the batch the gradient is taken on.',
                       lower_bound=1)
  flags.DEFINE_string('split', 'train', 'Split the pairs come from (its first num_pairs pairs).')


def main(argv) -> None:
  del argv
  # What the script prints is its output; library INFO records go only where --verbosity asks.
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  config, out = experiment.config_and_out()
  depths = experiment.int_list('depths', flags.FLAGS.depths)
  num_pairs = flags.FLAGS.num_pairs
  vocab_size, (batch,) = experiment.load_batches_or_exit(config.data, flags.FLAGS.split, num_pairs,
                                                         batch_size=num_pairs)
  run(config, out, vocab_size, batch, num_layers=flags.FLAGS.num_layers,
      seeds=list(range(flags.FLAGS.num_seeds)), depths=depths, split=flags.FLAGS.split)
  print(f'wrote {out} and {out.with_suffix(".png")}')


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=command_line.parse_flags)
