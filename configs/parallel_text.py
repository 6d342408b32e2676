"""Your own parallel corpus: line-aligned train, validation and test files in two languages.

  python train.py --config=configs/parallel_text.py --workdir=runs/en_fr \
      --config.data.source_dir=~/corpus --config.data.source_lang=en --config.data.target_lang=fr
  python eval.py --workdir=runs/en_fr --split=test

config.data.source_dir holds train.SRC, train.TGT, validation.*, test.* (plain or .gz; see
data/parallel_text.py). The first run prepares the files once (ArrayRecord, under a fingerprint
of their contents) and trains the sentencepiece vocabulary; later runs, in either direction, reuse
both.

Presets (after the colon):
  'small' (default)  Multi30k De->En's recipe without its time budget (4+4 layers, d_model 128,
                     packed rows, cosine over 9600 steps): corpora of up to ~100k short pairs, on
                     a CPU.
  'base'             Vaswani et al.'s Transformer base (6+6, d_model 512, FFN 2048, 8 heads,
                     Post-LN, inverse square root after 4000 warmup steps, a joint 32k
                     vocabulary) in bfloat16, for WMT14-size corpora on an accelerator; 100k
                     steps of 25k-token batches are the paper's length.
"""

from configs import base, multi30k


def _base(config):
  """Vaswani et al. (2017)'s base model and schedule."""
  config.model.update(d_model=512, num_heads=8, d_ff=2048, num_encoder_layers=6,
                      num_decoder_layers=6, dropout_rate=0.1, norm_position='post',
                      dtype='bfloat16')
  config.optim.update(schedule='inverse_sqrt', learning_rate=7e-4, warmup_steps=4000)
  # ~25k tokens per step, as the paper's 8 GPUs of 3.1k source and target tokens each.
  config.data.update(vocab_size=32000, max_length=256, max_tokens=25000, pack_length=0)
  config.train.update(num_steps=100000, eval_every=5000, checkpoint_every=5000)
  config.eval.length_penalty = 0.6


_PRESETS = ('small', 'base')


def get_config(preset: str = 'small'):
  if preset not in _PRESETS:
    raise ValueError(f'configs/parallel_text.py preset {preset!r} is not one of: '
                     f'{", ".join(_PRESETS)}')
  config = multi30k.get_config('de_en')
  config.data.update(dataset='parallel_text', dataset_config='original')
  # Steps are the user's to set for their corpus: no time budget plans them away.
  config.train.time_budget_minutes = 0.0
  if preset == 'base':
    _base(config)
  return config
