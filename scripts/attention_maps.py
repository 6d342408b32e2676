"""Cross-attention maps of a trained model: which source subwords each target subword attends to.

  python -m scripts.attention_maps --workdir=runs/m30k --sentence="Ein Mann fährt Fahrrad."
  python -m scripts.attention_maps --workdir=runs/m30k --split=test_2016 --index=7 --heads

The model translates the sentence (beam search as config.eval, or --beam_size), then reads its
own translation teacher-forced, and the cross-attention weights of that pass are drawn: one
PNG per decoder layer, OUT_DIR/layer_<i>.png, a row per target subword (the step producing it,
EOS last), a column per source subword (EOS last), heads averaged; with --heads, a grid of every
head instead.
OUT_DIR (--out_dir) defaults to WORKDIR/attention.
"""

import io

from absl import app, flags
from etils import epath
import jax.numpy as jnp
from matplotlib.figure import Figure
import numpy as np

from data import datasets, tokenizer as tokenizer_lib
from model.translate import translate
from training import partitioning, run_log
from evaluation import trained_model

WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory of train.py.', required=True)
SENTENCE = flags.DEFINE_string('sentence', None, 'Source sentence to translate and draw.')
SPLIT = flags.DEFINE_string('split', None, 'Or a split of the run\'s dataset ...')
INDEX = flags.DEFINE_integer('index', 0, '... and the line (from 0) of its source to draw.', lower_bound=0)
CHECKPOINT = flags.DEFINE_string('checkpoint', 'last', "'last', 'best', a saved step, or 'avg:N'.")
BEAM_SIZE = flags.DEFINE_integer('beam_size', None, 'Beam width (default: config.eval.beam_size).',
                                 lower_bound=1)
HEADS = flags.DEFINE_bool('heads', False, 'Draw every head instead of their average.')
OUT_DIR = flags.DEFINE_string('out_dir', None, 'Folder of the PNGs (default: WORKDIR/attention).')
flags.mark_flags_as_mutual_exclusive(['sentence', 'split'], required=True)


def cross_attention(run: trained_model.Restored, source_ids: list[int], beam_size: int
                    ) -> tuple[list[int], list[np.ndarray]]:
  """The translation's ids (with EOS) and each decoder layer's weights [N, T, S] over it."""
  source = jnp.asarray([source_ids + [tokenizer_lib.EOS_ID]], jnp.int32)  # [1, S]
  translation = np.asarray(translate(run.model, run.variables, source, beam_size=beam_size,
                                     length_penalty=run.config.eval.length_penalty))[0]
  ends = np.flatnonzero(translation == tokenizer_lib.EOS_ID)
  target_ids = translation[:ends[0] + 1 if len(ends) else len(translation)].tolist()
  decoder_input = jnp.asarray([[tokenizer_lib.BOS_ID] + target_ids[:-1]], jnp.int32)  # [1, T]
  _, state = run.model.apply(run.variables, source, decoder_input, mutable=['intermediates'])
  layers = state['intermediates']
  weights = [np.asarray(layers[f'decoder_layer_{i}']['cross_attention']['attention_weights'][0][0])
             for i in range(run.model.config.num_decoder_layers)]  # [N, T, S] each
  return target_ids, weights


def draw(weights: np.ndarray, source: list[str], target: list[str], title: str, heads: bool) -> Figure:
  """Heatmaps of weights [N, T, S]: their mean over heads, or one panel per head."""
  panels = list(weights) if heads else [weights.mean(0)]
  columns = min(len(panels), 4)
  rows = -(-len(panels) // columns)
  size = (0.35 * len(source) + 1.5, 0.3 * len(target) + 1.2)
  figure = Figure(figsize=(size[0] * columns, size[1] * rows), layout='constrained')
  for i, panel in enumerate(panels):
    axes = figure.add_subplot(rows, columns, i + 1)
    axes.imshow(panel, cmap='viridis', vmin=0.0, vmax=1.0, aspect='auto')
    axes.set_xticks(range(len(source)), source, rotation=90, fontsize=8)
    axes.set_yticks(range(len(target)), target, fontsize=8)
    axes.set_title(f'{title}, head {i}' if heads else f'{title}, heads averaged', fontsize=9)
  return figure


def main(argv):
  del argv
  # What the script prints is its output; library INFO records go only where --verbosity asks.
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  mesh = partitioning.make_mesh()
  try:
    run = trained_model.restore(WORKDIR.value, SPLIT.value, CHECKPOINT.value, mesh)
    if SENTENCE.value is not None:
      sentence = SENTENCE.value
    else:
      sources = datasets.load_split_text(run.data, SPLIT.value).source
      if INDEX.value >= len(sources):
        raise ValueError(f'--index={INDEX.value}: {SPLIT.value} has {len(sources)} lines')
      sentence = sources[INDEX.value]
    if not sentence.strip():
      raise ValueError('the sentence is empty')
  except ValueError as error:
    raise SystemExit(f'attention_maps.py: {error}') from None
  source_ids = run.vocabularies.source.encode(sentence)
  target_ids, weights = cross_attention(run, source_ids, BEAM_SIZE.value or run.config.eval.beam_size)
  source = run.vocabularies.source.pieces(source_ids + [tokenizer_lib.EOS_ID])
  target = run.vocabularies.target.pieces(target_ids)
  out_dir = epath.Path(OUT_DIR.value or epath.Path(WORKDIR.value) / 'attention')
  out_dir.mkdir(parents=True, exist_ok=True)
  for layer, layer_weights in enumerate(weights):
    image = io.BytesIO()  # written whole, so that the run folder may be on object storage
    draw(layer_weights, source, target, f'decoder layer {layer}', HEADS.value).savefig(
        image, format='png', dpi=120)
    (out_dir / f'layer_{layer}.png').write_bytes(image.getvalue())
  print(f'{sentence}\n-> {run.vocabularies.target.decode(target_ids)}\n{len(weights)} maps in {out_dir}')


if __name__ == '__main__':
  app.run(main)
