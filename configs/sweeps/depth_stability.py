"""Depth stability without warmup: do deep Post-LN stacks fail where Pre-LN, sandwich, DeepNorm and
Admin train? The claim the Post-LN vs Pre-LN debate rests on (Xiong et al. 2020; Wang et al. 2022).

  python -m scripts.sweep configs/sweeps/depth_stability.py:cpu --workdir=runs/depth_stability
  python -m scripts.report runs/depth_stability --colour_by=norm_position --panel_by=enc_layers

Grid: placements post, pre, sandwich, deepnorm, admin x {6, 12, 24} encoder and decoder layers, 3
seeds each (seeds(); --seeds overrides): 45 runs. Every run starts at its peak rate (Adam 1e-3, no
warmup, constant), the regime in which Xiong et al. report Post-LN failing.

Presets:
  cpu   (default) narrow models (d_model 64, 4 heads, FFN 256) for a shared 2-core CPU: 200 steps
        of ~1,000-token packed batches of pairs up to 32 tokens (one compiled shape per run),
        training loss every 10 steps, validation loss on 128 validation sentences at the end.
        Shows whether a run gets going, diverges or stalls; not converged quality. On the 2-core
        VM a 24+24 run takes ~3.5 min (0.6 s a step, ~1 min compiling), all 45 ~95 min.
  full  the same grid at d_model 128 (FFN 512), 4,096-token batches and 2,000 steps, for an
        accelerator.
"""

from configs import multi30k

PLACEMENTS = ('post', 'pre', 'sandwich', 'deepnorm', 'admin')
DEPTHS = (6, 12, 24)
PRESETS = ('cpu', 'full')


def _check(preset: str) -> None:
  if preset not in PRESETS:
    raise ValueError(f'configs/sweeps/depth_stability.py preset {preset!r} is not one of: {", ".join(PRESETS)}')


def get_config(preset: str = 'cpu'):
  _check(preset)
  config = multi30k.get_config('de_en_small')
  config.model.update(d_model=64, num_heads=4, d_ff=256, dropout_rate=0.1)
  # No warmup, a fixed rate: the placements must cope with the full step from step 1.
  config.optim.update(optimizer='adam', learning_rate=1e-3, schedule='constant', warmup_steps=0)
  # Pairs up to 32 tokens (longer ones are dropped and counted) packed into rows of 32: one shape.
  config.data.update(max_length=32, pack_length=32, max_tokens=1024, eval_examples=128)
  config.train.update(num_steps=200, log_every=10, eval_every=200, checkpoint_every=200,
                      keep_checkpoints=1)
  if preset == 'full':
    config.model.update(d_model=128, d_ff=512)
    config.data.update(max_tokens=4096, eval_examples=0)
    config.train.update(num_steps=2000, log_every=25, eval_every=500, checkpoint_every=500)
  return config


def sweep(preset: str = 'cpu'):
  """Override dicts of the grid (scripts/sweep.py repeats each over seeds())."""
  _check(preset)
  for layers in DEPTHS:
    for placement in PLACEMENTS:
      yield {'model.norm_position': placement, 'model.num_encoder_layers': layers,
             'model.num_decoder_layers': layers}


def seeds(preset: str = 'cpu') -> int:
  """Seeds per grid point: a fraction of diverged seeds needs more than one."""
  _check(preset)
  return 3
