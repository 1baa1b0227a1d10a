"""Per-family settings: how a model family's copies are priced and proposed.

A family is matched from the model's name and architecture. ``own_copy_rates`` is
off unless a measured A/B in ``docs/benchmarks.md`` shows the family gains from it;
each request may override it (the comparison pane and the benchmark flip it).

What pays differs by device: on the CPU a verified row costs a large part of a round, on a GPU
next to nothing. ``on_device`` holds a family's settings for one device kind ("cpu", "cuda",
"metal"), each from an A/B on that kind; ``family_for`` applies the kind the model runs on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from engine.drafts.allocator import MIN_ROW_VALUE
from engine.drafts.copy_rates import DOUBT_PRIOR


@dataclass(frozen=True)
class Family:
    name: str
    copy_rate: float = 0.94  # fixed price of a copied row when own_copy_rates is off
    own_copy_rates: bool = False
    # Minimum trailing tokens that must match before a window is proposed. Context
    # copies may be lax; Recall copies from other conversations must be strict, since
    # a short match across unrelated text is mostly coincidence.
    min_match: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({"context": 4, "recall": 8})
    )
    # Learn the edits a reply makes to the prompt it copies and replay them in later drafts
    # (engine/drafts/edits.py); off only to measure what they bring.
    copy_edits: bool = True
    # Prior of the first row of a window found by a short match or a resync (engine.drafts.copy_rates,
    # "Doubtful first rows"): such rows landed 46-63% of the time, not 94%.
    doubt_prior: float = DOUBT_PRIOR
    # When no context match of min_match tokens, no edited copy and no resync offers a window, a match
    # of this many tokens that the prompt has once may (engine.rounds.stream; 0: never). Such "brief" windows
    # are priced from their own first-row history, so only with own copy rates: at a fixed rate they
    # would be started whatever their record.
    brief_match: int = 2
    max_window: int = 32  # most rows of a window verified in one round (the allocator decides how many)
    # A started window's rows are verified while worth at least this (engine.drafts.allocator); lower lets
    # windows run longer where rows are cheap next to a round, at the price of rows past a break.
    min_row_value: float = MIN_ROW_VALUE
    # Settings of this family on one device kind, replacing the ones above there (module docstring).
    on_device: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))

    def for_device(self, kind: str) -> Family:
        """This family with its settings for device ``kind`` ("cpu", "cuda", "metal") applied."""
        settings = self.on_device.get(kind)
        return replace(self, **settings) if settings else self


DEVICE_KINDS = ("cpu", "cuda", "metal")
DEFAULT = Family(name="default")

# Keyed by a lower-case substring of the model's name, checked in order.
_REGISTRY: tuple[tuple[str, Family], ...] = (
    # own_copy_rates on: the latest runs in docs/benchmarks.md: level with off on mixed (0.98-1.00x)
    # with half its wasted rows, 1.18-1.21x on no-copy and held-out mixed; 0.84-0.97x on the copy
    # workloads (its doubt prior, measured side by side there, is that price).
    # On CUDA (H200, 2026-12-03, docs/benchmarks.md) off beat on by 1.14x on copy-heavy, on beat off by
    # 1.06x on no-copy, level on mixed: on loses less where nothing copies, so CUDA keeps it; Metal
    # is not measured and takes the same. No on_device entry until a device's A/B says otherwise.
    ("smollm2", Family(name="smollm2", own_copy_rates=True)),
    # The change own copy rates grew from (shared/seed) says the LFM2 family is the one that turns it on.
    ("lfm2", Family(name="lfm2", own_copy_rates=True)),
    ("qwen", Family(name="qwen")),
    ("llama", Family(name="llama")),
)


def family_for(model_name: str, model_type: str = "", device: str = "cpu") -> Family:
    """The registry entry whose key appears in the model's name or type, else DEFAULT, with its
    settings for the ``device`` kind the model runs on."""
    if device not in DEVICE_KINDS:
        raise ValueError(f"unknown device kind {device!r} (known: {', '.join(DEVICE_KINDS)})")
    haystack = f"{model_name} {model_type}".lower()
    for key, family in _REGISTRY:
        if key in haystack:
            return family.for_device(device)
    return replace(DEFAULT, name=model_type or "default").for_device(device)


def registered() -> tuple[Family, ...]:
    return tuple(f for _, f in _REGISTRY)
