"""Every shipped config validates and its model builds (shapes only), and presets are checked."""

import functools
from pathlib import Path
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from configs import base, iwslt14, multi30k, parallel_text, smoke
from configs.sweeps import packing, wu2021, xiong2020
from data import datasets
from model.transformer import Transformer
from training import config_checks, stepping
from training.optimizer import make_optimizer

REPO = Path(__file__).resolve().parents[1]

def _own_corpus(preset):
  config = parallel_text.get_config(preset)
  config.data.source_dir = '/corpus'  # read only when the data is prepared
  return config


CONFIGS = {
    'base': base.get_config,
    'smoke': smoke.get_config,
    'multi30k:de_en': lambda: multi30k.get_config('de_en'),
    'multi30k:en_de': lambda: multi30k.get_config('en_de'),
    'multi30k:de_en_small': lambda: multi30k.get_config('de_en_small'),
    'iwslt14:de_en': lambda: iwslt14.get_config('de_en'),
    **{f'parallel_text:{preset}': functools.partial(_own_corpus, preset) for preset in ('small', 'base')},
    'sweeps/packing': packing.get_config,
    'sweeps/wu2021': wu2021.get_config,
    **{f'sweeps/xiong2020:{preset}': functools.partial(xiong2020.get_config, preset)
       for preset in xiong2020.PRESETS},
}


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_config_validates_and_builds(name):
  config = CONFIGS[name]()
  config_checks.check_config(config)
  datasets.resolve(config.data)
  make_optimizer(config.optim, steps_per_epoch=100,
                 total_steps=stepping.RunSteps.of(config.train, 100).max_steps)
  model = Transformer.of(config.model, config.data.vocab_size)
  tokens = jnp.ones((2, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens, tokens))
  logits = jax.eval_shape(lambda v: model.apply(v, tokens, tokens), shapes)
  assert logits.shape == (2, 8, config.data.vocab_size) and logits.dtype == jnp.float32


def test_checking_a_config_starts_no_jax_backend():
  # eval.py checks the run's config and then chooses its CPU devices, which JAX allows only before
  # a backend starts; so checks, optimizers and schedules must not make arrays. Run in a fresh
  # process: this one's backend is long started.
  script = ('import jax._src.xla_bridge as xla_bridge\n'
            'from configs import multi30k\n'
            'from training import config_checks\n'
            'from training.optimizer import make_optimizer\n'
            'for preset in ("de_en", "en_de"):\n'
            '  config = multi30k.get_config(preset)\n'
            '  config_checks.check_config(config)\n'
            '  make_optimizer(config.optim, steps_per_epoch=100, total_steps=config.train.num_steps)\n'
            'print(xla_bridge.backends_are_initialized())\n')
  result = subprocess.run([sys.executable, '-c', script], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == 'False'


def test_wu2021_is_the_en_de_recipe_at_its_lengths_in_one_batch_shape():
  hour, long = multi30k.get_config('en_de'), wu2021.get_config()
  changed = {f'{section}.{key}' for section in hour for key in hour[section]
             if hour[section][key] != long[section][key]}
  assert changed == {'data.pack_length', 'train.num_steps', 'train.time_budget_minutes',
                     'train.eval_every', 'train.checkpoint_every', 'train.keep_checkpoints'}
  points = list(wu2021.sweep())
  assert [point['train.num_steps'] for point in points] == [28_800, 38_400]
  # Four validations a run, the last at its last step, as the hour recipe's 9,600 steps.
  assert all(point['train.num_steps'] == 4 * point['train.eval_every'] for point in points)
  assert hour.train.num_steps == 4 * hour.train.eval_every


def test_direction_presets():
  assert (multi30k.get_config('en_de').data.source_lang, multi30k.get_config('en_de').data.target_lang) == ('en', 'de')
  with pytest.raises(ValueError, match="configs/multi30k.py preset 'fr_en' is not one of: de_en, en_de"):
    multi30k.get_config('fr_en')


def test_every_base_field_has_a_comment_above_it():
  lines = open(base.__file__).read().splitlines()
  for i, line in enumerate(lines):
    stripped = line.strip()
    if '=' in stripped and stripped.split('=')[0].strip().count('.') == 1 and not stripped.startswith('#') \
        and 'ConfigDict' not in stripped:
      assert lines[i - 1].strip().startswith('#'), f'configs/base.py:{i + 1} has no comment: {stripped}'
