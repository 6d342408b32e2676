"""Run in a subprocess with 4 host devices: one train step sharded over a 4-device mesh
against the same step on one device, for each norm named on the command line. Prints one JSON
line per norm with the largest differences."""

import functools
import json
import os
import sys

assert 'xla_force_host_platform_device_count=4' in os.environ.get('XLA_FLAGS', '')

import jax
import jax.numpy as jnp
import numpy as np

from configs import smoke
from model.transformer import Transformer
from training import train_state
from training import partitioning
from training.optimizer import make_optimizer


def check(norm):
  config = smoke.get_config()
  config.model.norm = norm
  # Plain SGD at a constant rate: the update is the gradient itself, so parameter differences
  # measure gradient differences (Adam's first step is nearly sign(g) and would hide them).
  config.optim.update(optimizer='sgd', b1=0.0, learning_rate=1.0, schedule='constant', warmup_steps=0)
  model = Transformer.of(config.model, vocab_size=50)
  tx, _ = make_optimizer(config.optim, steps_per_epoch=None, total_steps=100)
  rng = np.random.default_rng(0)
  tokens = lambda length: rng.integers(3, 50, size=(8, length)).astype(np.int32)
  batch = {'encoder_input_tokens': tokens(12), 'decoder_input_tokens': tokens(10),
           'decoder_target_tokens': tokens(10)}
  for name in batch:
    batch[name][5:, 7:] = 0  # padded rows of different lengths
  batch['decoder_target_weights'] = (batch['decoder_target_tokens'] > 0).astype(np.float32)
  step = functools.partial(train_state.train_step, model=model, tx=tx, label_smoothing=0.1,
                           dropout_key=jax.random.PRNGKey(7))
  state = train_state.create_train_state(model, tx, seed=0)

  single_state, single_metrics = jax.jit(step)(state, jax.tree.map(jnp.asarray, batch))

  mesh = partitioning.make_mesh()
  assert mesh.devices.size == 4
  sharded_step = jax.jit(step, in_shardings=(partitioning.replicated(mesh), partitioning.batch_sharded(mesh)),
                         out_shardings=partitioning.replicated(mesh))
  sharded_batch = partitioning.global_batch(batch, mesh)
  assert len(sharded_batch['encoder_input_tokens'].sharding.device_set) == 4
  sharded_state, sharded_metrics = sharded_step(partitioning.replicate(state, mesh), sharded_batch)

  diff = lambda a, b: max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                          for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  print(json.dumps({'norm': norm, 'loss': [float(single_metrics['train_loss']), float(sharded_metrics['train_loss'])],
                    'params_diff': diff(single_state.params, sharded_state.params),
                    'update_scale': diff(single_state.params, state.params),
                    'batch_stats_diff': diff(single_state.batch_stats, sharded_state.batch_stats)
                    if single_state.batch_stats else 0.0}))


if __name__ == '__main__':
  for name in sys.argv[1:]:
    check(name)
