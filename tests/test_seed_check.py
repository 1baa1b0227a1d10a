"""The seed's check on the real model: once a stream's history shows its copies
breaking, own copy rates stop paying verify rows for it; the fixed 0.94 does not."""

from __future__ import annotations

import pytest

from engine.drafts.cost_model import CostModel
from engine.events import Event, Finished, Request, RoundStats
from engine.rounds.scheduler import Scheduler
from tests import prompts

pytestmark = pytest.mark.model

# Measured on the 2-core CI machine (ms per pass, SmolLM2-135M float32, OpenBLAS).
CPU_MS = {(1, 1): 64, (1, 4): 80, (1, 8): 98, (1, 16): 114, (2, 1): 72, (2, 4): 108, (2, 8): 139,
          (2, 16): 189, (4, 1): 101, (4, 4): 145, (4, 8): 218, (4, 16): 339}
BROKEN = {key: {"accepted": 0.0, "tested": 30.0}
          for key in ("context", "context.first", "context.short", "resync", "recall", "recall.first",
                      "recall.short")}


def rows_per_round(loaded, chat_prompt, own: bool) -> tuple[list[int], Finished]:
    events: list[Event] = []
    sched = Scheduler(loaded, events.append, costs=CostModel({k: v / 1000 for k, v in CPU_MS.items()}))
    # Four streams share the rounds; the first is the one whose history shows breaking copies.
    target = Request(prompt_tokens=tuple(chat_prompt(prompts.COPY)), max_tokens=48, own_copy_rates=own,
                     copy_history=BROKEN)
    others = [Request(prompt_tokens=tuple(chat_prompt(t)), max_tokens=48, own_copy_rates=own)
              for t in (prompts.CODE, prompts.OPEN, prompts.FRANCE)]
    for r in [target, *others]:
        sched.submit(r)
    while sched.busy:
        sched.costs = CostModel({k: v / 1000 for k, v in CPU_MS.items()})  # keep prices fixed for the test
        sched.step()
    rows = [e.draft_rows for e in events if isinstance(e, RoundStats) and e.request_id == target.id]
    done = next(e for e in events if isinstance(e, Finished) and e.request_id == target.id)
    return rows, done


def test_breaking_history_gets_no_rows_with_own_rates(loaded, chat_prompt) -> None:
    rows_on, done_on = rows_per_round(loaded, chat_prompt, own=True)
    rows_off, done_off = rows_per_round(loaded, chat_prompt, own=False)
    probes = sum(1 for r in rows_on if r == 1)
    assert all(r <= 1 for r in rows_on), rows_on  # its own row only, probes aside
    assert probes <= len(rows_on) // 8 + 1  # probes are rare (one per probe_every rounds)
    assert sum(rows_off) > 3 * max(1, sum(rows_on)), (rows_off, rows_on)
    assert done_on.tokens == done_off.tokens  # pricing changes speed, never tokens


def test_resync_windows_are_priced_from_their_own_history(loaded, chat_prompt) -> None:
    # Repeating a sentence with its typos fixed: each fix breaks the copy, and the copy resumes
    # through a resync window, whose rows are context tokens priced from the "resync" history.
    events: list[Event] = []
    sched = Scheduler(loaded, events.append, costs=CostModel({k: v / 1000 for k, v in CPU_MS.items()}))
    req = Request(prompt_tokens=tuple(chat_prompt(prompts.TYPOS)), max_tokens=60, own_copy_rates=True)
    sched.submit(req)
    while sched.busy:
        sched.step()
    verified = [e for e in events if isinstance(e, RoundStats) and e.draft_rows > 0]
    keys = {e.rate_key for e in verified}
    # A brief match's probe may come too, depending on how earlier rounds were priced.
    assert "resync" in keys and keys <= {"context.first", "context.short", "context.brief", "resync"}, keys
    assert all(e.source == "context" for e in verified)
    done = next(e for e in events if isinstance(e, Finished))
    assert {"context", "context.first", "resync"} <= set(done.copy_history) <= {
        "context", "context.first", "context.short", "context.short.rest", "context.brief", "context.brief.rest",
        "resync", "resync.rest"}
    resync_rows = sum(e.draft_rows for e in verified if e.rate_key == "resync")
    assert done.stats.rows["context"].granted == sum(e.draft_rows for e in verified)
    assert resync_rows > 0
