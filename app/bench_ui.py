"""``python -m app.bench_ui``: does the window stay responsive while several replies stream at once?

Opens the real ``MainWindow`` on a temporary data folder with the real model, waits for it to load,
creates N conversations (prompts from ``resources/workloads/mixed.jsonl``, earlier turns included)
and starts a reply in every one at once through the controller. One of them is always shown, and
the shown one changes every ~2 s among those still generating. Measured on the GUI thread:

- stall: how late a 10 ms ``QTimer`` fires (actual gap between ticks - 10 ms), every tick from the
  sends until the last reply is saved; summarised while all N generate and over the whole run;
- repaints: paint events of the shown streaming message's viewport per second, and ``liveUpdated``
  signals naming the shown conversation per second (the controller coalesces to ~30/s).

Prints a Markdown table; ``--json PATH`` writes every figure. A measurement, not a test: the exit
status is 0 even when the p99 target is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QEventLoop, QObject, Qt, QTimer
from PySide6.QtWidgets import QApplication, QWidget

from engine.model import openblas
from engine.model.machine import cpu_model, drop_mlx_streams, usable_cores, use_mlx_defaults

WORKLOAD = Path(__file__).resolve().parent.parent / "resources" / "workloads" / "mixed.jsonl"
PROBE_MS = 10
SWITCH_MS = 2000
TARGET_P99_MS = 50.0
COALESCE_PER_S = 30.0  # the controller's REPAINT_MS (33 ms) allows ~30 updates a second


@dataclass(frozen=True)
class Prompt:
    """One conversation to start: its system prompt, earlier turns, and the message to send."""

    id: str
    system: str
    history: tuple[tuple[str, str], ...]
    text: str


def load_prompts(path: Path = WORKLOAD) -> list[Prompt]:
    """The workload's streams as conversations: the last user turn is sent, the turns before it are
    seeded into the store as they are, a system turn becomes the system prompt."""
    from engine.bench.workloads import load_workload

    prompts = []
    for item in load_workload(path):
        system = "\n".join(m["content"] for m in item.messages if m["role"] == "system")
        turns = [(m["role"], m["content"]) for m in item.messages if m["role"] != "system"]
        last = max(i for i, (role, _) in enumerate(turns) if role == "user")
        prompts.append(Prompt(item.id, system, tuple(turns[:last]), turns[last][1]))
    return prompts


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), nearest rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def stall_summary(stalls_ms: Sequence[float]) -> dict[str, Any]:
    """p50/p90/p99/max of stalls in ms, the number of samples and of ticks later than the target."""
    return {
        "samples": len(stalls_ms),
        "p50_ms": round(percentile(stalls_ms, 50), 2),
        "p90_ms": round(percentile(stalls_ms, 90), 2),
        "p99_ms": round(percentile(stalls_ms, 99), 2),
        "max_ms": round(max(stalls_ms, default=0.0), 2),
        "mean_ms": round(statistics.fmean(stalls_ms), 2) if stalls_ms else 0.0,
        "over_target": sum(1 for s in stalls_ms if s >= TARGET_P99_MS),
    }


def machine() -> dict[str, Any]:
    """Where the numbers came from (no MLX import: the caller may not have loaded it yet)."""
    from PySide6 import QtCore
    from PySide6.QtGui import QGuiApplication

    return {
        "platform": platform.platform(), "cores": usable_cores(), "cpu_model": cpu_model(),
        "python": platform.python_version(), "pyside6": QtCore.__version__, "qt": QtCore.qVersion(),
        "qpa": QGuiApplication.platformName(), "blas": openblas.blas_backend(),
        "date": time.strftime("%Y-%m-%d"),
    }


def _rate(times: Sequence[float], start: float, end: float) -> dict[str, float]:
    """Events per second over [start, end] and the most in any one second (1 s bins from start)."""
    inside = [t for t in times if start <= t <= end]
    span = max(end - start, 1e-9)
    bins: dict[int, int] = {}
    for t in inside:
        bins[int(t - start)] = bins.get(int(t - start), 0) + 1
    full = [n for b, n in bins.items() if start + b + 1 <= end]  # the last, partial second left out
    return {"count": len(inside), "per_s": round(len(inside) / span, 1),
            "max_in_1s": max(full, default=max(bins.values(), default=0))}


def run_bench(conversations: int = 4, max_tokens: int = 256, *, data_dir: Path | None = None,
              engine_factory: Callable[[str | None], Any] | None = None, switch_ms: int = SWITCH_MS,
              timeout_s: float = 900.0, prompts: Sequence[Prompt] | None = None,
              show_origins: bool = False) -> dict[str, Any]:
    """Run the benchmark in this process (a QApplication is made if there is none) and return its
    figures. ``data_dir`` (default: a temporary folder, removed after) receives ``lanes.db``;
    ``engine_factory`` defaults to ``engine.rounds.engine_thread.Engine`` (loads and calibrates the model);
    ``show_origins`` shows replies coloured by origin (the other rendering path)."""
    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    def bench(folder: Path) -> dict[str, Any]:
        return _Bench(app, folder, conversations, max_tokens, engine_factory, switch_ms, timeout_s, prompts,
                      show_origins).run()

    if data_dir is not None:
        return bench(Path(data_dir))
    with tempfile.TemporaryDirectory(prefix="lanes-bench-ui-") as tmp:
        return bench(Path(tmp))


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Run the Qt event loop (no sleeping, so timers fire on time) until ``cond()``; TimeoutError after
    ``timeout_s``."""
    if cond():
        return
    loop = QEventLoop()
    check = QTimer(interval=20)
    check.timeout.connect(lambda: cond() and loop.quit())
    deadline = QTimer(singleShot=True)
    deadline.timeout.connect(loop.quit)
    check.start()
    deadline.start(int(timeout_s * 1000))
    loop.exec()
    check.stop()
    deadline.stop()
    if not cond():
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def settle(seconds: float) -> None:
    """Run the Qt event loop for ``seconds``: queued loads, layouts and scrolling happen."""
    until = time.monotonic() + seconds
    wait_until(lambda: time.monotonic() >= until, seconds + 5, "the window to settle")


class PaintCounter(QObject):
    """Counts paint events of one widget at a time (the shown streaming message's viewport)."""

    def __init__(self) -> None:
        super().__init__()
        self.target: QWidget | None = None
        self.times: list[float] = []

    def watch(self, widget: QWidget) -> None:
        if widget is not self.target:
            self.target = widget
            widget.installEventFilter(self)

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Paint and obj is self.target:
            self.times.append(time.perf_counter())
        return False


class _Bench:
    def __init__(self, app: QApplication, folder: Path, n: int, max_tokens: int,
                 engine_factory: Callable[[str | None], Any] | None, switch_ms: int, timeout_s: float,
                 prompts: Sequence[Prompt] | None, show_origins: bool) -> None:
        if n < 1:
            raise ValueError("need at least one conversation")
        self.app = app
        self.folder = folder
        self.n = n
        self.max_tokens = max_tokens
        self.engine_factory = engine_factory
        self.switch_ms = switch_ms
        self.timeout_s = timeout_s
        self.show_origins = show_origins
        pool = list(prompts) if prompts is not None else load_prompts()
        self.prompts = [pool[i % len(pool)] for i in range(n)]
        self.ids: list[int] = []
        self.ticks: list[tuple[float, float, int]] = []  # (time, stall ms, conversations generating)
        self.paints = PaintCounter()
        self.live_updates: list[float] = []
        self.finished: dict[int, float] = {}
        self.failed: dict[int, str] = {}
        self.switches = 0
        self._last_tick = 0.0

    # -- the run -------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        from app.controller import ChatController
        from app.main_window import MainWindow
        from app.preferences import Preferences
        from engine.rounds.engine_thread import Engine

        db = self.folder / "lanes.db"
        factory = self.engine_factory or Engine
        self.controller = c = ChatController(db, None, factory)
        self.prefs = Preferences(max_tokens=self.max_tokens, show_origins=self.show_origins)
        self.window = w = MainWindow(c, self.prefs, self.folder / "preferences.json")
        w.resize(1200, 800)
        w.show()
        t_open = time.perf_counter()
        try:
            wait_until(lambda: c.info is not None, self.timeout_s, "the model to load")
            load_s = time.perf_counter() - t_open
            self._create_conversations()
            self._show(self.ids[0])
            settle(0.3)  # the first conversation shows

            c.liveUpdated.connect(self._live_updated)  # after the window's own slot
            c.replyFinished.connect(lambda cid, _m: self.finished.setdefault(cid, time.perf_counter()))
            c.replyFailed.connect(lambda cid, why: self.failed.setdefault(cid, why))
            probe = QTimer()
            probe.setTimerType(Qt.TimerType.PreciseTimer)
            probe.setInterval(PROBE_MS)
            probe.timeout.connect(self._tick)
            switcher = QTimer(interval=self.switch_ms)
            switcher.timeout.connect(self._switch)

            settings = self.prefs.reply_settings()
            self._last_tick = self.t0 = time.perf_counter()
            probe.start()
            for cid, p in zip(self.ids, self.prompts, strict=True):
                c.send(cid, p.text, settings)
            switcher.start()
            done = set(self.ids)
            wait_until(lambda: done <= self.finished.keys() | self.failed.keys() and not c.generating(),
                       self.timeout_s, "every reply to finish")
            self.t1 = time.perf_counter()
            probe.stop()
            switcher.stop()
        finally:
            w.close()  # controller.close(): stops any reply, joins every thread
            self.app.processEvents()
            w.deleteLater()
            self.app.processEvents()
        return self._result(db, load_s)

    def _create_conversations(self) -> None:
        from engine.service.session import title_from
        from engine.store.records import Conversation
        from engine.store.store import Store

        created: dict[int, int] = {}
        settings = self.prefs.reply_settings()
        for i, p in enumerate(self.prompts):
            def on_conv(conv: Conversation, i: int = i, p: Prompt = p) -> None:
                def seed(s: Store) -> None:
                    for role, content in p.history:
                        s.add_message(conv.id, role, content)
                    if p.history:
                        s.update_conversation(conv.id, title=title_from(p.history[0][1]))

                self.controller.store_call(seed, lambda _r: created.__setitem__(i, conv.id))

            self.controller.new_conversation(p.system, settings, on_conv)
        wait_until(lambda: len(created) == self.n, 60, "the conversations to be created")
        self.ids = [created[i] for i in range(self.n)]

    def _show(self, cid: int) -> None:
        """As a click in the sidebar would (straight to the window when the row is not listed yet)."""
        w = self.window
        if w.sidebar.model.row_of(cid) >= 0:
            w.sidebar.select(cid)
        w.open_conversation(cid)

    # -- slots ---------------------------------------------------------------------------------------
    def _tick(self) -> None:
        now = time.perf_counter()
        gap_ms = (now - self._last_tick) * 1000
        self._last_tick = now
        self.ticks.append((now, max(0.0, gap_ms - PROBE_MS), len(self.controller.generating())))

    def _switch(self) -> None:
        generating = self.controller.generating()
        order = [cid for cid in self.ids if cid in generating]
        if not order:
            return
        current = self.window.current
        after = self.ids[self.ids.index(current) + 1:] if current in self.ids else []
        target = next((cid for cid in after if cid in generating), order[0])
        if target != current:
            self.switches += 1
            self._show(target)

    def _live_updated(self, ids: set[int]) -> None:
        current = self.window.current
        if current not in ids:
            return
        self.live_updates.append(time.perf_counter())
        live = self.controller.live.get(current)
        widget = self.window.chat.widget_for(live.message_id) if live and live.message_id is not None else None
        if widget is not None:
            self.paints.watch(widget.view.viewport())

    # -- the figures ---------------------------------------------------------------------------------
    def _result(self, db: Path, load_s: float) -> dict[str, Any]:
        from engine.store.store import Store

        replies = []
        with Store(db) as store:
            for cid, p in zip(self.ids, self.prompts, strict=True):
                reply = store.messages(cid)[-1]
                stats = reply.stats or {}
                replies.append({
                    "conversation_id": cid, "prompt": p.id, "role": reply.role, "status": reply.status,
                    "error": reply.error, "generated": int(stats.get("generated", 0)),
                    "tokens_per_s": stats.get("tokens_per_s"), "first_token_s": stats.get("first_token_s"),
                    "reason": stats.get("reason"), "chars": len(reply.content),
                    "finished_s": round(self.finished[cid] - self.t0, 3) if cid in self.finished else None,
                })
        all_gen = [s for _, s, g in self.ticks if g >= self.n]
        whole = [s for _, s, _ in self.ticks]
        end_all = max((t for t, _, g in self.ticks if g >= self.n), default=self.t0)
        duration = self.t1 - self.t0
        tokens = sum(r["generated"] for r in replies)
        worst = sorted(self.ticks, key=lambda x: -x[1])[:10]
        return {
            "conversations": self.n, "max_tokens": self.max_tokens, "show_origins": self.show_origins,
            "probe_ms": PROBE_MS,
            "switch_ms": self.switch_ms, "target_p99_ms": TARGET_P99_MS,
            "stall_all_generating": {**stall_summary(all_gen), "seconds": round(end_all - self.t0, 2)},
            "stall_whole_run": {**stall_summary(whole), "seconds": round(duration, 2)},
            "met": percentile(whole, 99) < TARGET_P99_MS,
            "repaints": _rate(self.paints.times, self.t0, self.t1),
            "live_updates": _rate(self.live_updates, self.t0, self.t1),
            "switches": self.switches,
            "tokens": tokens, "duration_s": round(duration, 2),
            "tokens_per_s": round(tokens / duration, 1) if duration > 0 else 0.0,
            "model_load_s": round(load_s, 2),
            "replies": replies, "failed": self.failed,
            "worst_ticks": [{"at_s": round(t - self.t0, 3), "stall_ms": round(s, 1), "generating": g}
                            for t, s, g in worst],
            "machine": machine(),
        }


def to_markdown(result: dict[str, Any]) -> str:
    """The figures as a Markdown table, with the run and the machine below it."""
    a, w, m = result["stall_all_generating"], result["stall_whole_run"], result["machine"]
    n = result["conversations"]
    rows = [("samples (10 ms ticks)", "samples", "{:d}"), ("p50 stall ms", "p50_ms", "{:.1f}"),
            ("p90 stall ms", "p90_ms", "{:.1f}"), ("p99 stall ms", "p99_ms", "{:.1f}"),
            ("max stall ms", "max_ms", "{:.1f}"), (f"ticks ≥ {TARGET_P99_MS:.0f} ms late", "over_target", "{:d}"),
            ("seconds measured", "seconds", "{:.1f}")]
    lines = [
        f"Window responsiveness: {n} conversations generating at once (up to {result['max_tokens']} tokens "
        f"each), the shown one switched every {result['switch_ms'] / 1000:g} s"
        f"{', coloured by origin' if result['show_origins'] else ''}; a {result['probe_ms']} ms QTimer on the GUI "
        "thread, stall = gap - 10 ms.",
        "",
        f"| measure | while all {n} generate | whole run (until the last reply is saved) |",
        "|---|---|---|",
    ]
    for name, key, fmt in rows:
        lines.append(f"| {name} | {fmt.format(a[key])} | {fmt.format(w[key])} |")
    r, u = result["repaints"], result["live_updates"]
    lines += [
        f"| repaints of the shown message /s (max in 1 s) | | {r['per_s']:.1f} ({r['max_in_1s']}) |",
        f"| liveUpdated for the shown conversation /s (max in 1 s) | | {u['per_s']:.1f} ({u['max_in_1s']}) |",
        f"| tokens generated | | {result['tokens']} |",
        f"| duration s | | {result['duration_s']:.1f} |",
        f"| aggregate tok/s | | {result['tokens_per_s']:.1f} |",
        "",
        f"Target p99 stall < {result['target_p99_ms']:.0f} ms (whole run): {'met' if result['met'] else 'MISSED'}. "
        f"Coalescing: ≤ ~{COALESCE_PER_S:.0f} updates/s expected. Switches: {result['switches']}. "
        f"Model load (with calibration): {result['model_load_s']:.1f} s.",
        "Replies: " + ", ".join(f"{x['prompt']} {x['status']} {x['generated']} tok ({x['reason']})"
                                for x in result["replies"]) + ".",
        f"Machine: {m['platform']}, {m['cores']} cores ({m['cpu_model'] or 'unknown CPU'}), Python {m['python']}, "
        f"PySide6 {m['pyside6']} (Qt {m['qt']}, {m['qpa']}), BLAS {m['blas']}, {m['date']}.",
    ]
    if result["failed"]:
        lines.append(f"Failed: {result['failed']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    openblas.ensure_fast_blas()  # Linux: re-executes with OpenBLAS preloaded, before MLX loads
    use_mlx_defaults()
    parser = argparse.ArgumentParser(prog="python -m app.bench_ui", description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=4, help="replies at once (default 4)")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per reply at most (default 256)")
    parser.add_argument("--show-origins", action="store_true", help="show replies coloured by origin")
    parser.add_argument("--json", default=None, help="write every figure to this JSON file")
    args = parser.parse_args(argv)
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    try:
        result = run_bench(args.conversations, args.max_tokens, show_origins=args.show_origins)
        sys.stdout.write(to_markdown(result))
        if args.json:
            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        drop_mlx_streams()
    return 0


if __name__ == "__main__":
    sys.exit(main())
