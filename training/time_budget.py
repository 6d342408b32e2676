"""A run's length fitted to wall-clock minutes (config.train.time_budget_minutes).

How many steps fit an hour depends on the machine (the Multi30k presets' 9600 steps take 51 min on
one 2-core VM and ~1 h 45 min on another), and a schedule that decays to 0 on the last step
('cosine', 'linear') must know that step before it starts decaying. Warmup does not depend on the
run's length, so a budgeted run measures itself while it warms up and fixes its length when warmup
ends: it times the steps of the second half of warmup, then one validation (less the compiling
that later validations reuse, periodic_actions.CompileClock) and one checkpoint, and plans the most
steps whose training, validations and checkpoints end within the budget, less a reserve. The
length is an argument of the compiled step (training/stepping.py), so the planned schedule needs no
new compilation. num_steps / num_epochs stay the upper bound.

Step time drifts on a shared machine (epochs of one Xeon VM run took 91-141 s), so the run plans
again at every later validation, from the steps timed since, and between plans checks the clock at
every log step: it ends early, with its validation and checkpoint, where the next log step would
come too late (`must_stop`). `BudgetPlan` keeps the plans through the run: every plan is a
metrics record, so a resumed run goes on with the latest one.
"""

import dataclasses
import math
import time

from training.optimizer import RunLength

# What no clock of the loop sees, which the early end (`must_stop`) keeps back: the process's start-up
# before train_and_evaluate (imports, devices) and its exit after the last save.
UNTIMED_SECONDS = 30.0
# Kept back by the plan on top of UNTIMED_SECONDS, for what it does not time: batch shapes first met
# after the plan (compiled then) and small drift in step time. Without it any drift ended a run
# early: an 8-minute Xeon VM run 1.8% behind its steps was cut at step 550 of 585, its learning rate
# at 9% of the peak. Larger drift (6% and 12% on the Xeon VM, docs/results.md 7) is the early end's
# to catch; a reserve that large would cost every steadier machine minutes of training.
RESERVE_FRACTION = 0.03
# Fewest warmup steps to time: half of them are measured, after the first one's compilation.
MIN_WARMUP_STEPS = 20


@dataclasses.dataclass(frozen=True)
class Costs:
  """Measured seconds of the work left in a run."""
  step_seconds: float  # one training step, data included, compilation excluded
  eval_seconds: float  # one validation (loss and greedy BLEU), compilation excluded
  save_seconds: float  # one checkpoint, the part the loop waits for


def check(budget_minutes, warmup_steps: int) -> None:
  """Raises ValueError (one line) for a budget that is not a number >= 0 or a warmup too short to time."""
  if isinstance(budget_minutes, bool) or not isinstance(budget_minutes, (int, float)) or not (
      budget_minutes >= 0 and math.isfinite(budget_minutes)):
    raise ValueError(f'config.train.time_budget_minutes={budget_minutes!r} must be a number of '
                     'minutes >= 0 (0: no budget)')
  if budget_minutes and warmup_steps < MIN_WARMUP_STEPS:
    raise ValueError(f'config.train.time_budget_minutes={budget_minutes} needs config.optim.'
                     f'warmup_steps >= {MIN_WARMUP_STEPS} (it is {warmup_steps}): the run\'s length '
                     'is fitted to the budget from the steps timed during warmup')


def _count_multiples(every: int, after: int, upto: int) -> int:
  """How many multiples of `every` lie in (after, upto]."""
  return upto // every - after // every


def seconds_left(costs: Costs, *, step: int, last_step: int, eval_every: int,
                 checkpoint_every: int) -> float:
  """Seconds from the end of `step` to the end of a run whose last step is `last_step`.

  Every step costs the same; a validation and a checkpoint follow each multiple of eval_every
  and checkpoint_every, and the last step (train.py's loop).
  """
  def pauses(every):
    return _count_multiples(every, step, last_step) + (1 if last_step % every else 0)

  return ((last_step - step) * costs.step_seconds + pauses(eval_every) * costs.eval_seconds
          + pauses(checkpoint_every) * costs.save_seconds)


def reserve_seconds(budget_seconds: float) -> float:
  """What the plan keeps back: what the early end keeps back, and room to drift within the budget."""
  return UNTIMED_SECONDS + RESERVE_FRACTION * budget_seconds


def plan_length(costs: Costs, *, budget_seconds: float, elapsed_seconds: float, step: int,
                max_steps: int, eval_every: int, checkpoint_every: int) -> int:
  """The most steps, at most `max_steps`, whose run ends within the budget less its reserve.

  At least step + 1: a schedule that decays to 0 needs a step after warmup, so a budget already
  spent still gets one (the console's plan line then shows an end past the budget).
  """
  if max_steps <= step:
    raise ValueError(f'max_steps={max_steps} leaves nothing to plan after step {step}')
  available = budget_seconds - reserve_seconds(budget_seconds) - elapsed_seconds
  fits = lambda last_step: seconds_left(costs, step=step, last_step=last_step, eval_every=eval_every,
                                        checkpoint_every=checkpoint_every) <= available
  low, high = step + 1, max_steps  # seconds_left grows with last_step: bisect for the last fit
  if not fits(low):
    return low
  while low < high:
    middle = (low + high + 1) // 2
    low, high = (middle, high) if fits(middle) else (low, middle - 1)
  return low


def must_stop(costs: Costs, *, budget_seconds: float, elapsed_seconds: float,
              steps_to_next_check: int) -> bool:
  """Whether a run behind its plan ends now: the next check (or the planned end, if nearer), then a
  validation and a checkpoint, would end past the budget (less what the loop's clock does not see)."""
  return (elapsed_seconds + steps_to_next_check * costs.step_seconds + costs.eval_seconds
          + costs.save_seconds) > budget_seconds - UNTIMED_SECONDS


# Fewest steps a later plan is made from: a run resumed just before a validation keeps its plan.
MIN_TIMED_STEPS = 10

_COSTS_PREFIX = 'planned_from_'
_LENGTH_PREFIX = 'schedule_'


@dataclasses.dataclass
class BudgetPlan:
  """The latest plan of a run under `budget_seconds`, and where its step timing began."""
  budget_seconds: float
  max_steps: int  # num_steps / num_epochs: no plan goes past it
  eval_every: int
  checkpoint_every: int
  length: RunLength | None = None  # the schedule's length, once planned
  end_step: int | None = None  # where the run ends: length.last_step, or earlier once cut short
  costs: Costs | None = None  # what the latest plan measured
  mark: tuple[int, float, float] | None = None  # (step, clock, paused seconds) where timing began

  @classmethod
  def of(cls, train_config, max_steps: int) -> 'BudgetPlan':
    """Not yet planned, for config.train's budget and intervals."""
    return cls(budget_seconds=train_config.time_budget_minutes * 60, max_steps=max_steps,
               eval_every=train_config.eval_every, checkpoint_every=train_config.checkpoint_every)

  @property
  def planned(self) -> bool:
    return self.length is not None

  def start_timing(self, step: int, clock: float, paused: float) -> None:
    """Times the steps from `step` on; `paused` is the loop's running total of untimed seconds."""
    self.mark = (step, clock, paused)

  def timed_steps(self, step: int) -> int:
    return step - self.mark[0] if self.mark else 0

  def plan(self, step: int, *, clock: float, paused: float, elapsed_seconds: float,
           eval_seconds: float, save_seconds: float, agree=int) -> int | None:
    """Plans the run's end from the steps timed up to `clock`; returns the end planned before.

    The first plan makes the schedule's length; a later one revises it from `step`. `agree` makes
    every process take process 0's plan (partitioning.agreed).
    """
    mark_step, mark_clock, mark_paused = self.mark
    costs = Costs(
        step_seconds=(clock - mark_clock - (paused - mark_paused)) / (step - mark_step),
        eval_seconds=eval_seconds, save_seconds=save_seconds)
    last_step = agree(plan_length(
        costs, budget_seconds=self.budget_seconds, elapsed_seconds=elapsed_seconds, step=step,
        max_steps=self.max_steps, eval_every=self.eval_every,
        checkpoint_every=self.checkpoint_every))
    before = self.end_step
    if self.length is None:
      self.length = RunLength.fixed(last_step)
    elif last_step != self.length.last_step:
      self.length = self.length.revised(step, last_step)
    self.end_step, self.costs = last_step, costs
    return before

  def agree(self, agree_numbers) -> None:
    """Takes process 0's plan on every process (partitioning.agreed_numbers): the end and the
    schedule's length, which every process's compiled step takes; the costs only process 0 uses."""
    end, *length = agree_numbers((self.end_step or 0, *(self.length or RunLength(0, 0, 0, 0))))
    if end:
      horizon, revised_at, revised_from, last_step = length
      self.end_step = int(end)
      self.length = RunLength(int(horizon), int(revised_at), revised_from, int(last_step))

  def seconds_left(self, step: int) -> float:
    """The latest plan's estimate of the seconds from the end of `step` to the end of the run."""
    return seconds_left(self.costs, step=step, last_step=self.end_step, eval_every=self.eval_every,
                        checkpoint_every=self.checkpoint_every)

  def must_end(self, step: int, elapsed_seconds: float, log_every: int) -> bool:
    """Whether the run ends at this log step, behind its plan (must_stop)."""
    return must_stop(self.costs, budget_seconds=self.budget_seconds, elapsed_seconds=elapsed_seconds,
                     steps_to_next_check=min(log_every, self.end_step - step))

  def cut_short(self, step: int) -> None:
    """Ends the run at `step`; its schedule stays as planned (a later invocation trains no further)."""
    self.end_step = step

  def record(self, elapsed_seconds: float) -> dict:
    """The metrics record of the latest plan: the end, the schedule's length, what it came from."""
    return {'planned_steps': self.end_step, f'{_COSTS_PREFIX}elapsed_seconds': elapsed_seconds,
            **{_COSTS_PREFIX + field.name: getattr(self.costs, field.name)
               for field in dataclasses.fields(Costs)},
            **{_LENGTH_PREFIX + name: value for name, value in self.length._asdict().items()}}

  def resume(self, records: list[dict]) -> None:
    """Takes up the latest plan in a run's earlier records (metrics.jsonl), if any.

    A plan record of the first format holds no schedule fields (its schedule's length is the
    planned one) and may hold a recompilation's seconds (`planned_from_compile_seconds`), which
    plans no longer count and this reads past.
    """
    for record in reversed(records):
      if 'planned_steps' in record:
        self.end_step = record['planned_steps']
        self.costs = Costs(**{field.name: record[_COSTS_PREFIX + field.name]
                              for field in dataclasses.fields(Costs)})
        if _LENGTH_PREFIX + 'horizon' in record:
          self.length = RunLength(**{name: record[_LENGTH_PREFIX + name] for name in RunLength._fields})
        else:
          self.length = RunLength.fixed(self.end_step)
        return


class BudgetKeeper:
  """The training loop's side of a budgeted run: when it times its steps, plans, and ends early.

  - The first plan is made at the end of warmup (`plan_at`), from the steps timed since its middle,
    after that step's validation and checkpoint (the loop runs both there, to time them).
  - A later plan follows each validation once MIN_TIMED_STEPS steps were timed since the last.
  - Between plans, every log step checks that the next one still fits (`ends_early`).
  A run without a budget has no plan: every method then does nothing.
  """

  def __init__(self, plan: BudgetPlan, *, budget_minutes: float, warmup_steps: int, log_every: int,
               start_step: int, writer, say, is_primary: bool, agreed):
    self.plan, self._budget_minutes, self._log_every = plan, budget_minutes, log_every
    self._writer, self._say, self._is_primary, self._agreed = writer, say, is_primary, agreed
    unplanned = budget_minutes and not plan.planned
    # The step whose end fixes a budgeted run's length: the end of warmup, timed from its middle.
    self.plan_at = (warmup_steps if unplanned and start_step < warmup_steps < plan.max_steps
                    else None)
    if unplanned and start_step >= warmup_steps and plan.max_steps > warmup_steps:
      say(f'train.time_budget_minutes={budget_minutes}: no length was planned before step '
          f'{start_step} (the end of warmup, {warmup_steps}), so the run goes on to step '
          f'{plan.max_steps}')

  def start(self, step: int, paused: float) -> None:
    """Before the loop: times the steps from here if warmup's second half or a plan has begun."""
    if (self.plan_at and step >= self.plan_at // 2) or self.plan.planned:
      self.plan.start_timing(step, time.perf_counter(), paused)

  def ends_early(self, progress, clock, schedule) -> None:
    """At a log step between plans: where the run is behind its plan, makes this step its last,
    and says and records so."""
    step = progress.step
    if not self.plan.planned or step % self._log_every or progress.at_end:
      return
    elapsed = clock.run_seconds()
    if not self._agreed(self._is_primary and self.plan.must_end(step, elapsed, self._log_every)):
      return
    self._say(f'time budget {self._budget_minutes} min: behind the plan, so the run ends at step '
              f'{step} instead of {progress.total_steps}, its learning rate at '
              f'{schedule.learning_rate(step):.3g}')
    # The plan, cut short: a later invocation of the finished run resumes to this step, no further.
    self.plan.cut_short(step)
    if self._is_primary:
      self._writer.write(step, self.plan.record(elapsed))
    progress.total_steps = step

  def after_report(self, step: int, paused: float) -> None:
    """Starts timing warmup's steps at its middle."""
    if self.plan.mark is None and self.plan_at and step == self.plan_at // 2:
      self.plan.start_timing(step, time.perf_counter(), paused)

  def replans_after(self, progress, validated: bool) -> bool:
    """Whether the validation just run is followed by a later plan."""
    return (self.plan.planned and validated and not progress.at_end
            and self.plan.timed_steps(progress.step) >= MIN_TIMED_STEPS)

  def make_plan(self, step: int, *, clock: float, paused: float, elapsed_seconds: float,
                eval_seconds: float, save_seconds: float, extra: dict | None = None) -> bool:
    """Plans the run's end at `step` from the steps timed up to `clock`, then records and says it;
    returns whether the end moved."""
    before = self.plan.plan(step, clock=clock, paused=paused, elapsed_seconds=elapsed_seconds,
                            eval_seconds=eval_seconds, save_seconds=save_seconds,
                            agree=self._agreed)
    extra = extra or {}
    self._writer.write(step, {**self.plan.record(elapsed_seconds), **extra})
    line = describe_plan(self.plan, step, budget_minutes=self._budget_minutes,
                         elapsed_seconds=elapsed_seconds, before=before,
                         eval_compile_seconds=extra.get('eval_compile_seconds', 0.0))
    if line:
      self._say(line)
    return self.plan.end_step != before


def describe_plan(plan: BudgetPlan, step: int, *, budget_minutes: float, elapsed_seconds: float,
                  before: int | None, eval_compile_seconds: float = 0.0) -> str | None:
  """The console's line for a budgeted run's plan at `step`: the first (before None), or a later
  one that moved the end from `before`; None for a later one that kept it."""
  costs, end = plan.costs, plan.end_step
  spent = f'time budget {budget_minutes} min: {elapsed_seconds / 60:.1f} min spent by step {step}'
  ends = f'after ~{(elapsed_seconds + plan.seconds_left(step)) / 60:.1f} min'
  if before is None:
    return (f'{spent}; a step takes {costs.step_seconds:.3f} s, a validation '
            f'{costs.eval_seconds:.1f} s (the first also compiled for {eval_compile_seconds:.1f} s), '
            f'a checkpoint {costs.save_seconds:.1f} s: the run ends at step {end} of at most '
            f'{plan.max_steps}, {ends}')
  if end == before:
    return None
  return (f'{spent}; steps took {costs.step_seconds:.3f} s since the last plan, so the run ends at '
          f'step {end} instead of {before}, {ends}; the rest of the schedule is '
          f'{"stretched" if end > before else "squeezed"} to end there')
