"""``sluice run``'s prompt-cache plan over the whole input: what the lines share, and the
order that sends each group's lines together.

A first streaming pass counts every line's prefix boundaries (``caching.PrefixIndex``:
bounded, so a million-line file keeps flat memory); the engine's planner then knows, for
each line it is given, whether lines far away in the file share its prefix. Unless the
output is to be in input order (``--ordered``: the engine's look-ahead still groups and
primes), a second pass gives each line its group (the deepest boundary it shares) and
family (the outermost: the instructions every line has); lines are then sent family by
family and group by group, each family when its first line's turn comes, every line that
shares nothing at its own place. The plan is 20 bytes a line (its number, its offset in
the file, its group), and the lines are read again from their offsets as they are sent.
Nothing of it is stored: a rerun makes the same plan over the lines still to do (the
order does not change keys, budgets or the output's records).

Only JSONL inputs are reordered (a CSV row may span lines).
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..caching._fingerprint import fingerprint
from ..caching._index import PrefixIndex
from ..caching._rules import LOWEST_MINIMUM
from ._inputs import InputOptions, detect_format, jsonl_item, jsonl_offsets
from ._output import DoneLines

__all__ = ["FilePlan", "packed", "plan_file"]

#: A line shorter than this many bytes cannot hold a cacheable prompt (a token is at least
#: a byte of the line, however it is estimated): it is not parsed by the plan.
_LEAST_BYTES = LOWEST_MINIMUM
#: A boundary must be this far past the fewest tokens any cache takes to group lines.
_MARGIN = 1.05


@dataclass(slots=True)
class FilePlan:
    """The counted prefixes of the lines to do, and (unless kept in input order) the order."""

    index: PrefixIndex
    numbers: array[int] | None = None
    offsets: array[int] | None = None
    groups: array[int] | None = None
    #: Per group (from 1): its family; per family: its groups in the order first seen.
    family_of: list[int] | None = None
    families: list[list[int]] | None = None

    @property
    def reordered(self) -> bool:
        return self.numbers is not None

    @property
    def group_count(self) -> int:
        return len(self.family_of or ()) - 1 if self.family_of else 0

    def order(self, chunk: int | None = None) -> Iterator[tuple[int, int]]:
        """(line number, offset) of each line to do, in the order to send them; ``chunk``
        (the batch tier's lines per provider batch): each group's lines inside one run of
        ``chunk`` lines where it fits in one (see :func:`packed`)."""
        numbers, offsets = self.numbers, self.offsets
        assert numbers is not None
        assert offsets is not None
        units = self._units() if chunk is None else packed(self._units(), chunk)
        for unit in units:
            for position in unit:
                yield numbers[position], offsets[position]

    def _units(self) -> Iterator[Sequence[int]]:
        """The positions of the lines, a group's together, family by family (a line that
        shares nothing alone, at its place)."""
        groups, family_of, families = self.groups, self.family_of, self.families
        assert groups is not None
        assert family_of is not None
        assert families is not None
        count = len(family_of)
        starts = array("q", bytes(8 * (count + 1)))
        for group in groups:
            starts[group + 1] += 1
        for group in range(count):
            starts[group + 1] += starts[group]
        members = array("I", bytes(4 * len(groups)))
        filled = array("q", starts)
        for position, group in enumerate(groups):
            members[filled[group]] = position
            filled[group] += 1
        sent = bytearray(len(families))
        for position, group in enumerate(groups):
            if group == 0:
                yield (position,)
                continue
            family = family_of[group]
            if sent[family]:
                continue
            sent[family] = 1
            for each in families[family]:
                yield members[starts[each] : starts[each + 1]]


def packed(units: Iterable[Sequence[int]], chunk: int) -> Iterator[Sequence[int]]:
    """``units`` (a group's lines each, or one line that shares nothing) so that each group
    lies inside one run of ``chunk`` lines where it can: the batch tier cuts a provider batch
    every ``chunk`` lines, and a group split over two batches, answered side by side at the
    provider, writes its prefix twice. Groups go into runs largest first, each into the first
    run with room for it (first-fit decreasing), the lone lines fill what is left, and the
    runs go out fullest first (a run short of ``chunk`` lines moves the cuts after it). A
    group larger than ``chunk`` fills runs of its own first. The positions are the plan's
    (a few bytes a line): packing holds them all, as the plan does."""
    lone: list[Sequence[int]] = []
    groups: list[Sequence[int]] = []
    for unit in units:
        whole = len(unit) // chunk * chunk
        for start in range(0, whole, chunk):
            yield unit[start : start + chunk]
        rest = unit[whole:]
        if len(rest) == 1:
            lone.append(rest)
        elif rest:
            groups.append(rest)
    groups.sort(key=len, reverse=True)
    runs: list[list[Sequence[int]]] = []
    room: list[int] = []
    for group in groups:
        for number, left in enumerate(room):
            if left >= len(group):
                runs[number].append(group)
                room[number] -= len(group)
                break
        else:
            runs.append([group])
            room.append(chunk - len(group))
    fill = iter(lone)
    for number, run in enumerate(runs):
        run.extend(itertools.islice(fill, room[number]))
        room[number] = chunk - sum(len(unit) for unit in run)
    for number in sorted(range(len(runs)), key=room.__getitem__):
        yield from runs[number]
    yield from fill


def plan_file(path: Path, options: InputOptions, done: DoneLines, *, reorder: bool) -> FilePlan | None:
    """The plan of the input's lines not in ``done`` (see the module docstring); None for
    an input it does not read (CSV)."""
    if detect_format(path, options.format) != "jsonl":
        return None
    index = PrefixIndex()
    for number, _, raw in jsonl_offsets(path, options):
        if raw is None or len(raw) < _LEAST_BYTES or number in done:
            continue
        item = jsonl_item(number, raw, options)
        if item is not None and item.request is not None:
            index.add(fingerprint(item.request))
    if not reorder:
        return FilePlan(index)
    numbers, offsets, groups = array("q"), array("q"), array("I")
    group_ids: dict[int, int] = {}
    family_ids: dict[int, int] = {}
    family_of: list[int] = [0]
    families: list[list[int]] = []
    least = LOWEST_MINIMUM * _MARGIN
    for number, offset, raw in jsonl_offsets(path, options):
        if number in done or (raw is not None and not raw.strip()):
            continue
        group = 0
        item = jsonl_item(number, raw, options) if raw is not None and len(raw) >= _LEAST_BYTES else None
        if item is not None and item.request is not None:
            shared = [b for b in fingerprint(item.request) if b.tokens >= least and index.count(b.digest) >= 2]
            if shared:
                family = family_ids.setdefault(shared[0].digest, len(family_ids))
                if family == len(families):
                    families.append([])
                group = group_ids.get(shared[-1].digest, 0)
                if not group:
                    group = group_ids[shared[-1].digest] = len(family_of)
                    family_of.append(family)
                    families[family].append(group)
        numbers.append(number)
        offsets.append(offset)
        groups.append(group)
    return FilePlan(index, numbers, offsets, groups, family_of, families)
