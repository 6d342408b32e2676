"""Analyses (analysis/, scripts/grad_norms.py, hessian.py, activation_stats.py, position_probe.py)
against known spectra and closed forms."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import jax
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np
import pytest

from analysis import experiment, lanczos
from configs import smoke
from data import multi30k
from model import position
from model.transformer import Transformer
from scripts import activation_stats, grad_norms, hessian, position_probe
from tests import data_fixtures

REPO = Path(__file__).resolve().parents[1]


def random_symmetric(eigenvalues, rng) -> np.ndarray:
  """Q diag(eigenvalues) Q^T with a random orthogonal Q."""
  q, _ = np.linalg.qr(rng.standard_normal((len(eigenvalues), len(eigenvalues))))
  return q @ np.diag(eigenvalues) @ q.T


def test_lanczos_on_a_quadratic_recovers_its_hessian_eigenvalues():
  rng = np.random.default_rng(0)
  # f(theta) = theta^T A theta / 2 over a parameter tree: the Hessian is A, reached only through
  # Hessian-vector products on the tree, as scripts/hessian.py reaches the model's.
  eigenvalues = np.array([9.0, 4.0, 2.5, 1.0, 0.5, 0.25, 0.0, -0.75, -1.5, -3.0, -6.0, -7.0])
  matrix = jnp.asarray(random_symmetric(eigenvalues, rng), jnp.float32)
  params = {'w': jnp.zeros((3, 3)), 'b': jnp.zeros(3)}
  flat = lambda tree: jnp.concatenate([tree['b'], tree['w'].ravel()])  # [12]
  loss = lambda tree: 0.5 * flat(tree) @ matrix @ flat(tree)
  hvp = lambda tangent: jax.jvp(jax.grad(loss), (params,), (tangent,))[1]
  matvec, dim = lanczos.flatten_operator(hvp, params)
  assert dim == 12
  tridiagonal = lanczos.lanczos(matvec, rng.standard_normal(dim).astype(np.float32), dim)
  values, weights = tridiagonal.ritz()
  np.testing.assert_allclose(values, np.sort(eigenvalues), atol=1e-4)
  assert weights.sum() == pytest.approx(1.0, abs=1e-6)


def test_top_eigenvalues_converge_in_few_iterations_with_full_reorthogonalisation():
  rng = np.random.default_rng(0)
  # Three outliers above a bulk of 197 eigenvalues in [-1, 1], as in neural-network Hessians.
  eigenvalues = np.concatenate([[50.0, 30.0, 20.0], rng.uniform(-1, 1, 197)])
  matrix = random_symmetric(eigenvalues, rng)
  tridiagonals = lanczos.stochastic_lanczos_quadrature(lambda v: matrix @ v, 200, 30, 2, seed=0,
                                                       dtype=np.float64)
  np.testing.assert_allclose(lanczos.top_eigenvalues(tridiagonals, 3), [50.0, 30.0, 20.0], rtol=1e-6)
  # Without reorthogonalisation converged outliers come back as spurious copies; with it each
  # appears once among the Ritz values of every probe.
  for tridiagonal in tridiagonals:
    assert np.sum(tridiagonal.ritz()[0] > 10) == 3


def test_lanczos_stops_when_the_krylov_space_is_invariant():
  matrix = np.diag([1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 3.0])
  start = np.arange(1.0, 8.0)
  tridiagonal = lanczos.lanczos(lambda v: matrix @ v, start, 7)
  values, weights = tridiagonal.ritz()
  np.testing.assert_allclose(values, [1.0, 2.0, 3.0], atol=1e-12)
  # Weight of each eigenvalue: the squared norm of the start's component in its eigenspace.
  np.testing.assert_allclose(weights, np.array([1 + 4, 9 + 16, 25 + 36 + 49]) / 140, atol=1e-12)


def test_slq_density_integrates_to_one_with_mass_where_the_eigenvalues_are():
  rng = np.random.default_rng(0)
  # 80 eigenvalues in [-0.5, 0.5] and 20 in [9.5, 10.5]: the density puts 0.8 and 0.2 there.
  eigenvalues = np.concatenate([rng.uniform(-0.5, 0.5, 80), rng.uniform(9.5, 10.5, 20)])
  matrix = random_symmetric(eigenvalues, rng)
  tridiagonals = lanczos.stochastic_lanczos_quadrature(lambda v: matrix @ v, 100, 30, 20, seed=1,
                                                       dtype=np.float64)
  grid, sigma = lanczos.density_grid(tridiagonals)
  density = lanczos.spectral_density(tridiagonals, grid, sigma)
  mass = lambda low, high: density[(grid >= low) & (grid <= high)].sum() * (grid[1] - grid[0])
  assert mass(grid[0], grid[-1]) == pytest.approx(1.0, abs=1e-3)
  assert mass(-0.6, 0.6) == pytest.approx(0.8, abs=0.05)
  assert mass(9.4, 10.6) == pytest.approx(0.2, abs=0.05)
  assert mass(0.6, 9.4) < 1e-3


@pytest.fixture(scope='module')
def tiny_multi30k(tmp_path_factory):
  """The smoke config over a small real Multi30k (200 training, 40 validation pairs): data and a
  600-piece tokenizer are prepared in seconds."""
  folder = tmp_path_factory.mktemp('tiny_multi30k')
  source = data_fixtures.write_multi30k(folder / 'multi30k')
  root = data_fixtures.data_root() / 'multi30k'
  for split, count in (('train', 200), ('validation', 40)):
    for name in (multi30k.raw_name, multi30k.tok_name):
      for lang in ('de', 'en'):
        lines = data_fixtures.read_gzip_lines(root / f'{name(split, lang)}.gz')[:count]
        with gzip.open(source / f'{name(split, lang)}.gz', 'wt', encoding='utf-8') as f:
          f.write(''.join(f'{line}\n' for line in lines))
  config = smoke.get_config()
  config.data.update(source_dir=str(source), cache_dir=str(folder / 'cache'), vocab_size=600)
  return config


def test_load_batches_sorts_by_length_and_keeps_every_token(tiny_multi30k):
  vocab_size, batches = experiment.load_batches(tiny_multi30k.data, 'validation', 30, batch_size=8)
  assert vocab_size == 600
  assert [len(b['encoder_input_tokens']) for b in batches] == [8, 8, 8, 6]
  _, (whole,) = experiment.load_batches(tiny_multi30k.data, 'validation', 30, batch_size=30)
  count = lambda batch_list, name: sum(int((b[name] != 0).sum()) for b in batch_list)
  for name in experiment.MODEL_INPUTS:
    assert count(batches, name) == count([whole], name)
  lengths = [b['decoder_input_tokens'].shape[1] for b in batches]
  assert lengths == sorted(lengths) and all(length % 8 == 0 for length in lengths)
  with pytest.raises(ValueError, match='40 pairs, fewer than the 41'):
    experiment.load_batches(tiny_multi30k.data, 'validation', 41, batch_size=8)


def test_grad_norms_on_a_two_layer_model_is_deterministic_per_seed(tiny_multi30k, tmp_path):
  vocab_size, (batch,) = experiment.load_batches(tiny_multi30k.data, 'train', 16, batch_size=16)
  settings = dict(num_layers=1, seeds=[0, 1], depths=[1], split='train')
  out = tmp_path / 'grad_norms.json'
  first = grad_norms.run(tiny_multi30k, out, vocab_size, batch, **settings)
  assert json.loads(out.read_text()) == first
  assert out.with_suffix('.png').stat().st_size > 0
  assert first['settings']['num_pairs'] == 16
  for placement in ('post', 'pre'):
    results = first[placement]
    for stack, matrix in (('encoder', 'ffn_w2'), ('decoder', 'ffn_w2'), ('encoder', 'ffn_w1'),
                          ('decoder', 'cross_attention_value'), ('encoder', 'self_attention_query')):
      name = f'{stack}_{matrix}'
      per_seed = np.array(results[f'{name}_per_seed'])
      assert per_seed.shape == (2, 1) and np.all(per_seed > 0)
      np.testing.assert_allclose(results[name], per_seed.mean(0))
      assert per_seed[0, 0] != per_seed[1, 0]
    assert results['depth_sweep'] == {'1': pytest.approx(results['decoder_ffn_w2'][-1])}
    assert len(results['depth_sweep_per_seed']['1']) == 2
  second = grad_norms.run(tiny_multi30k, tmp_path / 'again.json', vocab_size, batch, **settings)
  assert second == first


def test_hessian_vector_products_match_finite_differences_and_feed_lanczos(tiny_multi30k):
  rng = np.random.default_rng(0)
  vocab_size, (batch,) = experiment.load_batches(tiny_multi30k.data, 'validation', 8, batch_size=8)
  # GELU: the gradient of a ReLU network jumps where a unit switches, which a difference quotient
  # turns into an error of order one however small the step.
  model = Transformer.of(experiment.with_model(tiny_multi30k, activation='gelu').model, vocab_size)
  variables = experiment.init_variables(model, 0)
  tokens = float(batch['decoder_target_weights'].sum())
  tangent = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), variables['params'])
  product = hessian.batch_hvp(model, variables, batch, tangent, 0.1, tokens)
  # Central difference of the gradient along the tangent: (g(p + e t) - g(p - e t)) / 2e = H t + O(e^2).
  gradient = jax.jit(jax.grad(lambda params: experiment.loss_sums(
      model, {'params': params}, batch, 0.1)['loss'] / tokens))
  step = 1e-3
  moved = lambda sign: gradient(jax.tree.map(lambda p, t: p + sign * step * t, variables['params'], tangent))
  difference = jax.tree.map(lambda plus, minus: (plus - minus) / (2 * step), moved(1), moved(-1))
  flat_product, flat_difference = (ravel_pytree(tree)[0] for tree in (product, difference))
  assert jnp.linalg.norm(flat_product - flat_difference) < 1e-2 * jnp.linalg.norm(flat_difference)
  results = hessian.spectrum(model, variables, [batch], 0.1, num_iterations=4, num_probes=1, num_top=2,
                             probe_seed=0)
  assert results['num_parameters'] == flat_product.shape[0]
  assert np.isfinite(results['loss']) and results['top_eigenvalues'][0] >= results['top_eigenvalues'][1]
  assert sum(results['ritz_weights'][0]) == pytest.approx(1.0)


def test_stream_variance_flat_with_post_ln_linear_with_pre_ln_geometric_without_norm(tiny_multi30k):
  config = experiment.with_model(tiny_multi30k, d_model=64, d_ff=256, num_heads=2, num_encoder_layers=3,
                                 num_decoder_layers=3)
  vocab_size, (batch,) = experiment.load_batches(config.data, 'validation', 32, batch_size=32)
  variances = {}
  for name, (norm_position, apply_norms) in activation_stats.PLACEMENTS.items():
    model = Transformer.of(experiment.with_model(config, norm_position=norm_position).model, vocab_size)
    variances[name] = np.asarray(activation_stats.stream_variances(
        model, experiment.init_variables(model, 0), batch, apply_norms)['encoder'])
  layers = np.arange(4)
  # Post-LN: every layer ends in a LayerNorm with unit scale and zero bias, so variance 1.
  np.testing.assert_allclose(variances['post'][1:], 1.0, atol=1e-3)
  # Pre-LN: each sublayer sees a unit-variance input and adds about the same variance: a line.
  pre = variances['pre']
  line = np.polyval(np.polyfit(layers, pre, 1), layers)
  assert np.all(np.diff(pre) > 0) and np.abs(pre - line).max() < 0.15 * (pre[-1] - pre[0])
  # No norm: x + f(x) multiplies the variance by about (1 + a) per sublayer, (1 + a)^n overall.
  free = variances['none']
  growth = (free[-1] / free[0]) ** (1 / 3)
  np.testing.assert_allclose(free, free[0] * growth ** layers, rtol=0.5)
  # ... a factor above any Pre-LN layer's, whose added variance is a shrinking fraction of the stream.
  assert np.min(free[1:] / free[:-1]) > np.max(pre[1:] / pre[:-1])


def test_sinusoidal_table_shifts_by_a_fixed_rotation():
  table = np.asarray(position.sinusoidal_table(80, 16), np.float64)  # [P, D]
  for shift in (1, 7, 40):
    shift_matrix = position_probe.sinusoidal_shift_matrix(shift, 16)
    np.testing.assert_allclose(table[shift:], table[:-shift] @ shift_matrix.T, atol=1e-6)
    np.testing.assert_allclose(shift_matrix @ shift_matrix.T, np.eye(16), atol=1e-12)


def test_rope_inner_product_depends_on_relative_distance_only():
  rng = np.random.default_rng(0)
  queries, keys = rng.standard_normal((2, 4, 8))  # 2 x [Q, H]
  distances = np.arange(20)
  at_origin = position_probe.rope_inner_products(queries, keys, 0, distances)  # [Q, K]
  for start in (3, 50):
    shifted = position_probe.rope_inner_products(queries, keys, start, distances + start)
    np.testing.assert_allclose(shifted, at_origin, atol=1e-4)
  # Identical key: <R_0 q, R_r q> summed over the basis is trace(R_r) = 2 sum_m cos(r theta_m).
  basis = np.eye(8)
  trace = position_probe.rope_inner_products(basis, basis, 0, distances).sum(0)
  closed_form = 2 * np.cos(distances[:, None] * position_probe.rope_frequencies(8)).sum(1)
  np.testing.assert_allclose(trace, closed_form, atol=1e-4)


def test_position_probe_cli_writes_checks_and_decay(tmp_path):
  out = tmp_path / 'positions.json'
  completed = subprocess.run(
      [sys.executable, '-m', 'scripts.position_probe', '--config=configs/smoke.py',
       '--config.model.d_model=64', f'--out={out}', '--max_distance=128'],
      cwd=REPO, capture_output=True, text=True, check=False)
  assert completed.returncode == 0, completed.stderr
  results = json.loads(out.read_text())
  assert out.with_suffix('.png').exists()
  assert results['config']['model']['d_model'] == 64
  sinusoidal, rope = results['sinusoidal'], results['rope']
  assert sinusoidal['shift_max_error'] < 1e-5 and rope['relative_only_max_error'] < 1e-3
  assert rope['head_dim'] == 32 and rope['identical_key_inner_product'][0] == pytest.approx(1.0)
  # Su et al.'s bound starts at mean_l l = (H/2 + 1) / 2 and decays with distance.
  assert rope['decay_bound'][0] == pytest.approx(8.5)
  assert max(rope['decay_bound'][64:]) < 0.6 * rope['decay_bound'][0]


def test_cli_errors_are_one_line():
  completed = subprocess.run([sys.executable, '-m', 'scripts.grad_norms', '--config=configs/smoke.py'],
                             cwd=REPO, capture_output=True, text=True, check=False)
  assert completed.returncode != 0
  assert completed.stderr.strip().splitlines()[-1] == (
      'invalid command line: flag --out=None: Flag --out must have a value other than None.')
