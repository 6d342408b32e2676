"""A budgeted run's plans through the run: the first at warmup's end, later ones from the steps
timed since, the early end, and the records a resumed run reads them back from."""

import pytest

from training import time_budget
from training.time_budget import BudgetPlan
from training.optimizer import RunLength

COSTS = time_budget.Costs(step_seconds=0.5, eval_seconds=20.0, save_seconds=2.0)
INTERVALS = dict(max_steps=20_000, eval_every=1000, checkpoint_every=500)


def new_plan():
  return BudgetPlan(budget_seconds=3600.0, **INTERVALS)


def expected_end(step_seconds, *, step, elapsed, eval_seconds=20.0, save_seconds=2.0):
  return time_budget.plan_length(
      time_budget.Costs(step_seconds, eval_seconds, save_seconds), budget_seconds=3600.0,
      elapsed_seconds=elapsed, step=step, **INTERVALS)


def test_later_plans_follow_the_step_time_measured_since_the_last_one():
  plan = new_plan()
  # Warmup's second half: steps 200-400 in 130 s of clock, 30 s of it paused (compiling).
  plan.start_timing(200, clock=1000.0, paused=5.0)
  assert plan.plan(400, clock=1130.0, paused=35.0, elapsed_seconds=330.0, eval_seconds=20.0,
                   save_seconds=2.0) is None
  first = expected_end(0.5, step=400, elapsed=330.0)
  assert plan.costs.step_seconds == 0.5
  assert plan.end_step == first and plan.length == RunLength.fixed(first)
  # Steps got faster (0.4 s): the next validation's plan ends later, and the schedule's rest from
  # there is stretched over the longer remainder.
  plan.start_timing(400, clock=1160.0, paused=57.0)
  assert plan.plan(1000, clock=1160.0 + 600 * 0.4 + 22.0, paused=79.0, elapsed_seconds=600.0,
                   eval_seconds=20.0, save_seconds=2.0) == first
  longer = expected_end(0.4, step=1000, elapsed=600.0)
  assert plan.costs.step_seconds == pytest.approx(0.4)
  assert longer > first and plan.end_step == longer
  assert plan.length == RunLength(first, 1000, 1000.0, longer)
  # Then slower (0.6 s): squeezed, from where the stretched schedule had got to.
  plan.start_timing(1000, clock=2000.0, paused=100.0)
  plan.plan(2000, clock=2600.0, paused=100.0, elapsed_seconds=1300.0, eval_seconds=20.0,
            save_seconds=2.0)
  shorter = expected_end(0.6, step=2000, elapsed=1300.0)
  assert shorter < longer and plan.end_step == shorter
  position = 1000 + 1000 * (first - 1000) / (longer - 1000)
  assert plan.length == pytest.approx(RunLength(first, 2000, position, shorter))
  # On time by the last plan at step 3000: the same end, and the schedule unchanged.
  length = plan.length
  on_time = 1300.0 + plan.seconds_left(2000) - plan.seconds_left(3000)
  plan.start_timing(2000, clock=3000.0, paused=100.0)
  assert plan.plan(3000, clock=3600.0, paused=100.0, elapsed_seconds=on_time, eval_seconds=20.0,
                   save_seconds=2.0) == shorter
  assert plan.end_step == shorter and plan.length == length


def test_a_plan_is_read_back_from_the_records_and_older_records_still_read():
  plan = new_plan()
  plan.start_timing(200, clock=0.0, paused=0.0)
  plan.plan(400, clock=100.0, paused=0.0, elapsed_seconds=300.0, eval_seconds=20.0, save_seconds=2.0)
  plan.start_timing(400, clock=200.0, paused=0.0)
  plan.plan(1000, clock=440.0, paused=0.0, elapsed_seconds=600.0, eval_seconds=20.0, save_seconds=2.0)
  records = [{'step': 300, 'train_loss': 3.0}, {'step': 1000, **plan.record(600.0)},
             {'step': 1050, 'train_loss': 2.0}]
  assert records[1]['planned_from_elapsed_seconds'] == 600.0
  resumed = new_plan()
  resumed.resume(records)
  assert (resumed.end_step, resumed.length, resumed.costs) == (plan.end_step, plan.length, plan.costs)
  # Cut short at step 1200: the run ends there, and its schedule stays the one it trained with.
  plan.cut_short(1200)
  resumed.resume(records + [{'step': 1200, **plan.record(3590.0)}])
  assert (resumed.end_step, resumed.length) == (1200, plan.length)
  # No plan in the records: none taken.
  unplanned = new_plan()
  unplanned.resume(records[:1])
  assert not unplanned.planned and unplanned.end_step is None
  # The first format: no schedule fields (the planned length is the schedule's), and a
  # recompilation's seconds that plans no longer count.
  older = {'step': 400, 'planned_steps': 7777, 'planned_from_elapsed_seconds': 12.5,
           'planned_from_step_seconds': 0.5, 'planned_from_eval_seconds': 20.0,
           'planned_from_save_seconds': 2.0, 'planned_from_compile_seconds': 30.0}
  old = new_plan()
  old.resume([older])
  assert (old.end_step, old.length, old.costs) == (7777, RunLength.fixed(7777), COSTS)


def test_every_process_takes_process_0s_plan_as_float32_numbers():
  plan = new_plan()
  plan.resume([{'step': 1000, 'planned_steps': 4100, 'planned_from_elapsed_seconds': 600.0,
                'planned_from_step_seconds': 0.5, 'planned_from_eval_seconds': 20.0,
                'planned_from_save_seconds': 2.0, 'schedule_horizon': 3900,
                'schedule_revised_at': 1000, 'schedule_revised_from': 987.25,
                'schedule_last_step': 4100}])
  other = new_plan()  # another process, which reads no records
  sent = []

  def broadcast(values):  # process 0's values, as partitioning.agreed_numbers hands them out
    sent.append(tuple(values))
    return tuple(float(value) for value in sent[0])

  plan.agree(broadcast)
  other.agree(broadcast)
  assert (other.end_step, other.length) == (4100, RunLength(3900, 1000, 987.25, 4100))
  assert all(isinstance(value, int) for value in (other.end_step, *other.length[:2], other.length[3]))
  nothing = new_plan()
  nothing.agree(lambda values: values)
  assert not nothing.planned


def test_the_early_end_checks_the_latest_plans_costs_to_the_planned_end():
  plan = new_plan()
  plan.start_timing(200, clock=0.0, paused=0.0)
  plan.plan(400, clock=100.0, paused=0.0, elapsed_seconds=300.0, eval_seconds=20.0, save_seconds=2.0)
  plan.end_step = 420  # ten steps to the end from 410, fewer than a log interval of 50
  edge = 3600 - time_budget.UNTIMED_SECONDS - (10 * 0.5 + 20.0 + 2.0)
  assert not plan.must_end(410, edge, log_every=50)
  assert plan.must_end(410, edge + 0.1, log_every=50)
