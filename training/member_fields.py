"""The config fields that members trained together (training/members.py) may differ in.

They enter the compiled step as arguments, not constants: the seed through the dropout key and
the data order, the peak rate and warmup through `optimizer.ScheduleValues`. A module of its own
so that experiments/sweeps.py can group a sweep's runs without importing the trainer.
"""

# Each field and its name in a member's folder and label, seed last.
MEMBER_FIELDS = {'optim.learning_rate': 'learning_rate', 'optim.warmup_steps': 'warmup_steps',
                 'train.seed': 'seed'}
