"""Measures the training input pipeline: examples/s, tokens/s, batch shapes.

The data fields come from --config (configs/base.py by default) and its overrides. The raw
files come from config.data.source_dir, else $SEQ2SEQ_DATA_DIR/<dataset>, else a download;
preparing the dataset and training the tokenizer on first use are timed apart from the pipeline.

  python -m scripts.benchmark_data --config=configs/multi30k.py:de_en_small --config.data.max_tokens=4096 \
      --num_batches=2000
"""

import time

from absl import app, flags
import numpy as np

from data import datasets, pipeline
from data import vocabularies as vocabularies_lib
from training import command_line, run_log

# Only the config's data section is used.
command_line.define_config_flag('configs/base.py')
NUM_BATCHES = flags.DEFINE_integer('num_batches', 2000, 'Batches to time.', lower_bound=1)


def main(argv) -> None:
  del argv
  # What the script prints is its output; library INFO records go only where --verbosity asks.
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  config = datasets.resolve(command_line.config_from_flags().data)
  start = time.perf_counter()
  vocabularies = vocabularies_lib.get_vocabularies(config)
  print(f'tokenizers ({config.vocab_type}, {vocabularies.describe()}): '
        f'{time.perf_counter() - start:.2f} s (includes preparing the data '
        'and training on first use)')
  start = time.perf_counter()
  iterator = pipeline.make_train_iterator(config, vocabularies, seed=0)
  print(f'iterator: {time.perf_counter() - start:.2f} s, '
        f'{iterator.batches_per_epoch} batches per epoch, '
        f'{iterator.num_filtered} pairs over max_length={config.max_length}')

  examples = real_tokens = padded_tokens = 0
  shapes = set()
  start = time.perf_counter()
  for _ in range(NUM_BATCHES.value):
    batch = next(iterator)
    tokens = batch['encoder_input_tokens']
    if 'decoder_segment_ids' in batch:  # packed rows: a row's pairs are its segments 1..n
      examples += int(batch['decoder_segment_ids'].max(axis=1).sum())
    else:
      examples += int(np.sum(batch['example_index'] >= 0))
    real_tokens += int(np.count_nonzero(tokens) +
                       batch['decoder_target_weights'].sum())
    padded_tokens += 2 * tokens.size
    shapes.add(tokens.shape)
  seconds = time.perf_counter() - start

  print(f'{NUM_BATCHES.value} batches (max_tokens={config.max_tokens}) in '
        f'{seconds:.2f} s')
  print(f'examples/s: {examples / seconds:,.0f}')
  print(f'tokens/s (source + target, no padding): {real_tokens / seconds:,.0f}')
  print(f'padded tokens/s: {padded_tokens / seconds:,.0f} '
        f'({real_tokens / padded_tokens:.0%} of them real)')
  print(f'distinct batch shapes: {len(shapes)}: {sorted(shapes)}')


if __name__ == '__main__':
  app.run(main, flags_parser=command_line.parse_flags)
