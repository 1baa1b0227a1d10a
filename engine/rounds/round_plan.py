"""What a round is made of: the plan (each stream's window and rows granted), the round being run,
a joining stream's prefill, and a round that ran ahead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from engine.drafts.copy_index import Window
from engine.passes.grouped import Chunk
from engine.rounds.stream import Stream


@dataclass
class Joining:
    """A stream whose prompt is being prefilled, one chunk per step."""

    stream: Stream
    caches: list[Any]  # mlx-lm caches of one stream, one per cached layer (engine.model.cache_kinds)
    done: int  # prompt tokens already in the caches


@dataclass
class RoundPlan:
    streams: list[Stream]
    windows: list[Window | None]
    rows: list[int]


@dataclass
class Round:
    """One round being run: its plan, each stream's drafts and rows, and how its pass runs
    (``kind``: "ahead" when a round that ran ahead computed it, "host" on numpy, "grouped" or
    "padded")."""

    plan: RoundPlan
    drafts: list[list[int]]
    rows: list[list[int]]
    sampling: list[int]  # streams that sample (temperature > 0), by index
    kind: str
    chunk: Chunk | None  # a joining prompt's chunk riding in the pass
    ahead: mx.array | None  # the choices a round that ran ahead computed
    keys: int  # the longest context: a padded pass attends every stream over it
    waited: bool = False  # a pass run ahead was dropped for it: its timing includes that pass

    @property
    def batch(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        return max(len(row) for row in self.rows)

    @property
    def wide(self) -> int:
        return sum(1 for d in self.drafts if d)


@dataclass
class RunAhead:
    """A round started before the previous round's tokens reached the host (``engine.rounds.run_ahead``)."""

    streams: list[Stream]  # its rows, in order
    choices: mx.array  # [len(streams), width] choices (greedy, or a sampling stream's draws), still being computed
    drafts: list[list[int]] | None = None  # after a drafting round: each stream's copy continued
    reach: int = 0  # then: positions its pass may have written past the host's lengths
