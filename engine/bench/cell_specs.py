"""Benchmark cells: what each one runs, and the family settings a Lanes cell may override.

A cell is a base name, optionally followed by ``:key=value`` family settings for that cell
alone, so two settings of one family run side by side in one benchmark run (on a shared,
noisy machine only such ratios count). Only Lanes cells (``plain``, ``off``, ``on``) take
settings; the mlx-lm cells run mlx-lm as it is.

Worked example: ``parse_cells("off,on,on:doubt_prior=0.6:max_window=16")`` gives three
cells; the last one's ``settings`` are ``{"doubt_prior": 0.6, "max_window": 16}`` and, for a
family with ``min_match`` ``{"context": 4, "recall": 8}``, ``with_settings`` returns that family
with ``doubt_prior=0.6`` and ``max_window=16``; ``on:min_match.context=6`` changes the context
entry of ``min_match`` alone. The cell keeps its spec as its name in tables and JSON.

One setting is the engine's, not the family's: ``context_cost=false`` runs the cell with the cost
model as it was before contexts were priced (every round priced as if at the calibration's 64 keys;
``engine.drafts.context_cost``), so the two can be compared side by side; so are ``generic_pass=true``
(the generic pass where the model has faster ones), ``compiled=false`` (an accelerator's passes
uncompiled), ``prefill_pass=N`` (padded positions a pass that prefills several joining streams may
take, ``engine.rounds.joins``; 1 prefills each stream alone), ``continue_copies=false`` (no round
run ahead after a drafting round, ``engine.rounds.run_ahead``), ``start_copies=false`` (no copy
started in a round run ahead), ``probe_starts=false`` (no probe started there),
``fused_attention=false`` (CUDA's masked attention on MLX's own ops, not ``engine.model.lane_attention``)
``compile_alone=true|false`` (a lone stream's draft-free rounds compiled or not; by default
where the attention is fused), ``compile_drafts=true|false`` (an accelerator's drafting rounds
compiled, padded, or uncompiled at their planned width, priced and calibrated as such; by default
as the passes choose: ``RoundPasses.draft_step``) and ``round_costs=true|false`` (an accelerator's
cost model calibrated from passes timed as rounds run, a dropped round run ahead priced as one, or
from bare passes, a dropped round priced as a one-row pass: ``engine.rounds.calibration``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from engine.errors import LanesError
from engine.model.families import Family

BASES = ("mlx-lm", "mlx-lm-batch", "plain", "off", "on")
LANES_BASES = ("plain", "off", "on")

Value = float | int | bool

# Settings a cell may override, with their types. own_copy_rates is the base (off / on).
SETTINGS: Mapping[str, type] = MappingProxyType({
    "copy_rate": float,
    "doubt_prior": float,
    "copy_edits": bool,
    "max_window": int,
    "min_row_value": float,
    "min_match.context": int,
    "min_match.recall": int,
    "brief_match": int,
    "context_cost": bool,
    "generic_pass": bool,
    "compiled": bool,
    "prefill_pass": int,
    "continue_copies": bool,
    "start_copies": bool,
    "probe_starts": bool,
    "fused_attention": bool,
    "compile_alone": bool,
    "compile_drafts": bool,
    "round_costs": bool,
})
INT_MINIMUM: Mapping[str, int] = MappingProxyType({"brief_match": 0})  # 0 turns it off; others start at 1
# Not family settings: with_settings leaves them out.
ENGINE_SETTINGS = ("context_cost", "generic_pass", "compiled", "prefill_pass", "continue_copies", "start_copies", "probe_starts",
                   "fused_attention", "compile_alone", "compile_drafts", "round_costs")
_TRUE, _FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")


@dataclass(frozen=True)
class Cell:
    spec: str  # as written: the cell's name in tables and JSON
    base: str  # one of BASES
    settings: Mapping[str, Value] = field(default_factory=dict)

    @property
    def drafts(self) -> bool:
        return self.base in ("off", "on")

    @property
    def own_copy_rates(self) -> bool:
        return self.base == "on"

    @property
    def context_cost(self) -> bool:
        """Whether the cost model prices each round's context (the default) or every round at 64 keys."""
        return bool(self.settings.get("context_cost", True))

    @property
    def generic_pass(self) -> bool:
        """Whether the cell runs the generic pass instead of the model's own choice (engine.passes.choice)."""
        return bool(self.settings.get("generic_pass", False))

    @property
    def compiled(self) -> bool:
        """Whether an accelerator's padded passes stay compiled (the default; engine.passes.compiled)."""
        return bool(self.settings.get("compiled", True))

    @property
    def prefill_pass(self) -> int | None:
        """Padded positions of a pass that prefills several joining streams (None: the scheduler's own)."""
        value = self.settings.get("prefill_pass")
        return None if value is None else int(value)

    @property
    def continue_copies(self) -> bool:
        """Whether an accelerator runs a drafting round's successor ahead with the copies' continuations."""
        return bool(self.settings.get("continue_copies", True))

    @property
    def start_copies(self) -> bool:
        """Whether a round run ahead may start copies of windows granted no rows (engine.rounds.run_ahead)."""
        return bool(self.settings.get("start_copies", True))

    @property
    def probe_starts(self) -> bool:
        """Whether a round run ahead starts one row of a window due a probe (engine.rounds.run_ahead)."""
        return bool(self.settings.get("probe_starts", True))

    @property
    def fused_attention(self) -> bool:
        """Whether masked attention runs as the passes choose (on CUDA one kernel) or on MLX's own ops."""
        return bool(self.settings.get("fused_attention", True))

    @property
    def compile_alone(self) -> bool | None:
        """Whether a lone stream's draft-free rounds are compiled (None: as the passes choose)."""
        value = self.settings.get("compile_alone")
        return None if value is None else bool(value)

    @property
    def compile_drafts(self) -> bool | None:
        """Whether an accelerator's drafting rounds run compiled, padded, or as planned (None: as the
        passes choose)."""
        value = self.settings.get("compile_drafts")
        return None if value is None else bool(value)

    @property
    def round_costs(self) -> bool | None:
        """Whether an accelerator's costs are calibrated as rounds run or from bare passes (None: as
        the passes choose)."""
        value = self.settings.get("round_costs")
        return None if value is None else bool(value)

    def with_settings(self, family: Family) -> Family:
        """``family`` with this cell's settings applied (the family itself when there are none)."""
        plain = {k: v for k, v in self.settings.items() if "." not in k and k not in ENGINE_SETTINGS}
        matches = {k.split(".", 1)[1]: v for k, v in self.settings.items() if k.startswith("min_match.")}
        if matches:
            plain["min_match"] = MappingProxyType({**family.min_match, **matches})
        return replace(family, **plain) if plain else family


def _value(spec: str, key: str, text: str) -> Value:
    kind = SETTINGS[key]
    low = text.strip().lower()
    if kind is bool:
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise LanesError(f"cell {spec!r}: {key} takes true or false, not {text!r}")
    try:
        number = kind(low)
    except ValueError:
        raise LanesError(f"cell {spec!r}: {key} takes a{'n integer' if kind is int else ' number'}, "
                         f"not {text!r}") from None
    if kind is float and not 0.0 < number < 1.0:
        raise LanesError(f"cell {spec!r}: {key} is a rate, strictly between 0 and 1, not {text}")
    least = INT_MINIMUM.get(key, 1)
    if kind is int and number < least:
        raise LanesError(f"cell {spec!r}: {key} must be at least {least}, not {text}")
    return number


def parse_cell(spec: str) -> Cell:
    """One cell from ``base[:key=value...]``; a LanesError names what is wrong."""
    base, *parts = spec.strip().split(":")
    if base not in BASES:
        raise LanesError(f"unknown cell {base!r}; choose from {', '.join(BASES)}")
    if parts and base not in LANES_BASES:
        raise LanesError(f"cell {spec!r}: only the Lanes cells ({', '.join(LANES_BASES)}) take settings")
    settings: dict[str, Value] = {}
    for part in parts:
        key, eq, text = part.partition("=")
        key = key.strip()
        if not eq or key not in SETTINGS:
            raise LanesError(f"cell {spec!r}: {part!r} is not a setting; write key=value with key one of "
                             f"{', '.join(SETTINGS)}")
        if key in settings:
            raise LanesError(f"cell {spec!r}: {key} is set twice")
        settings[key] = _value(spec, key, text)
    return Cell(spec.strip(), base, MappingProxyType(settings))


def parse_cells(text: str) -> list[Cell]:
    """Comma-separated cells, in order; empty entries skipped, a repeated cell refused."""
    cells = [parse_cell(s) for s in text.split(",") if s.strip()]
    if not cells:
        raise LanesError(f"no cells given; choose from {', '.join(BASES)}")
    names = [c.spec for c in cells]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise LanesError(f"cell(s) given twice: {', '.join(repeated)}")
    return cells
