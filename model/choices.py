"""Resolving a config string to the component it names.

Each component file keeps its own small name -> implementation table; this is the one
lookup they share, so every unknown name fails the same way, naming the config field.
"""

from typing import Mapping, TypeVar

T = TypeVar('T')


def lookup(table: Mapping[str, T], name: str, field: str) -> T:
  """Returns `table[name]`, or raises naming `field` and the valid names.

  Args:
    table: the component table, e.g. `norms.NORMS`.
    name: the configured name.
    field: the config field it came from, e.g. 'config.model.norm'.
  """
  if name not in table:
    raise ValueError(
        f'{field}={name!r} is not one of: {", ".join(sorted(table))}')
  return table[name]
