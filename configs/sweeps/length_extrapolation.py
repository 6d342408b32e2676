"""Train short, test long (Press et al. 2022): which position scheme carries a model past the
sentence lengths it was trained on?

  python -m scripts.sweep configs/sweeps/length_extrapolation.py:cpu --workdir=runs/length
  python -m scripts.length_extrapolation runs/length --splits=validation,test_2016

Every run trains only on Multi30k De->En pairs whose German source has at most 10 words
(data.train_max_source_words; 14,447 of the 29,000 pairs) and is scored on whole splits by source
length (1-5, 6-10, 11-15, 16-20, 21+ words): loss per target token of the reference, and greedy BLEU.
Grid: positions sinusoidal, learned, rope, alibi and none, 3 seeds each (seeds()): 15 runs.

Learned positions: the table has max_position (1024) rows; rows past the longest training
sentence are never trained and keep their random initial values (see
model/position.py). That is the defined behaviour a learned table offers beyond the trained
length; it is what this experiment measures, not something to guard against.

Presets:
  cpu   (default) Pre-LN 3+3 layers, d_model 128, 4 heads, FFN 512, dropout 0.1, ~2,000-token
        batches packed into rows of 32, 600 steps (~8 epochs of the short pairs), Adam 1e-3 with
        100 warmup steps then inverse square root: ~7 min a run on the 2-core VM.
  full  d_model 256 (FFN 1024), 4,096-token batches, 3,000 steps, for an accelerator.
  cpu_all_lengths  the cpu preset trained on all 29,000 pairs: the reference that tells a scheme's
        failure to extrapolate apart from long sentences simply being harder to translate.
"""

from configs import multi30k

POSITIONS = ('sinusoidal', 'learned', 'rope', 'alibi', 'none')
PRESETS = ('cpu', 'full', 'cpu_all_lengths')


def _check(preset: str) -> None:
  if preset not in PRESETS:
    raise ValueError(f'configs/sweeps/length_extrapolation.py preset {preset!r} is not one of: '
                     f'{", ".join(PRESETS)}')


def get_config(preset: str = 'cpu'):
  _check(preset)
  config = multi30k.get_config('de_en_small')
  config.data.train_max_source_words = 10
  config.model.update(d_model=128, num_heads=4, d_ff=512, num_encoder_layers=3,
                      num_decoder_layers=3, dropout_rate=0.1, norm_position='pre')
  config.optim.update(optimizer='adam', learning_rate=1e-3, schedule='inverse_sqrt', warmup_steps=100)
  # Most short pairs fit rows of 32 tokens; the few longer ones keep their buckets.
  config.data.update(pack_length=32, max_tokens=2048, eval_examples=256)
  config.train.update(num_steps=600, log_every=50, eval_every=300, checkpoint_every=300,
                      keep_checkpoints=1)
  if preset == 'full':
    config.model.update(d_model=256, d_ff=1024)
    config.data.update(max_tokens=4096, eval_examples=0)
    config.train.update(num_steps=3000, eval_every=1000, checkpoint_every=1000)
  if preset == 'cpu_all_lengths':
    config.data.train_max_source_words = 0  # no limit
  return config


def sweep(preset: str = 'cpu'):
  _check(preset)
  for position in POSITIONS:
    yield {'model.position': position}


def seeds(preset: str = 'cpu') -> int:
  _check(preset)
  return 3
