"""Keeps a trained model loaded and translates each line of stdin as it arrives.

  python -m scripts.translate --workdir=runs/m30k
  python -m scripts.translate --workdir=runs/m30k --checkpoint=avg:5 --beam_size=5 --nbest=3

--checkpoint and the search's flags are eval.py's.

Loads the run once (config.json, its vocabularies, the checkpoint) and writes each line's
translation to stdout as soon as the line is read, flushed, so it can sit behind a pipe or a
program that writes a line and waits for its answer. With --nbest=N each line gives N rows
`LINE<TAB>SCORE<TAB>TRANSLATION`, as eval.py --input does; an empty line gives an empty
translation (N of them). A line that is not UTF-8 or too long for the model gets an empty
translation and one line on stderr, and the rest go on. The first line of each new length (sources
padded to 8 tokens) compiles its search; JAX's compilation cache keeps those programs for the
translator's next start.
"""

import sys
import time

from absl import app, flags
import jax

from data import datasets
from evaluation import trained_model
from evaluation.line_translator import LineTranslator, write_translations
from training import command_line, partitioning, run_dir, run_log
import eval as eval_lib

# --workdir, --checkpoint, --nbest and the search's flags, as eval.py has them (listed by --help).
eval_lib.define_decoding_flags()
flags.adopt_module_key_flags(eval_lib)
TIMES = flags.DEFINE_bool('times', False, 'Write the load time and each line\'s latency to stderr.')


def main(argv) -> None:
  del argv
  start = time.perf_counter()
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  args = flags.FLAGS
  try:
    config = trained_model.load_config(args.workdir)
    # One sentence at a time: a single device does it without splitting a batch.
    eval_lib.use_cpu_devices(1, 1)
    jax.config.update('jax_compilation_cache_dir', str(datasets.compilation_cache_dir(config.data)))
    mesh = partitioning.make_mesh()
    run = trained_model.restore(args.workdir, None, args.checkpoint, mesh)
    settings, batch_size = eval_lib.decoding_settings(
        run.config, eval_lib.search_flag_settings(args), jax.device_count())
    translator = LineTranslator(run, settings, batch_size, args.nbest, mesh)
  except ValueError as error:
    raise SystemExit(f'translate: {command_line.one_line_error(error)}') from None
  except OSError as error:
    raise SystemExit(f'translate: {run_dir.os_error_line(error)}') from None
  if TIMES.value:
    print(f'loaded in {time.perf_counter() - start:.1f} s', file=sys.stderr, flush=True)
  for number, raw in enumerate(sys.stdin.buffer, start=1):
    line_start = time.perf_counter()
    try:
      results = translator([_decoded(raw, number)], first_number=number)
    except ValueError as error:
      print(f'translate: {error}', file=sys.stderr, flush=True)
      results = [[(0.0, '')] * args.nbest]
    write_translations(results, args.nbest, sys.stdout, first_number=number)
    sys.stdout.flush()
    if TIMES.value:
      print(f'line {number}: {time.perf_counter() - line_start:.3f} s', file=sys.stderr, flush=True)


def _decoded(raw: bytes, number: int) -> str:
  """Line `number` as text without its line break, or a ValueError naming it."""
  try:
    return raw.rstrip(b'\r\n').decode('utf-8')
  except UnicodeDecodeError as error:
    raise ValueError(f'line {number} is not valid UTF-8 ({error.reason} at byte {error.start})') from None


if __name__ == '__main__':
  app.run(main, flags_parser=command_line.parse_flags)
