"""``lanes soak``: many streams through the engine for a long time, watching errors and memory.

Keeps ``streams`` requests in flight through one ``Engine`` (the window's engine thread, its
rounds, Recall and the conversation cache), taking the workloads' requests in turn and continuing
each conversation for a few turns so the turn cache is used and evicted. Every reply is checked to
end ``eos`` / ``length``; resident memory is sampled every few seconds, with the bytes that bounded
buffers hold by design: the finished turns' KV (up to its budget), the running streams' KV (its size
follows the longest of them) and MLX's cache of freed buffers.
The result says how much memory *outside* those caches grew after the warm-up (the first
``warmup_s``; ``growth``): the target is under 5% (docs/benchmarks.md). The raw resident size is
reported too: it grows while the turn cache fills towards its budget.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.bench.workloads import WorkItem
from engine.events import Failed, Finished, Request

TURNS = 3  # turns of one conversation before a new one starts


def rss_bytes() -> int:
    """This process's resident memory now (Linux: /proc; elsewhere ps)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        out = subprocess.run(["ps", "-o", "rss=", "-p", str(os.getpid())], capture_output=True, text=True)
        return int(out.stdout.strip()) * 1024


def growth(samples: list[tuple[float, int, int]], warmup_s: float) -> tuple[float, float, float]:
    """Memory outside the bounded caches after the warm-up: the median over the first third of the
    samples after ``warmup_s`` and over the last third, in bytes, and how much the second grew.

    Medians, because one sample can catch a pass's transient buffers (hundreds of MiB with 8 streams).
    Samples are (seconds, resident bytes, bytes the bounded caches hold):

    >>> s = [(0, 500, 0), (60, 900, 100), (70, 1000, 100), (80, 1900, 100), (90, 950, 150), (100, 960, 150),
    ...      (110, 970, 150)]
    >>> growth(s, warmup_s=60)  # first third 800, 900; last third 810, 820
    (850.0, 815.0, -0.0412)
    """
    after = [rss - held for t, rss, held in samples if t >= warmup_s] or [samples[-1][1] - samples[-1][2]]
    third = max(1, len(after) // 3)
    first, last = statistics.median(after[:third]), statistics.median(after[-third:])
    return float(first), float(last), round(last / first - 1, 4)


def soak(submit: Callable[[Request], Any], items: list[WorkItem], streams: int, seconds: float,
         held: Callable[[], int] = lambda: 0, warmup_s: float = 120.0, sample_s: float = 5.0,
         progress: Callable[[str], None] = lambda _s: None) -> dict[str, Any]:
    """Run the soak through ``submit`` (``Engine.submit``); returns the result (module docstring)."""
    deadline = time.monotonic() + seconds
    start = time.monotonic()
    lock = threading.Lock()
    counts = {"replies": 0, "tokens": 0, "errors": 0}
    errors: list[str] = []
    samples: list[tuple[float, int, int]] = []  # seconds, resident bytes, bytes bounded caches hold
    order = itertools.count()

    def lane(n: int) -> None:
        while time.monotonic() < deadline:
            item = items[next(order) % len(items)]
            conv = f"soak-{n}-{time.monotonic_ns()}"
            messages = list(item.messages)
            for _turn in range(TURNS):
                handle = submit(Request(messages=tuple(messages), max_tokens=item.max_tokens, conversation=conv))
                done = None
                for ev in handle:
                    if isinstance(ev, Finished | Failed):
                        done = ev
                with lock:
                    if isinstance(done, Finished) and done.reason in ("eos", "length"):
                        counts["replies"] += 1
                        counts["tokens"] += len(done.tokens)
                    else:
                        counts["errors"] += 1
                        errors.append(getattr(done, "message", None) or f"ended {getattr(done, 'reason', None)}")
                if not isinstance(done, Finished) or time.monotonic() >= deadline:
                    break
                messages += [{"role": "assistant", "content": done.text},
                             {"role": "user", "content": "Again, a little shorter."}]

    threads = [threading.Thread(target=lane, args=(n,), name=f"soak-{n}") for n in range(streams)]
    for t in threads:
        t.start()
    def sample() -> None:
        samples.append((time.monotonic() - start, rss_bytes(), held()))

    while any(t.is_alive() for t in threads):
        sample()
        t_s, rss, cached = samples[-1]
        with lock:
            progress(f"{t_s:6.0f} s  rss {rss / 2**20:7.1f} MiB  of which caches {cached / 2**20:7.1f} MiB  "
                     f"replies {counts['replies']}  errors {counts['errors']}")
        for t in threads:
            t.join(timeout=sample_s / len(threads))
    sample()
    rss_after = next((rss for s, rss, _ in samples if s >= warmup_s), samples[-1][1])
    first, last, grew = growth(samples, warmup_s)
    mib = lambda n: round(n / 2**20, 1)  # noqa: E731
    return {
        "streams": streams, "seconds": round(time.monotonic() - start, 1), "warmup_s": warmup_s,
        **counts, "error_messages": errors[:20],
        "rss_after_warmup_mib": mib(rss_after), "rss_end_mib": mib(samples[-1][1]),
        "caches_end_mib": mib(samples[-1][2]),
        "outside_caches_first_third_mib": mib(first), "outside_caches_last_third_mib": mib(last),
        "growth_after_warmup": grew,
        "samples": [(round(s, 1), rss, cached) for s, rss, cached in samples],
    }


def markdown(r: dict[str, Any]) -> str:
    return (
        "| streams | minutes | replies | tokens | errors | resident after warm-up / at end | of which bounded "
        "caches at end | outside them, medians of the first / last third after warm-up | growth |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
        f"| {r['streams']} | {r['seconds'] / 60:.1f} | {r['replies']} | {r['tokens']} | {r['errors']} | "
        f"{r['rss_after_warmup_mib']} / {r['rss_end_mib']} MiB | {r['caches_end_mib']} MiB | "
        f"{r['outside_caches_first_third_mib']} / {r['outside_caches_last_third_mib']} MiB | "
        f"{r['growth_after_warmup'] * 100:+.1f}% |"
    )


def main(args: Any) -> int:
    from engine.bench.workloads import load_workload
    from engine.rounds.engine_thread import Engine

    items = [i for w in args.workloads for i in load_workload(w, args.max_tokens)]
    import mlx.core as mx

    with Engine(args.model) as engine:
        info = engine.info()
        budget = engine.run_sync(lambda sched: sched.conversations.max_bytes)
        held = lambda: engine.run_sync(  # noqa: E731
            lambda sched: sched.conversations.nbytes + sched.lanes.nbytes + mx.get_cache_memory())
        result = soak(engine.submit, items, args.streams, args.minutes * 60, held, warmup_s=args.warmup,
                      progress=lambda s: print(s, file=sys.stderr))
    result["turn_cache_budget_mib"] = round(budget / 2**20, 1)
    result.update(model=info.name, device=info.device, machine=_machine(),
                  workloads=[str(w) for w in args.workloads], max_tokens=args.max_tokens)
    print(markdown(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result) + "\n")
    return 0 if result["errors"] == 0 and result["growth_after_warmup"] < 0.05 else 1


def _machine() -> str:
    import platform

    return f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}"


def default_workloads() -> list[Path]:
    root = Path(__file__).resolve().parents[2] / "resources" / "workloads"
    return [root / f"{w}.jsonl" for w in ("copy-heavy", "no-copy", "mixed")]
