"""Spectra of a symmetric operator known only through matrix-vector products (a Hessian).

Dimensions: P parameters (the operator is P x P), M Lanczos iterations, K probes, G grid points.

m steps of Lanczos from a unit vector v build an orthonormal basis of the Krylov space
span{v, Av, ..., A^(m-1) v} in which A is the tridiagonal T (alphas on the diagonal, betas
beside it). The eigenvalues of T (Ritz values) approximate the extreme eigenvalues of A first,
so a few dozen products give the top of the spectrum. Every new basis vector is
reorthogonalised against all earlier ones: in floating point plain Lanczos loses
orthogonality as soon as a Ritz value converges and then reports it again as a spurious copy.

Stochastic Lanczos quadrature (Ghorbani, Krishnan & Xiao 2019, after Golub & Welsch): for a
random unit v, v^T f(A) v = sum_i f(theta_i) tau_i with Ritz values theta_i and weights tau_i,
the squared first components of T's eigenvectors; the tau_i sum to 1. Averaged over random v
(E[v v^T] = I/P) this estimates (1/P) trace f(A), so with f a Gaussian of width sigma around
each grid point it is the eigenvalue density, smoothed, integrating to 1.
"""

import dataclasses
from typing import Callable

from jax.flatten_util import ravel_pytree
import numpy as np

# Operator on flat vectors: [P] -> [P].
MatVec = Callable[[np.ndarray], np.ndarray]

# Ghorbani et al.'s Gaussian width: sigma^2 = 1e-5 on the spectrum rescaled to [-1, 1].
RELATIVE_SIGMA = 1e-5 ** 0.5


@dataclasses.dataclass(frozen=True)
class Tridiagonal:
  """The Lanczos matrix T: `alphas` [M] on the diagonal, `betas` [M-1] beside it."""
  alphas: np.ndarray
  betas: np.ndarray

  def matrix(self) -> np.ndarray:
    """[M, M] float64."""
    return np.diag(self.alphas) + np.diag(self.betas, 1) + np.diag(self.betas, -1)

  def ritz(self) -> tuple[np.ndarray, np.ndarray]:
    """Ritz values [M] (ascending) and their quadrature weights [M] (summing to 1)."""
    values, vectors = np.linalg.eigh(self.matrix())
    return values, np.square(vectors[0])


def lanczos(matvec: MatVec, start: np.ndarray, num_iterations: int) -> Tridiagonal:
  """Lanczos with full reorthogonalisation from `start`.

  Stops early, with fewer than `num_iterations` rows, when the residual is at rounding level:
  the Krylov space is invariant and T is exact. A residual just above it starts a nearly
  decoupled block of T whose Ritz values carry almost no quadrature weight, so the density is
  unaffected; such blocks do find further copies of repeated eigenvalues.

  Args:
    matvec: the symmetric operator A, [P] -> [P].
    start: [P] nonzero starting vector; its dtype is the basis dtype (float32 keeps a basis of
      M x 13M parameters at 4 bytes a number).
    num_iterations: M, at most P.

  Returns:
    The tridiagonal T of A in the Krylov basis.
  """
  dim = start.shape[0]
  if not 0 < num_iterations <= dim:
    raise ValueError(f'num_iterations={num_iterations} must be in [1, {dim}] (the operator size)')
  basis = np.zeros((num_iterations, dim), start.dtype)  # [M, P], rows orthonormal
  basis[0] = start / np.linalg.norm(start)
  alphas, betas = [], []
  # A residual this small relative to the operator's scale is rounding error: the space is invariant.
  breakdown = 100 * np.finfo(start.dtype).eps
  for j in range(num_iterations):
    w = np.asarray(matvec(basis[j]), start.dtype)  # [P]
    alphas.append(float(w @ basis[j]))
    if j + 1 == num_iterations:
      break
    # Two Gram-Schmidt passes against the whole basis ("twice is enough", Parlett); this also
    # removes the alpha v_j and beta v_(j-1) terms of the three-term recurrence.
    for _ in range(2):
      w = w - basis[:j + 1].T @ (basis[:j + 1] @ w)
    beta = float(np.linalg.norm(w))
    if beta <= breakdown * max(np.abs(alphas).max(), max(betas, default=0.0)):
      break
    betas.append(beta)
    basis[j + 1] = w / beta
  return Tridiagonal(np.asarray(alphas), np.asarray(betas))


def stochastic_lanczos_quadrature(matvec: MatVec, dim: int, num_iterations: int, num_probes: int,
                                  seed: int, dtype=np.float32) -> list[Tridiagonal]:
  """Lanczos from `num_probes` independent Gaussian starting vectors (seeded by `seed`)."""
  rng = np.random.default_rng(seed)
  return [lanczos(matvec, rng.standard_normal(dim).astype(dtype), num_iterations)
          for _ in range(num_probes)]


def top_eigenvalues(tridiagonals: list[Tridiagonal], count: int) -> np.ndarray:
  """The `count` largest eigenvalue estimates [count], descending.

  Each probe's largest Ritz values are lower bounds that converge from below, so the estimate
  of the k-th largest eigenvalue is the largest k-th Ritz value over probes.
  """
  per_probe = [np.sort(t.ritz()[0])[::-1][:count] for t in tridiagonals]
  count = min(len(values) for values in per_probe)
  return np.max([values[:count] for values in per_probe], axis=0)


def spectral_density(tridiagonals: list[Tridiagonal], grid: np.ndarray, sigma: float) -> np.ndarray:
  """Gaussian-broadened SLQ density on `grid` [G], averaged over probes: [G], integrating to 1."""
  density = np.zeros(grid.shape, np.float64)
  for tridiagonal in tridiagonals:
    values, weights = tridiagonal.ritz()
    gaussians = np.exp(-0.5 * np.square((grid[:, None] - values) / sigma))  # [G, M]
    density += gaussians @ weights / (sigma * np.sqrt(2 * np.pi))
  return density / len(tridiagonals)


def density_grid(tridiagonals: list[Tridiagonal], num_points: int = 10_000) -> tuple[np.ndarray, float]:
  """A grid [G] spanning every Ritz value with a margin, and Ghorbani et al.'s Gaussian width.

  The width is RELATIVE_SIGMA times the half-range of the Ritz values; the grid spacing is kept
  below it so that sums over the grid integrate the density.
  """
  values = np.concatenate([t.ritz()[0] for t in tridiagonals])
  low, high = values.min(), values.max()
  half_range = max(high - low, 1e-12) / 2
  sigma = RELATIVE_SIGMA * half_range
  margin = 0.01 * half_range + 5 * sigma
  return np.linspace(low - margin, high + margin, num_points), sigma


def flatten_operator(pytree_matvec: Callable, example) -> tuple[MatVec, int]:
  """Turns an operator on pytrees shaped like `example` (e.g. a Hessian-vector product over a
  parameter tree) into one on flat [P] NumPy vectors; returns it and P."""
  flat_example, unravel = ravel_pytree(example)

  def matvec(vector: np.ndarray) -> np.ndarray:
    flat, _ = ravel_pytree(pytree_matvec(unravel(vector.astype(flat_example.dtype))))
    return np.asarray(flat)

  return matvec, flat_example.shape[0]
