"""Seeds trained together (training/members.py): each member trains as it would alone."""

import json
import logging
import os

import jax
import numpy as np
import pytest

from tests.test_train import params_equal_bitwise, read_jsonl, smoke_config
from training import members, trainer

SEEDS = [0, 1]


def members_config(data_cache, **train):
  """Packed rows with longer pairs in buckets of their own, so that the two seeds' data orders
  meet steps where their batches differ in shape (trained member by member) and steps where they
  agree (trained vmapped)."""
  config = smoke_config(data_cache, num_steps=20, log_every=5, eval_every=10, checkpoint_every=10,
                        **train)
  config.data.update(pack_length=16, eval_examples=8)
  return config


def max_relative_difference(a, b) -> float:
  """Over the leaves of two like trees, max |a - b| / max |b|, leaving out the key projections'
  biases: softmax is invariant to a shift common to one query's logits, so their gradient is 0
  but for rounding noise, and Adam's normalised steps turn any difference in that noise into
  differences of their own size."""
  differences = []
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    if "['key']['bias']" not in jax.tree_util.keystr(path):
      differences.append(float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30)))
  return max(differences)


@pytest.fixture(scope='module')
def alone_and_together(tmp_path_factory, data_cache):
  root = tmp_path_factory.mktemp('members')
  alone = {}
  for seed in SEEDS:
    config = members_config(data_cache, seed=seed)
    alone[seed] = trainer.train_and_evaluate(config, str(root / f'alone_{seed}'))
  handler, root_logger = _Captured(), logging.getLogger()
  level = root_logger.level
  root_logger.addHandler(handler)
  root_logger.setLevel(logging.INFO)
  try:
    together = members.train_seeds_together(members_config(data_cache), [
        str(root / f'together_{seed}') for seed in SEEDS], SEEDS)
  finally:
    root_logger.removeHandler(handler)
    root_logger.setLevel(level)
  return root, alone, dict(zip(SEEDS, together)), handler.text


class _Captured(logging.Handler):
  def __init__(self):
    super().__init__(logging.INFO)
    self.text = ''

  def emit(self, record):
    self.text += record.getMessage() + '\n'


def test_each_member_trains_as_the_same_seed_alone(alone_and_together):
  """Both dispatches ran (vmapped over the members, and one member where their shapes differ);
  after 20 steps each member's parameters are its lone run's to float32 rounding: a batched
  product sums in another order than a single one, and 20 Adam steps carry that on."""
  root, alone, together, log = alone_and_together
  assert "batch shape ('seeds', 2," in log and "batch shape ('one seed'," in log
  for seed in SEEDS:
    assert int(together[seed].step) == 20
    assert max_relative_difference(together[seed].params, alone[seed].params) < 1e-4
    assert max_relative_difference(together[seed].opt_state, alone[seed].opt_state) < 1e-3
    # Seeds differ: the members are not one run twice.
    assert max_relative_difference(together[seed].params, alone[1 - seed].params) > 1e-2


def test_each_member_writes_an_ordinary_run_folder(alone_and_together):
  """Its own config (its seed), records on the same steps with its lone run's losses, its
  checkpoints and a finished status: sweep.py, report.py and eval.py read it as any run."""
  root, _, _, _ = alone_and_together
  for seed in SEEDS:
    folder, lone = root / f'together_{seed}', root / f'alone_{seed}'
    assert json.loads((folder / 'config.json').read_text())['train']['seed'] == seed
    assert json.loads((folder / 'status.json').read_text())['state'] == 'finished'
    assert sorted(os.listdir(folder / 'checkpoints')) == ['10', '20']
    records, expected = read_jsonl(folder / 'metrics.jsonl'), read_jsonl(lone / 'metrics.jsonl')
    assert [(r['step'], sorted(r)) for r in records] == [(r['step'], sorted(r)) for r in expected]
    for record, lone_record in zip(records, expected):
      for name in ('train_loss', 'grad_norm', 'eval_loss', 'learning_rate'):
        if name in record:
          assert record[name] == pytest.approx(lone_record[name], rel=1e-4), (seed, name)
      if 'epoch' in record:
        assert record['epoch'] == lone_record['epoch']


def test_members_stopped_and_resumed_end_bitwise_where_the_uninterrupted_group_did(
    alone_and_together, tmp_path, data_cache):
  root, _, together, _ = alone_and_together
  workdirs = [str(tmp_path / f'seed_{seed}') for seed in SEEDS]
  members.train_seeds_together(members_config(data_cache), workdirs, SEEDS, stop_after_steps=13)
  for workdir in workdirs:
    assert json.load(open(os.path.join(workdir, 'status.json')))['state'] == 'running'
  resumed = members.train_seeds_together(members_config(data_cache), workdirs, SEEDS)
  for seed, state in zip(SEEDS, resumed):
    assert params_equal_bitwise(state.params, together[seed].params)
    assert params_equal_bitwise(state.opt_state, together[seed].opt_state)
    records = read_jsonl(os.path.join(workdirs[seed], 'metrics.jsonl'))
    expected = read_jsonl(root / f'together_{seed}' / 'metrics.jsonl')
    assert [r.get('train_loss') for r in records] == [r.get('train_loss') for r in expected]


@pytest.mark.parametrize('field, value, message', [
    ('train.time_budget_minutes', 5.0, 'config.train.time_budget_minutes: seeds trained together'),
    ('train.num_epochs', 2, 'config.train.num_epochs: seeds trained together need train.num_steps'),
])
def test_a_group_that_cannot_train_as_one_program_is_refused_before_anything_is_written(
    tmp_path, data_cache, field, value, message):
  config = members_config(data_cache)
  section, name = field.split('.')
  config[section][name] = value
  workdirs = [str(tmp_path / 'a'), str(tmp_path / 'b')]
  with pytest.raises(ValueError, match=message):
    members.train_seeds_together(config, workdirs, SEEDS)
  assert not any(os.path.exists(workdir) for workdir in workdirs)
  with pytest.raises(ValueError, match='at least 2'):
    members.train_seeds_together(members_config(data_cache), workdirs[:1], [0])


def test_member_workdirs_fill_the_seed_in_or_add_a_folder_per_seed():
  assert members.member_workdirs('runs/post,seed={seed}', [0, 2]) == ['runs/post,seed=0',
                                                                      'runs/post,seed=2']
  assert members.member_workdirs('runs/post/', [1]) == ['runs/post/seed=1']


def test_groups_of_steps_per_dispatch_train_the_members_bitwise_as_single_steps(
    alone_and_together, tmp_path, data_cache):
  """train.steps_per_call 4: a lax.scan over [M, 4, B, ...] where all eight batches share a shape,
  single vmapped or lone-member steps elsewhere; the same sums in the same order."""
  _, _, together, _ = alone_and_together
  grouped = members.train_seeds_together(members_config(data_cache, steps_per_call=4), [
      str(tmp_path / f'seed_{seed}') for seed in SEEDS], SEEDS)
  for seed, state in zip(SEEDS, grouped):
    assert params_equal_bitwise(state.params, together[seed].params)


def test_a_member_that_diverges_stops_alone_and_the_others_train_on(
    alone_and_together, tmp_path, data_cache):
  """A loss ceiling between the seeds' first records (7.51 for seed 0, 7.29 for seed 1) stops
  seed 0 at step 5; seed 1 trains to the end, as it does alone."""
  _, alone, _, _ = alone_and_together
  config = members_config(data_cache, divergence_loss_ceiling=7.4)
  workdirs = [str(tmp_path / f'seed_{seed}') for seed in SEEDS]
  [survivor] = members.train_seeds_together(config, workdirs, SEEDS)
  diverged = json.load(open(os.path.join(workdirs[0], 'status.json')))
  assert (diverged['state'], diverged['step']) == ('diverged', 5)
  assert json.load(open(os.path.join(workdirs[1], 'status.json')))['state'] == 'finished'
  assert max_relative_difference(survivor.params, alone[1].params) < 1e-4
