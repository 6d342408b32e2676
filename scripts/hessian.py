"""Hessian spectrum of the training loss at initialisation, Post-LN vs Pre-LN.

Zhang & Mackey (2022, on Xiong et al. 2020) compare the loss curvature of the two placements at
initialisation: 6+6 layers, Xavier initialisation, De->En on 1000 Multi30k validation pairs,
spectrum by Lanczos. Their finding: Post-LN's loss surface has more curvature, which is
Xiong et al.'s argument for why it needs a learning-rate warmup, seen through second order.

The loss is train.py's training loss (cross entropy with config.train.label_smoothing, mean over
the real target tokens of all --num_pairs pairs) with train=False, without dropout: a fixed
function of the parameters, so its Hessian is well defined. The Hessian is never formed: a
Hessian-vector product H v is the directional derivative of grad L along v (forward-over-reverse,
jax.jvp of jax.grad, ~15% faster and lighter than the gradient of <grad L, v>), summed over
batches of --batch_size pairs. analysis/lanczos.py runs
--lanczos_iterations steps from each of --num_probes random vectors (the same ones for both
placements) for the largest eigenvalues and the stochastic Lanczos quadrature density. Width,
norm, initialiser (config.model.kernel_init, Xavier by default) and positions come from
--config; the layer counts and config.model.norm_position are set here; each of --seeds gives its
own initialisation and probes, so the spread over seeds is that of both.

  python -m scripts.hessian --config=configs/multi30k.py:de_en_small --out=runs/analyses/hessian.json

Cost: --lanczos_iterations x --num_probes products per placement, each over all pairs and worth
about three gradients. On 2 idle CPU cores a product took about 25 s over 250 pairs and 58-100 s
over 1000, so the defaults (1000 pairs, 40 steps, 80 products) take 1.5-2.2 hours;
--num_pairs=250 --batch_size=125 --lanczos_iterations=20 took 17 minutes (docs/results.md,
section 6).

The JSON holds `settings`, the resolved `config`, and for 'post' and 'pre': 'top_eigenvalues'
and 'top_eigenvalues_std' (mean and standard deviation over seeds), 'loss' (mean), and
'per_seed', one entry per seed with:
  'loss'                 the training loss at initialisation;
  'num_parameters'       P, the Hessian's size;
  'top_eigenvalues'      [--num_top] largest eigenvalue estimates, descending;
  'ritz_values'          [num_probes][M] Ritz values of each probe, ascending;
  'ritz_weights'         [num_probes][M] their quadrature weights (each row sums to 1);
  'density_grid'         [G] eigenvalue grid;
  'density'              [G] the Gaussian-broadened density on it (integrates to 1);
  'sigma'                the Gaussian width.
"""

import functools
import itertools
from pathlib import Path

from absl import app, flags, logging
import jax
from matplotlib.figure import Figure
import ml_collections
import numpy as np


from analysis import experiment, lanczos
from model.transformer import Transformer
from training import command_line, run_log

PLACEMENTS = ('post', 'pre')
# Floor of the plotted density: the log scale shows the outliers Ghorbani et al. look for.
_DENSITY_FLOOR = 1e-8


@functools.partial(jax.jit, static_argnames=('model', 'label_smoothing'))
def batch_hvp(model: Transformer, variables: dict, batch: dict, tangent, label_smoothing: float,
              total_tokens):
  """H_b v, with H_b the Hessian of this batch's share of the loss (its loss sum / total_tokens)."""

  def loss_share(params):
    sums = experiment.loss_sums(model, {**variables, 'params': params}, batch, label_smoothing)
    return sums['loss'] / total_tokens

  return jax.jvp(jax.grad(loss_share), (variables['params'],), (tangent,))[1]


@functools.partial(jax.jit, static_argnames=('model', 'label_smoothing'))
def _batch_loss_sums(model: Transformer, variables: dict, batch: dict, label_smoothing: float):
  """experiment.loss_sums, compiled."""
  return experiment.loss_sums(model, variables, batch, label_smoothing)


def spectrum(model: Transformer, variables: dict, batches: list[dict], label_smoothing: float, *,
             num_iterations: int, num_probes: int, num_top: int, probe_seed: int) -> dict:
  """The loss, top eigenvalues and SLQ density of the loss over `batches` (module docstring)."""
  sums = [jax.device_get(_batch_loss_sums(model, variables, batch, label_smoothing)) for batch in batches]
  total_tokens = float(sum(s['tokens'] for s in sums))

  product_count = itertools.count(1)

  def hvp(tangent):
    # A full-size run takes hours on a CPU: the log's timestamps show the pace.
    logging.info('Hessian-vector product %d of %d', next(product_count), num_iterations * num_probes)
    products = [batch_hvp(model, variables, batch, tangent, label_smoothing, total_tokens)
                for batch in batches]
    return jax.tree.map(lambda *terms: sum(terms), *products)

  matvec, num_parameters = lanczos.flatten_operator(hvp, variables['params'])
  tridiagonals = lanczos.stochastic_lanczos_quadrature(matvec, num_parameters, num_iterations,
                                                       num_probes, seed=probe_seed)
  grid, sigma = lanczos.density_grid(tridiagonals)
  ritz = [t.ritz() for t in tridiagonals]
  return {
      'loss': float(sum(s['loss'] for s in sums)) / total_tokens,
      'num_parameters': num_parameters,
      'top_eigenvalues': lanczos.top_eigenvalues(tridiagonals, num_top).tolist(),
      'ritz_values': [values.tolist() for values, _ in ritz],
      'ritz_weights': [weights.tolist() for _, weights in ritz],
      'density_grid': grid.tolist(),
      'density': lanczos.spectral_density(tridiagonals, grid, sigma).tolist(),
      'sigma': sigma,
  }


def measure(config: ml_collections.ConfigDict, vocab_size: int, batches: list[dict], *,
            num_layers: int, seeds: list[int], num_iterations: int, num_probes: int,
            num_top: int) -> dict:
  """`spectrum` for Post-LN and Pre-LN models of `num_layers` + `num_layers` layers, per seed (the
  initialisation's and the probes'), with the top eigenvalues' mean and spread over seeds."""
  results = {}
  for placement in PLACEMENTS:
    model = Transformer.of(experiment.with_model(
        config, norm_position=placement, num_encoder_layers=num_layers, num_decoder_layers=num_layers).model,
        vocab_size)
    per_seed = [spectrum(model, experiment.init_variables(model, seed), batches,
                         config.train.label_smoothing, num_iterations=num_iterations,
                         num_probes=num_probes, num_top=num_top, probe_seed=seed)
                for seed in seeds]
    top = np.array([spectrum_results['top_eigenvalues'] for spectrum_results in per_seed])
    results[placement] = {
        'per_seed': per_seed,
        'top_eigenvalues': top.mean(0).tolist(),
        'top_eigenvalues_std': (top.std(0, ddof=1) if len(seeds) > 1 else 0 * top[0]).tolist(),
        'loss': float(np.mean([spectrum_results['loss'] for spectrum_results in per_seed])),
    }
  return results


def plot(results: dict) -> Figure:
  """Densities on a log scale, one line per seed, and the top eigenvalues (the seeds' mean, shaded
  over their range), per placement."""
  figure = Figure(figsize=(11, 4))
  density_axes, top_axes = figure.subplots(1, 2)
  colors = {'post': 'tab:red', 'pre': 'tab:blue'}
  for placement in PLACEMENTS:
    for number, spectrum_results in enumerate(results[placement]['per_seed']):
      density_axes.plot(spectrum_results['density_grid'],
                        np.maximum(spectrum_results['density'], _DENSITY_FLOOR),
                        color=colors[placement], alpha=0.7,
                        label=f'{placement}-LN' if number == 0 else None)
    top = results[placement]['top_eigenvalues']
    per_seed = np.array([spectrum_results['top_eigenvalues']
                         for spectrum_results in results[placement]['per_seed']])  # [seeds, top]
    ranks = range(1, len(top) + 1)
    top_axes.plot(ranks, top, marker='o', color=colors[placement], label=f'{placement}-LN')
    top_axes.fill_between(ranks, per_seed.min(0), per_seed.max(0), color=colors[placement],
                          alpha=0.2)
  density_axes.set(title='Hessian eigenvalue density at initialisation (SLQ)', xlabel='eigenvalue',
                   ylabel='density', yscale='log')
  top_axes.set(title='largest Hessian eigenvalues', xlabel='rank', ylabel='eigenvalue')
  density_axes.legend()
  top_axes.legend()
  return figure


def run(config: ml_collections.ConfigDict, out: Path, vocab_size: int, batches: list[dict], *,
        num_layers: int, seeds: list[int], num_iterations: int, num_probes: int, num_top: int,
        split: str) -> dict:
  """Measures on `batches` (pairs of `split`), writes `out` and its PNG; returns the results."""
  results = {
      'settings': {'num_layers': num_layers, 'seeds': seeds, 'split': split,
                   'num_pairs': sum(len(b['encoder_input_tokens']) for b in batches),
                   'target_tokens': float(sum(b['decoder_target_weights'].sum() for b in batches)),
                   'lanczos_iterations': num_iterations, 'num_probes': num_probes,
                   'kernel_init': config.model.kernel_init, 'dropout': 'off (train=False)'},
      'config': experiment.resolved(config),
      **measure(config, vocab_size, batches, num_layers=num_layers, seeds=seeds,
                num_iterations=num_iterations, num_probes=num_probes, num_top=num_top),
  }
  experiment.write(out, results, plot(results))
  return results


def define_flags() -> None:
  experiment.define_flags()
  flags.DEFINE_integer('num_layers', 6, 'Encoder and decoder layers.', lower_bound=1)
  flags.DEFINE_integer('num_pairs', 1000, 'Sentence pairs of the loss (the first of --split).',
                       lower_bound=1)
  flags.DEFINE_string('split', 'validation', 'Split the pairs come from.')
  flags.DEFINE_integer('batch_size', 100, 'Pairs per Hessian-vector-product batch: peak memory is '
                       'about 5 GB for 100 pairs of 6+6 layers.', lower_bound=1)
  flags.DEFINE_integer('lanczos_iterations', 40, 'Lanczos steps (Hessian-vector products) per probe.',
                       lower_bound=1)
  flags.DEFINE_integer('num_probes', 1, 'Random starting vectors of the quadrature.', lower_bound=1)
  flags.DEFINE_integer('num_top', 10, 'Largest eigenvalues reported.', lower_bound=1)
  flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds of the initialisation and of the probes, each '
                    'measured on its own.')


def main(argv) -> None:
  del argv
  # What the script prints is its output; library INFO records go only where --verbosity asks.
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  config, out = experiment.config_and_out()
  vocab_size, batches = experiment.load_batches_or_exit(
      config.data, flags.FLAGS.split, flags.FLAGS.num_pairs, flags.FLAGS.batch_size)
  run(config, out, vocab_size, batches, num_layers=flags.FLAGS.num_layers,
      seeds=experiment.int_list('seeds', flags.FLAGS.seeds, minimum=0),
      num_iterations=flags.FLAGS.lanczos_iterations, num_probes=flags.FLAGS.num_probes,
      num_top=flags.FLAGS.num_top, split=flags.FLAGS.split)
  print(f'wrote {out} and {out.with_suffix(".png")}')


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=command_line.parse_flags)
