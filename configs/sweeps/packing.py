"""Does packing several pairs per row (data.pack_length) change what the tiny De->En recipe learns
from a fixed number of tokens? A faster batching is adopted only if validation loss after the same
tokens is no worse than one pair per row.

  python -m scripts.sweep configs/sweeps/packing.py --workdir=runs/packing
  python -m scripts.report runs/packing --colour_by=pack_length

Grid: pack_length 0 (one pair per row) and 32 (rows of 32
tokens, several pairs each, attention kept within a pair) at max_tokens 4096, and 32 again at
max_tokens 3520, 3 seeds each: 9 runs of `configs/multi30k.py:de_en` trained for the same number
of epochs, so every run sees each training pair the same number of times. Packed batches hold
more real tokens, so at the same max_tokens a packed epoch has fewer steps (128 against 150);
at 3520 it has 149, so that arm changes only how rows are filled, not how many steps an epoch
takes; `:de_en` and `:en_de` batch that way. Each run's cosine schedule spans its own steps.
Validation loss at the end. On the 2-core Zen 5 VM a packed run takes ~5 min and an unpacked one ~7.
"""

from configs import multi30k

# Epochs per run: past the 400 warmup steps (~3 epochs) and far enough down the cosine to rank.
EPOCHS = 6


def get_config():
  config = multi30k.get_config('de_en')
  # The batching the preset had before it packed: one pair per row, 4096 padded tokens per batch.
  config.data.update(pack_length=0, max_tokens=4096)
  # The same epochs for every run, not the preset's hour: a budget would cut slower runs short.
  config.train.update(num_steps=0, num_epochs=EPOCHS, eval_every=10_000, checkpoint_every=10_000,
                      keep_checkpoints=1, time_budget_minutes=0.0)
  return config


def sweep():
  """Override dicts of the grid (scripts/sweep.py repeats each over seeds())."""
  yield {'data.pack_length': 0}
  yield {'data.pack_length': 32}
  # Packed batches with as many real tokens as one pair per row at 4096: 149 steps per epoch.
  yield {'data.pack_length': 32, 'data.max_tokens': 3520}


def seeds() -> int:
  return 3
