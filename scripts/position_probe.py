"""What the position encodings say about relative distance, measured on model/position.py.

Sinusoidal (Vaswani et al. 2017): for every shift k there is one matrix M_k, block-diagonal with
a 2x2 rotation by k w_i per frequency w_i, such that p_(pos+k) = M_k p_pos at every position: a
relative offset is a linear map of the absolute code, which attention can learn. A consequence
is that p_pos . p_(pos+k) = sum_i cos(k w_i) depends on k alone.

RoPE (Su et al. 2021): queries and keys are rotated by their positions, so
<R_i q, R_j k> = <q, R_(j-i) k> depends on j - i alone; and the inner product decays with
distance. Su et al. (section 3.4.3) bound |<R_i q, R_j k>| by max_l |h_(l+1) - h_l| times
sum_(l=1..H/2) |S_l|, S_l = sum_(m<l) exp(i (j-i) theta_m); the script reports the mean of |S_l|,
their curve. It also reports the expected inner product of a query with an identical key r
positions away, E_q[<R_p q, R_(p+r) q>] / H for q with unit-variance entries, which is
trace(R_p^T R_(p+r)) / H = mean_m cos(r theta_m): computed by rotating the H basis vectors with
the model's apply_rope.

Widths come from --config: the sinusoidal table has config.model.d_model features, RoPE acts on
heads of config.model.d_model / config.model.num_heads. No data is read.

  python -m scripts.position_probe --config=configs/multi30k.py:de_en_small --out=runs/analyses/positions.json

The JSON holds `settings`, the resolved `config`, and
  'sinusoidal': {'d_model', 'distances' [K], 'dot_product' [K] p_0 . p_k / (D/2),
                 'shift_max_error' max over pos, k of |p_(pos+k) - M_k p_pos|};
  'rope': {'head_dim', 'distances' [K], 'decay_bound' [K] Su et al.'s mean |S_l|,
           'identical_key_inner_product' [K], 'relative_only_max_error' max over i, j, s of
           |<R_i q, R_j k> - <R_(i+s) q, R_(j+s) k>| for random q, k}.
"""

from pathlib import Path

from absl import app, flags
import jax
import jax.numpy as jnp
from matplotlib.figure import Figure
import ml_collections
import numpy as np


from analysis import experiment
from model import position
from training import command_line, run_log

# Positions and shifts of the numerical checks (the table is checked at every pos + k < this).
_CHECKED_POSITIONS = 256


def sinusoidal_shift_matrix(shift: int, dim: int) -> np.ndarray:
  """M_k [D, D] with sinusoidal_table[pos + k] = M_k sinusoidal_table[pos] for every pos.

  Features (2i, 2i+1) hold (sin, cos)(pos w_i), and
  sin((pos + k) w) = sin(pos w) cos(k w) + cos(pos w) sin(k w),
  cos((pos + k) w) = cos(pos w) cos(k w) - sin(pos w) sin(k w).
  """
  angles = shift * position.MAX_WAVELENGTH ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)  # [D/2]
  sines, cosines = 2 * np.arange(dim // 2), 2 * np.arange(dim // 2) + 1  # feature indices [D/2]
  matrix = np.zeros((dim, dim))
  matrix[sines, sines], matrix[sines, cosines] = np.cos(angles), np.sin(angles)
  matrix[cosines, sines], matrix[cosines, cosines] = -np.sin(angles), np.cos(angles)
  return matrix


def rope_frequencies(head_dim: int) -> np.ndarray:
  """theta_m [H/2], as apply_rope turns pair m."""
  return position.MAX_WAVELENGTH ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def rope_decay_bound(distances: np.ndarray, head_dim: int) -> np.ndarray:
  """Su et al.'s (1/(H/2)) sum_l |S_l| at each relative distance [K]."""
  phases = np.exp(1j * distances[:, None] * rope_frequencies(head_dim))  # [K, H/2]
  partial_sums = np.cumsum(phases, axis=1)  # [K, H/2]: S_1 .. S_(H/2)
  return np.abs(partial_sums).mean(1)


# One compiled program per shape rather than one per primitive, as eager dispatch would compile.
_apply_rope = jax.jit(position.apply_rope)


def rope_inner_products(queries: np.ndarray, keys: np.ndarray, query_position: int,
                        key_positions: np.ndarray) -> np.ndarray:
  """<apply_rope(q, i), apply_rope(k, j)> [Q, K] for queries [Q, H] at i and keys [Q, H] at each j [K]."""
  num_vectors, head_dim = queries.shape
  # apply_rope wants [B, L, N, H] and positions [B, L]: the Q vectors are the length axis.
  rotated_queries = _apply_rope(
      jnp.asarray(queries, jnp.float32)[None, :, None, :],  # [1, Q, 1, H]
      jnp.full((1, num_vectors), query_position, jnp.int32))[0, :, 0]  # [Q, H]
  rotated_keys = _apply_rope(
      jnp.broadcast_to(jnp.asarray(keys, jnp.float32)[None, :, None, :],
                       (len(key_positions), num_vectors, 1, head_dim)),  # [K, Q, 1, H]
      jnp.broadcast_to(jnp.asarray(key_positions, jnp.int32)[:, None],
                       (len(key_positions), num_vectors)))[:, :, 0]  # [K, Q, H]
  return np.asarray(jnp.einsum('QH,KQH->QK', rotated_queries, rotated_keys))


def measure(config: ml_collections.ConfigDict, max_distance: int) -> dict:
  """The sinusoidal and RoPE curves and checks (module docstring)."""
  d_model = config.model.d_model
  head_dim = d_model // config.model.num_heads
  distances = np.arange(max_distance + 1)  # [K]

  table = np.asarray(position.sinusoidal_table(max(max_distance + 1, _CHECKED_POSITIONS), d_model),
                     np.float64)  # [P, D]
  shift_errors = [np.abs(table[shift:_CHECKED_POSITIONS] -
                         table[:_CHECKED_POSITIONS - shift] @ sinusoidal_shift_matrix(shift, d_model).T).max()
                  for shift in range(1, _CHECKED_POSITIONS)]

  basis = np.eye(head_dim)  # [H, H]: the trace over these is the expectation over random queries
  identical_key = rope_inner_products(basis, basis, 0, distances).sum(0) / head_dim  # [K]
  rng = np.random.default_rng(0)
  queries, keys = rng.standard_normal((2, 8, head_dim))  # 2 x [8, H]
  relative_errors = [np.abs(rope_inner_products(queries, keys, i, distances[:64] + i) -
                            rope_inner_products(queries, keys, 0, distances[:64])).max()
                     for i in (1, 17, 200)]
  return {
      'sinusoidal': {
          'd_model': d_model,
          'distances': distances.tolist(),
          'dot_product': (table[distances] @ table[0] / (d_model / 2)).tolist(),
          'shift_max_error': float(max(shift_errors)),
      },
      'rope': {
          'head_dim': head_dim,
          'distances': distances.tolist(),
          'decay_bound': rope_decay_bound(distances, head_dim).tolist(),
          'identical_key_inner_product': identical_key.tolist(),
          'relative_only_max_error': float(max(relative_errors)),
      },
  }


def plot(results: dict) -> Figure:
  """The sinusoidal dot product and the RoPE decay curves against distance."""
  figure = Figure(figsize=(11, 4))
  sinusoidal_axes, rope_axes = figure.subplots(1, 2)
  sinusoidal = results['sinusoidal']
  sinusoidal_axes.plot(sinusoidal['distances'], sinusoidal['dot_product'])
  sinusoidal_axes.set(title=f'sinusoidal: p_0 . p_k / (D/2), D={sinusoidal["d_model"]}',
                      xlabel='distance k')
  rope = results['rope']
  # Both curves relative to distance 0 (the identical-key product is 1 there already).
  bound = np.asarray(rope['decay_bound'])
  rope_axes.plot(rope['distances'], bound / bound[0], label='Su et al. bound: mean |S_l|, / value at 0')
  rope_axes.plot(rope['distances'], rope['identical_key_inner_product'],
                 label='E <R_p q, R_(p+r) q> / H')
  rope_axes.set(title=f'RoPE long-term decay, head dim {rope["head_dim"]}', xlabel='relative distance r')
  rope_axes.legend()
  return figure


def run(config: ml_collections.ConfigDict, out: Path, *, max_distance: int) -> dict:
  """Measures, writes `out` and its PNG; returns the results."""
  results = {'settings': {'max_distance': max_distance}, 'config': experiment.resolved(config),
             **measure(config, max_distance)}
  experiment.write(out, results, plot(results))
  return results


def define_flags() -> None:
  experiment.define_flags()
  flags.DEFINE_integer('max_distance', 256, 'Largest relative distance plotted.', lower_bound=1)


def main(argv) -> None:
  del argv
  # What the script prints is its output; library INFO records go only where --verbosity asks.
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  config, out = experiment.config_and_out()
  run(config, out, max_distance=flags.FLAGS.max_distance)
  print(f'wrote {out} and {out.with_suffix(".png")}')


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=command_line.parse_flags)
