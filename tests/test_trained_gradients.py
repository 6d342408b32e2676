"""scripts/trained_gradients.py: how far a layer moved, against closed forms."""

import jax.numpy as jnp
import pytest

from scripts.trained_gradients import layer_changes


def test_a_layer_that_never_moved_is_bitwise_unchanged_and_one_that_did_moves_by_its_relative_norm():
  initial = {'decoder_layer_0': {'w': jnp.array([3.0, 4.0]), 'b': jnp.zeros(2)},
             'decoder_layer_1': {'w': jnp.array([3.0, 4.0]), 'b': jnp.zeros(2)}}
  trained = {'decoder_layer_0': initial['decoder_layer_0'],
             # ||(0.3, 0.4, 0, 0)|| / ||(3, 4, 0, 0)|| = 0.5 / 5
             'decoder_layer_1': {'w': jnp.array([3.3, 4.4]), 'b': jnp.zeros(2)}}
  moved, unchanged = layer_changes(trained, initial, 2, 'decoder')
  assert moved == pytest.approx([0.0, 0.1], abs=1e-6)
  assert unchanged == [True, False]
