"""Members trained together (training/members.py): each member trains as it would alone."""

import json
import logging
import os

import jax
import numpy as np
import pytest

from tests.test_train import params_equal_bitwise, read_jsonl, smoke_config, traced_events
from training import members, trainer

SEEDS = [0, 1]


def seeds(*values):
  """The members of train.py --seeds=VALUES."""
  return members.parse_members([str(value) for value in values], [])


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
    together = members.train_members(members_config(data_cache), [
        str(root / f'together_{seed}') for seed in SEEDS], seeds(*SEEDS))
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
  assert "batch shape ('members', 2," in log and "batch shape ('one member'," in log
  for seed in SEEDS:
    assert int(together[seed].step) == 20
    assert max_relative_difference(together[seed].params, alone[seed].params) < 1e-4
    assert max_relative_difference(together[seed].opt_state, alone[seed].opt_state) < 1e-3
    # Seeds differ: the members are not one run twice.
    assert max_relative_difference(together[seed].params, alone[1 - seed].params) > 1e-2


def test_members_of_other_peak_rates_and_warmups_train_as_those_runs_alone(
    alone_and_together, tmp_path, data_cache):
  """Peak rate and warmup are arguments of the compiled step: seed 0 with the config's (3e-3, 10
  warmup steps) beside seed 1 with 1e-3 and no warmup; each equals its run trained alone to the
  same float32 rounding as seeds alone, and records its own learning rates."""
  _, alone, _, _ = alone_and_together
  config = members_config(data_cache)
  group = [{'train.seed': '0', 'optim.learning_rate': '3e-3', 'optim.warmup_steps': '10'},
           {'train.seed': '1', 'optim.learning_rate': '1e-3', 'optim.warmup_steps': '0'}]
  workdirs = [str(tmp_path / 'member_0'), str(tmp_path / 'member_1')]
  together = members.train_members(config, workdirs, group)
  lone = trainer.train_and_evaluate(members.member_configs(config, group[1:])[0],
                                    str(tmp_path / 'alone_1'))
  assert max_relative_difference(together[0].params, alone[0].params) < 1e-4
  assert max_relative_difference(together[1].params, lone.params) < 1e-4
  assert max_relative_difference(together[1].opt_state, lone.opt_state) < 1e-3
  # The other rate and warmup made another run than seed 1's with the config's values.
  assert max_relative_difference(together[1].params, alone[1].params) > 1e-2
  rates = [[r['learning_rate'] for r in read_jsonl(os.path.join(folder, 'metrics.jsonl'))
            if 'learning_rate' in r] for folder in (*workdirs, str(tmp_path / 'alone_1'))]
  # The rate of the update that made step 5 (4 updates before it): warming up, 4 / 10 of the peak;
  # without warmup, inverse_sqrt's P / sqrt(4 + 1).
  assert rates[0][0] == pytest.approx(3e-3 * 4 / 10, rel=1e-6)
  assert rates[1][0] == pytest.approx(1e-3 / 5 ** 0.5, rel=1e-6)
  assert rates[1] == rates[2]
  assert json.loads((tmp_path / 'member_1' / 'config.json').read_text())['optim'][
      'learning_rate'] == 1e-3


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
  members.train_members(members_config(data_cache), workdirs, seeds(*SEEDS), stop_after_steps=13)
  for workdir in workdirs:
    assert json.load(open(os.path.join(workdir, 'status.json')))['state'] == 'running'
  resumed = members.train_members(members_config(data_cache), workdirs, seeds(*SEEDS))
  for seed, state in zip(SEEDS, resumed):
    assert params_equal_bitwise(state.params, together[seed].params)
    assert params_equal_bitwise(state.opt_state, together[seed].opt_state)
    records = read_jsonl(os.path.join(workdirs[seed], 'metrics.jsonl'))
    expected = read_jsonl(root / f'together_{seed}' / 'metrics.jsonl')
    assert [r.get('train_loss') for r in records] == [r.get('train_loss') for r in expected]


@pytest.mark.parametrize('field, value, message', [
    ('train.time_budget_minutes', 5.0, 'config.train.time_budget_minutes: members trained together'),
    ('train.num_epochs', 2, 'config.train.num_epochs: members trained together need train.num_steps'),
])
def test_a_group_that_cannot_train_as_one_program_is_refused_before_anything_is_written(
    tmp_path, data_cache, field, value, message):
  config = members_config(data_cache)
  section, name = field.split('.')
  config[section][name] = value
  workdirs = [str(tmp_path / 'a'), str(tmp_path / 'b')]
  with pytest.raises(ValueError, match=message):
    members.train_members(config, workdirs, seeds(*SEEDS))
  assert not any(os.path.exists(workdir) for workdir in workdirs)
  with pytest.raises(ValueError, match='at least 2'):
    members.train_members(members_config(data_cache), workdirs[:1], seeds(0))


def test_member_workdirs_fill_each_varied_field_in_or_add_a_folder_per_member():
  assert members.member_workdirs('runs/post,seed={seed}', seeds(0, 2)) == ['runs/post,seed=0',
                                                                           'runs/post,seed=2']
  assert members.member_workdirs('runs/post/', seeds(1, 3)) == ['runs/post/seed=1',
                                                                'runs/post/seed=3']
  group = members.parse_members(['0', '1'], ['optim.warmup_steps=0,4000',
                                             'optim.learning_rate=1e-3,1e-3'])
  assert members.member_workdirs('runs/w={optim.warmup_steps},s={seed}', group) == [
      'runs/w=0,s=0', 'runs/w=0,s=1', 'runs/w=4000,s=0', 'runs/w=4000,s=1']
  assert members.member_workdirs('runs', group)[2] == 'runs/warmup_steps=4000,seed=0'
  with pytest.raises(ValueError, match=r'in optim.warmup_steps, so it needs \{optim.warmup_steps\}'):
    members.member_workdirs('runs/s={seed}', group)


@pytest.mark.parametrize('seed_values, varied, message', [
    ([], ['optim.b1=0.8,0.9'], 'optim.b1 is not one of optim.learning_rate, optim.warmup_steps'),
    ([], ['optim.learning_rate'], 'expected KEY=V1,V2'),
    ([], ['optim.learning_rate=1e-3,5e-4', 'optim.warmup_steps=0'], 'must be equally long'),
    (['0'], ['train.seed=1,2'], '--seeds and --vary=train.seed both set the seeds'),
])
def test_bad_member_flags_are_refused_in_one_line(seed_values, varied, message):
  with pytest.raises(ValueError, match=message):
    members.parse_members(seed_values, varied)


def test_member_values_parse_as_their_fields_type(data_cache):
  config = members_config(data_cache)
  group = members.parse_members(['1'], ['optim.learning_rate=5e-4,2e-3', 'optim.warmup_steps=0,7'])
  parsed = [(c.train.seed, c.optim.learning_rate, c.optim.warmup_steps)
            for c in members.member_configs(config, group)]
  assert parsed == [(1, 5e-4, 0), (1, 2e-3, 7)]
  with pytest.raises(ValueError, match='optim.warmup_steps=1e3: expected a value of type int'):
    members.member_configs(config, members.parse_members([], ['optim.warmup_steps=0,1e3']))


def test_groups_of_steps_per_dispatch_train_the_members_bitwise_as_single_steps(
    alone_and_together, tmp_path, data_cache):
  """train.steps_per_call 4: a lax.scan over [M, 4, B, ...] where all eight batches share a shape,
  single vmapped or lone-member steps elsewhere; the same sums in the same order."""
  _, _, together, _ = alone_and_together
  grouped = members.train_members(members_config(data_cache, steps_per_call=4), [
      str(tmp_path / f'seed_{seed}') for seed in SEEDS], seeds(*SEEDS))
  for seed, state in zip(SEEDS, grouped):
    assert params_equal_bitwise(state.params, together[seed].params)


def test_a_member_that_diverges_stops_alone_and_the_others_train_on(
    alone_and_together, tmp_path, data_cache):
  """A loss ceiling between the seeds' first records (7.51 for seed 0, 7.29 for seed 1) stops
  seed 0 at step 5; seed 1 trains to the end, as it does alone."""
  _, alone, _, _ = alone_and_together
  config = members_config(data_cache, divergence_loss_ceiling=7.4)
  workdirs = [str(tmp_path / f'seed_{seed}') for seed in SEEDS]
  [survivor] = members.train_members(config, workdirs, seeds(*SEEDS))
  diverged = json.load(open(os.path.join(workdirs[0], 'status.json')))
  assert (diverged['state'], diverged['step']) == ('diverged', 5)
  assert json.load(open(os.path.join(workdirs[1], 'status.json')))['state'] == 'finished'
  assert max_relative_difference(survivor.params, alone[1].params) < 1e-4


def test_a_profiled_group_traces_into_its_first_members_folder_and_trains_unchanged(
    alone_and_together, tmp_path, data_cache):
  """One program trains the members: one trace, of steps 6-8, in the first member's folder."""
  _, _, together, _ = alone_and_together
  workdirs = [tmp_path / f'seed_{seed}' for seed in SEEDS]
  profiled = members.train_members(members_config(data_cache, profile_steps=3),
                                   [str(workdir) for workdir in workdirs], seeds(*SEEDS))
  for seed, state in zip(SEEDS, profiled):
    assert params_equal_bitwise(state.params, together[seed].params)
  calls = {event['name'] for event in traced_events(workdirs[0])}
  assert any(name.startswith('PjitFunction(') for name in calls)
  assert not (workdirs[1] / 'profile').exists()
