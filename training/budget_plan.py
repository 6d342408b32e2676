"""A budgeted run's length through the run (config.train.time_budget_minutes).

time_budget.py has the arithmetic; this is what the training loop keeps of it between steps.
- At the end of warmup the run plans its length from the steps timed in warmup's second half, one
  validation and one checkpoint, and its schedule is made for that length.
- At every later validation it plans again, from the steps timed since the last plan. A step time
  measured once, in warmup, can be off by 5-10% for the rest of a run on a shared VM: six minutes
  of an hour went unused, or the run was cut at a learning rate above 0 (docs/results.md 7). A new
  length moves the end of the schedule (optimizer.RunLength): the rest of the decay is stretched or
  squeezed to reach 0 at the new end, with no jump in the learning rate.
- At every log step between plans, the run ends early where the next log step would come too late
  (time_budget.must_stop).
Every plan is a metrics record, so a resumed run goes on with the latest one.
"""

import dataclasses

from training import time_budget
from training.optimizer import RunLength

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
  costs: time_budget.Costs | None = None  # what the latest plan measured
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
    every process take process 0's plan (training/process_group.agreed).
    """
    mark_step, mark_clock, mark_paused = self.mark
    costs = time_budget.Costs(
        step_seconds=(clock - mark_clock - (paused - mark_paused)) / (step - mark_step),
        eval_seconds=eval_seconds, save_seconds=save_seconds)
    last_step = agree(time_budget.plan_length(
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
    """Takes process 0's plan on every process (process_group.agreed_numbers): the end and the
    schedule's length, which every process's compiled step takes; the costs only process 0 uses."""
    end, *length = agree_numbers((self.end_step or 0, *(self.length or RunLength(0, 0, 0, 0))))
    if end:
      horizon, revised_at, revised_from, last_step = length
      self.end_step = int(end)
      self.length = RunLength(int(horizon), int(revised_at), revised_from, int(last_step))

  def seconds_left(self, step: int) -> float:
    """The latest plan's estimate of the seconds from the end of `step` to the end of the run."""
    return time_budget.seconds_left(self.costs, step=step, last_step=self.end_step,
                                    eval_every=self.eval_every,
                                    checkpoint_every=self.checkpoint_every)

  def must_end(self, step: int, elapsed_seconds: float, log_every: int) -> bool:
    """Whether the run ends at this log step, behind its plan (time_budget.must_stop)."""
    return time_budget.must_stop(self.costs, budget_seconds=self.budget_seconds,
                                 elapsed_seconds=elapsed_seconds,
                                 steps_to_next_check=min(log_every, self.end_step - step))

  def cut_short(self, step: int) -> None:
    """Ends the run at `step`; its schedule stays as planned (a later invocation trains no further)."""
    self.end_step = step

  def record(self, elapsed_seconds: float) -> dict:
    """The metrics record of the latest plan: the end, the schedule's length, what it came from."""
    return {'planned_steps': self.end_step, f'{_COSTS_PREFIX}elapsed_seconds': elapsed_seconds,
            **{_COSTS_PREFIX + field.name: getattr(self.costs, field.name)
               for field in dataclasses.fields(time_budget.Costs)},
            **{_LENGTH_PREFIX + name: value for name, value in self.length._asdict().items()}}

  def resume(self, records: list[dict]) -> None:
    """Takes up the latest plan in a run's earlier records (metrics.jsonl), if any.

    Records written before plans were revised (2026-11-27) hold no schedule fields: their length is
    the planned one. Older ones also hold the recompilation's seconds that plans used to count
    (`planned_from_compile_seconds`), read past here.
    """
    for record in reversed(records):
      if 'planned_steps' in record:
        self.end_step = record['planned_steps']
        self.costs = time_budget.Costs(**{field.name: record[_COSTS_PREFIX + field.name]
                                          for field in dataclasses.fields(time_budget.Costs)})
        if _LENGTH_PREFIX + 'horizon' in record:
          self.length = RunLength(**{name: record[_LENGTH_PREFIX + name] for name in RunLength._fields})
        else:
          self.length = RunLength.fixed(self.end_step)
        return
