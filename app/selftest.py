"""``Lanes --self-test`` (and ``lanes-app --self-test``): prove that a build can do its job.

Run by CI on the Linux bundle and by hand on a fresh macOS build: it starts Qt offscreen, builds the
widgets that pull in the dynamically loaded pieces (QtCharts, pygments lexers and styles), loads the
embedded model, generates a few tokens, and opens, writes, searches and closes a database in a
temporary folder. The user's own database and preferences are never touched.

Each check prints one line with its time; the run ends with ``self-test passed`` and exit status 0,
or ``self-test FAILED`` with each failure's reason and exit status 1.
"""

from __future__ import annotations

import asyncio
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MAX_TOKENS = 8
PROMPT = "Say hello in five words."
MODEL_LOAD_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    seconds: float
    detail: str


def _environment() -> str:
    frozen = getattr(sys, "frozen", False)
    where = (
        f"bundle {getattr(sys, '_MEIPASS', '?')}"
        if frozen
        else f"source {Path(__file__).resolve().parents[1]}"
    )
    return f"Lanes self-test: Python {platform.python_version()}, {platform.system()} {platform.machine()}, {where}"


def check_qt() -> str:
    """An offscreen QApplication, the main window's module and the widgets behind QtCharts."""
    import qasync
    from PySide6.QtCharts import QChart, QChartView, QLineSeries
    from PySide6.QtWidgets import QApplication

    import app.main_window as main_window  # every UI module the window imports (QtCharts, pygments...)

    qt_app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "Lanes"])
    series = QLineSeries()
    series.append(0.0, 1.0)
    series.append(1.0, 2.0)
    chart = QChart()
    chart.addSeries(series)
    view = QChartView(chart)
    view.resize(200, 120)
    grabbed = view.grab()  # renders without showing (offscreen would only say it cannot size a window)
    view.close()
    view.deleteLater()
    qt_app.processEvents()
    if grabbed.isNull():
        raise RuntimeError("could not render a QChartView")
    loop = qasync.QEventLoop(qt_app)  # the window's asyncio loop runs on Qt's
    try:
        slept = loop.run_until_complete(asyncio.sleep(0.01, result="ran"))
    finally:
        loop.close()
    if slept != "ran":
        raise RuntimeError(f"qasync loop returned {slept!r}")
    return (
        f"platform {QApplication.platformName()}, {main_window.__name__} imports, a QChartView renders, "
        "a qasync loop runs"
    )


def check_pygments() -> str:
    """Fenced code is coloured: pygments finds its lexers and styles, which it imports by name."""
    from pygments.token import Keyword

    from app.code_blocks import lex_lines, lexer_for, pygments_style

    checked = []
    for language, code in (
        ("python", "def f(x):\n    return x\n"),
        ("rust", "fn main() {}\n"),
        ("sh", "if true; then :; fi\n"),
    ):
        lexer = lexer_for(language)
        if lexer.name == "Text only":
            raise RuntimeError(f"no pygments lexer for {language!r} (lexers not bundled?)")
        types = {ttype for line in lex_lines(language, code) for _, _, ttype in line}
        if not any(t in Keyword for t in types):
            raise RuntimeError(f"the {lexer.name} lexer found no keyword in {code!r}")
        checked.append(lexer.name)
    styles = [pygments_style(False).__name__, pygments_style(True).__name__]
    return f"lexers {', '.join(checked)}; styles {', '.join(styles)}"


def check_blas() -> str:
    """Linux: MLX multiplies with OpenBLAS when it is installed (the re-exec preloaded it)."""
    import threading

    import mlx.core as mx

    from engine.model import openblas

    def multiply() -> None:
        # On a thread of its own: MLX streams are per thread, and a thread that already called
        # mx.clear_streams() (as everything leaving MLX must) has none left.
        try:
            a = mx.ones((64, 64))
            mx.eval(a @ a)
            seen.append(str(mx.default_device()))
        finally:
            mx.clear_streams()

    seen: list[str] = []
    worker = threading.Thread(target=multiply, name="lanes-selftest-blas")
    worker.start()
    worker.join()
    if not seen:
        raise RuntimeError("MLX could not multiply two matrices")
    backend = openblas.blas_backend()
    device = seen[0]
    opted_out = os.environ.get(openblas.OPT_OUT, "") not in ("", "0")
    if opted_out:
        return f"device {device}, BLAS {backend} ({openblas.OPT_OUT} is set: no OpenBLAS re-exec)"
    if sys.platform.startswith("linux") and openblas.openblas_path() is not None and backend != "openblas":
        raise RuntimeError(
            f"OpenBLAS is installed ({openblas.openblas_path()}) but MLX uses the {backend} BLAS: "
            "the LD_PRELOAD re-exec did not happen"
        )
    note = "" if backend != "reference" else " (slow: install libopenblas0-pthread)"
    loaded = openblas.loaded_openblas()
    if loaded is not None:
        note = f" ({openblas.openblas_corename(loaded)} kernels)"
        warning = openblas.slow_path_warning()  # kernels older than the CPU: the re-exec did not set them
        if warning is not None:
            raise RuntimeError(warning)
    return f"device {device}, BLAS {backend}{note}"


def check_model(model: str | None = None) -> str:
    """The embedded model (or ``model``) loads from the bundle and writes a few tokens."""
    from engine.events import Finished, Request
    from engine.model.locate import embedded_model_path
    from engine.rounds.engine_thread import Engine

    source = str(embedded_model_path()) if model is None else model
    t0 = time.perf_counter()
    engine = Engine(model)
    try:
        info = engine.info(timeout=MODEL_LOAD_TIMEOUT_S)
        load_s = time.perf_counter() - t0
        handle = engine.submit(
            Request(messages=({"role": "user", "content": PROMPT},), max_tokens=MAX_TOKENS, temperature=0.0)
        )
        result = handle.wait()
    finally:
        engine.close()
    if not isinstance(result, Finished):
        raise RuntimeError(f"generation failed: {result.kind}: {result.message}")
    if not result.tokens or not result.text.strip():
        raise RuntimeError(f"generation returned nothing (stop reason {result.reason})")
    stats = result.stats
    return (
        f"{info.name} on {info.device} from {source}, loaded in {load_s:.1f}s; {stats.generated} tokens in "
        f"{stats.seconds:.2f}s ({stats.tokens_per_s:.1f} tok/s, {result.reason}): {result.text.strip()!r}"
    )


def check_store() -> str:
    """A database in a temporary folder: create, write, search, reopen, close."""
    from engine.store.store import Store

    with tempfile.TemporaryDirectory(prefix="lanes-selftest-") as tmp:
        db = Path(tmp) / "lanes.db"
        with Store(db) as store:
            conversation = store.create_conversation(title="self-test")
            store.add_message(conversation.id, "user", "a zebra crossing")
            store.add_message(conversation.id, "assistant", "Look both ways.")
            hits = store.search("zebra")
            if [h.id for h in hits] != [conversation.id]:
                raise RuntimeError(f"full-text search found {hits!r}")
        with Store(db) as store:
            messages = store.messages(conversation.id)
            if [m.content for m in messages] != ["a zebra crossing", "Look both ways."]:
                raise RuntimeError(f"reopened database holds {messages!r}")
        size = db.stat().st_size
    return f"create, write, full-text search, reopen and close in a temporary folder ({size} bytes)"


def run_checks(say: Callable[[str], None] = print, model: str | None = None) -> list[Check]:
    """Run every check (a failure does not stop the others); report each as it ends.

    ``model``: check this model (a path or Hugging Face name, as ``--model`` takes) instead of the
    embedded one."""
    say(_environment())
    checks: tuple[tuple[str, Callable[[], str]], ...] = (
        ("qt", check_qt),
        ("pygments", check_pygments),
        ("model", lambda: check_model(model)),
        ("blas", check_blas),  # after the model: MLX is loaded by then
        ("store", check_store),
    )
    results = []
    for name, fn in checks:
        t0 = time.perf_counter()
        try:
            detail, ok = fn(), True
        except Exception as exc:
            detail, ok = f"{type(exc).__name__}: {exc}", False
            say("".join(traceback.format_exception(exc)).rstrip())
        check = Check(name, ok, time.perf_counter() - t0, detail)
        say(f"{'ok  ' if ok else 'FAIL'} {name:<9} {check.seconds:6.2f}s  {detail}")
        results.append(check)
    return results


def main(say: Callable[[str], None] = print, model: str | None = None) -> int:
    """The ``--self-test`` entry point: offscreen Qt, every check, exit status 0 only if all pass."""
    os.environ["QT_QPA_PLATFORM"] = "offscreen"  # no screen needed, and no window flashes up
    t0 = time.perf_counter()
    results = run_checks(say, model)
    total = time.perf_counter() - t0
    failed = [c for c in results if not c.ok]
    if failed:
        say(f"self-test FAILED: {len(failed)} of {len(results)} checks ({total:.1f}s)")
        for c in failed:
            say(f"  {c.name}: {c.detail}")
        return 1
    say(f"self-test passed: {len(results)} checks in {total:.1f}s")
    return 0
