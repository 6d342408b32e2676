"""Xiong et al. (2020), "On Layer Normalization in the Transformer Architecture", on Multi30k De->En.

  python -m scripts.sweep configs/sweeps/xiong2020.py:warmup --workdir=runs/xiong_warmup
  python -m scripts.report runs/xiong_warmup

Presets (after the colon; train.py accepts them too and trains the preset's base config):
  warmup    (default) Post-LN vs Pre-LN x warmup {0, 500, 4000} x peak rate {5e-4, 1e-3} with Adam,
            plus Post-LN with SGD (momentum 0.9, rate 0.1) at the same warmups: 15 runs, 6+6 layers.
  depth     Post-LN vs Pre-LN x {3, 6, 12} encoder and decoder layers: 6 runs.
  norm      LayerNorm, RMSNorm, BatchNorm, ScaleNorm, all Pre-LN: 4 runs.
  position  sinusoidal, learned, rotary, no positions (Pre-LN): 4 runs.
  warmup_cpu  the paper's central comparison sized for a shared 2-core CPU: Post-LN vs Pre-LN x
            warmup {0, 50} at peak rate 1e-3, 6+6 layers, 100 steps of 2048-token batches
            (~7 min a run): 4 runs. Enough to see whether a model gets going without warmup,
            not to compare final quality.
  norm_cpu, position_cpu  the norm and position comparisons sized the same way: 3+3 layers,
            300 steps of 2048-token batches, warmup 100, dropout 0.1 (~12 min a run): 4 runs each.
  converge  the warmup study trained to convergence, with the paper's schedule family: Adam
            (0.9, 0.98), linear warmup then inverse square root, 12,000 steps (80 epochs).
            Post-LN x warmup {0, 1000, 4000} x peak {5e-4, 1e-3}, Pre-LN x warmup {0, 4000} x
            the same peaks, and Post-LN and Pre-LN with SGD at converge_sgd's best rates: 12
            points, 3 seeds each (36 runs).
  converge_key  the converge preset's central contrast alone: Post-LN vs Pre-LN x warmup
            {0, 4000} at peak 1e-3, 3 seeds (12 runs); the first thing to run on a CPU.
  converge_sgd  SGD's rate for the converge preset: Post-LN and Pre-LN x {0.1, 0.3, 1.0} without
            warmup, 1 seed; short runs pick it (--config.train.num_steps=400), the best go on.
            On the Xeon (docs/results.md, section 10) 1.0 diverged for both; Pre-LN trained best
            at 0.3, Post-LN at neither 0.1 nor 0.3 (0.1 lower by step 1,600).

The converge presets' model is Wu et al.'s "Transformer-tiny" width (d_model 128, FFN 256, 4 heads,
the project's Multi30k recipe, packed rows, dropout 0.3) at Xiong et al.'s depth of 6+6 layers:
Post-LN's trouble is the gradient at the last layers, which grows with depth, so the paper's depth
is kept and the width is the one Multi30k's 29k pairs train well. Every run decays as
P * sqrt(4000 / (t - W + 4000)) after its warmup W (optim.inverse_sqrt_scale=4000), so runs differ
in warmup alone and a warmup-0 run does not divide its rate by sqrt(t) from the first step. A run
has converged when its validation loss moved less than 1% over the last fifth of its steps
(scripts/report.py's 'val loss change, last fifth'; it also counts loss spikes).

Sizing, the trade-off: configs/multi30k.py:de_en_small, the model these runs build on, trains 1000
steps in about an hour on 2 CPU cores, too long for a grid on a CPU. The runs of the first four presets stop at 500 steps (~3.3 epochs), with
validation at 250 and 500 (the *_cpu presets are shorter still). That shows the early-training
behaviour the paper is about: whether Post-LN without warmup fails to get going, whether Pre-LN
trains at once, which norm, depth or position scheme learns fastest. It does not give converged
BLEU, and warmup 4000 never reaches its peak (the rate ends at 1/8 of it): it stands for the paper's
long warmup at this run length. With an accelerator, train to convergence:
--config.train.num_steps=8000 --config.train.eval_every=1000.

After warmup the rate stays at its peak ('constant'), so runs differ in warmup alone: this repo's
inverse_sqrt decays from step max(warmup_steps, 1), which for warmup 0 would also divide the rate
by 22 by step 500. For warmup 500 and 500 steps both schedules are the same.

Depth and cost: Xiong et al. use 6+6 layers, and Post-LN's instability grows with depth (a 3+3
Post-LN model may well train without warmup, which would say little), so the warmup preset uses
6+6. A step then takes ~1.7x as long as with 3+3 (timed on a busy shared 2-core machine, so
rough: 3+3 : 6+6 : 12+12 ~ 1 : 1.7 : 3.5; 3+3 is ~3.4 s quiet, per configs/multi30k.py:de_en_small). Per run,
plus two validation passes: 3+3 ~30 min, 6+6 ~50 min, 12+12 ~1 h 40. Per preset: warmup ~12.5 h
(~7.5 h with --config.model.num_encoder_layers=3 --config.model.num_decoder_layers=3), depth ~6 h,
norm and position ~2 h each. The other presets keep de_en_small's 3+3 and the depth preset varies it.

SGD (momentum b1=0.9) needs a far larger rate than Adam; 0.1 is an untuned, conventional starting
point. The SGD runs ask whether Post-LN's need for warmup is specific to Adam.
"""

from configs import multi30k


def _check(preset: str) -> None:
  if preset not in PRESETS:
    raise ValueError(f'configs/sweeps/xiong2020.py preset {preset!r} is not one of: {", ".join(PRESETS)}')


def get_config(preset: str = 'warmup'):
  _check(preset)
  config = multi30k.get_config('de_en_small')
  # The paper's dropout; pinned so that the runs in docs/results.md stay reproducible whatever
  # the one-hour Multi30k recipe uses.
  config.model.dropout_rate = 0.3
  config.optim.update(optimizer='adam', learning_rate=1e-3, schedule='constant', warmup_steps=500)
  # Checkpoints at 250 and 500 only; keep one (plus the best) to spare disk over a grid.
  config.train.update(num_steps=500, log_every=25, eval_every=250, checkpoint_every=250,
                      keep_checkpoints=1)
  if preset in ('warmup', 'warmup_cpu'):
    config.model.update(num_encoder_layers=6, num_decoder_layers=6)
  if preset == 'warmup_cpu':
    config.data.max_tokens = 2048
    config.train.update(num_steps=100, log_every=10, eval_every=100, checkpoint_every=100)
  if preset in ('norm_cpu', 'position_cpu'):
    config.data.max_tokens = 2048
    # 300 steps of 2048 tokens is ~1 epoch, far from overfitting: dropout 0.3 would only slow
    # every run down.
    config.model.dropout_rate = 0.1
    config.optim.warmup_steps = 100
    config.train.update(num_steps=300, log_every=10, eval_every=150, checkpoint_every=150)
  if preset.startswith('converge'):
    config = _converge_config()
  return config


def _converge_config():
  config = multi30k.get_config('de_en')
  config.model.update(num_encoder_layers=6, num_decoder_layers=6)
  config.optim.update(optimizer='adam', b1=0.9, b2=0.98, learning_rate=1e-3,
                      schedule='inverse_sqrt', inverse_sqrt_scale=4000, warmup_steps=4000)
  # Runs compared at equal steps: no time budget. Validation every 800 steps (~5.4 epochs) draws
  # the BLEU-against-epochs curve; one checkpoint kept (plus the best) spares disk over 36 runs.
  config.train.update(num_steps=12000, time_budget_minutes=0.0, log_every=50, eval_every=800,
                      checkpoint_every=400, keep_checkpoints=1)
  return config


def _warmup():
  for position in ('post', 'pre'):
    for warmup in (0, 500, 4000):
      for rate in (5e-4, 1e-3):
        yield {'model.norm_position': position, 'optim.warmup_steps': warmup,
               'optim.learning_rate': rate}
  for warmup in (0, 500, 4000):
    yield {'model.norm_position': 'post', 'optim.warmup_steps': warmup, 'optim.learning_rate': 0.1,
           'optim.optimizer': 'sgd'}


def _warmup_cpu():
  for position in ('post', 'pre'):
    for warmup in (0, 50):
      yield {'model.norm_position': position, 'optim.warmup_steps': warmup}


def _converge():
  for position, warmups in (('post', (0, 1000, 4000)), ('pre', (0, 4000))):
    for warmup in warmups:
      for rate in (5e-4, 1e-3):
        yield {'model.norm_position': position, 'optim.warmup_steps': warmup,
               'optim.learning_rate': rate}
  # SGD with momentum 0.9 at converge_sgd's best rate for each placement, without warmup.
  for position, rate in (('post', 0.1), ('pre', 0.3)):
    yield {'model.norm_position': position, 'optim.warmup_steps': 0, 'optim.learning_rate': rate,
           'optim.optimizer': 'sgd'}


def _converge_sgd():
  for position in ('post', 'pre'):
    for rate in (0.1, 0.3, 1.0):
      yield {'model.norm_position': position, 'optim.warmup_steps': 0,
             'optim.learning_rate': rate, 'optim.optimizer': 'sgd'}


def _converge_key():
  for position in ('post', 'pre'):
    for warmup in (0, 4000):
      yield {'model.norm_position': position, 'optim.warmup_steps': warmup}


def _depth():
  for position in ('post', 'pre'):
    for layers in (3, 6, 12):
      yield {'model.norm_position': position, 'model.num_encoder_layers': layers,
             'model.num_decoder_layers': layers}


def _norm():
  for norm in ('layer', 'rms', 'batch', 'scale'):
    yield {'model.norm': norm}


def _position():
  for position in ('sinusoidal', 'learned', 'rope', 'none'):
    yield {'model.position': position}


# Each preset's grid; the *_cpu presets shorten the runs, not the grid.
_GRIDS = {'warmup': _warmup, 'depth': _depth, 'norm': _norm, 'position': _position,
          'warmup_cpu': _warmup_cpu, 'norm_cpu': _norm, 'position_cpu': _position,
          'converge': _converge, 'converge_key': _converge_key, 'converge_sgd': _converge_sgd}
PRESETS = tuple(_GRIDS)


def seeds(preset: str = 'warmup') -> int:
  """Seeds per point: three for the converge presets, whose claims need their spread."""
  return 3 if preset in ('converge', 'converge_key') else 1


def sweep(preset: str = 'warmup'):
  """Override dicts of the preset's runs (scripts/sweep.py names and launches them)."""
  _check(preset)
  return _GRIDS[preset]()
