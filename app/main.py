"""``lanes-app`` (what ``make run`` opens): the chat window on the embedded model, or the one chosen
in Settings. The window shows at once; the model loads on the engine thread."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from engine.model import openblas
from engine.model.machine import drop_mlx_streams, use_mlx_defaults

if TYPE_CHECKING:
    from PySide6.QtWidgets import QApplication

    from app.preferences import Preferences
    from engine.store.store import Store


def main(argv: list[str] | None = None) -> int:
    openblas.ensure_fast_blas()  # Linux: re-executes with OpenBLAS preloaded, before MLX loads
    use_mlx_defaults()
    parser = argparse.ArgumentParser(prog="lanes-app", description="Lanes: the chat window")
    parser.add_argument("--data-dir", default=None, help="folder of the database (overrides Settings)")
    parser.add_argument("--model", default=None, help="model to load (overrides Settings)")
    parser.add_argument("--self-test", action="store_true",
                        help="check this build offscreen (Qt, the model, a database) and exit")
    args = parser.parse_args(argv)
    # MLX wants every thread that used it to drop its streams before the interpreter goes, or the
    # process aborts at exit; at exit, not here, so a caller's thread keeps its streams meanwhile.
    atexit.register(drop_mlx_streams)
    if args.self_test:
        from app import selftest

        return selftest.main(model=args.model)

    from PySide6.QtWidgets import QApplication

    from app.preferences import load_preferences
    from engine.store import paths

    app = QApplication.instance() or QApplication(sys.argv[:1])
    stop = _StopOnSignals()  # from here on Ctrl-C / SIGTERM close the app the normal way
    app.setApplicationName("Lanes")
    app.setOrganizationName("Lanes")
    prefs, warnings = load_preferences()
    db = paths.database_path(args.data_dir or prefs.data_dir)
    store = _open_store(db)  # the app's one connection: the window, its replies and the pane share it
    if store is None:
        return 2
    try:
        return _run_window(app, stop, store, args.model or prefs.model, prefs, warnings)
    finally:
        store.close()


def _run_window(app: QApplication, stop: _StopOnSignals, store: Store, model: str | None, prefs: Preferences,
                warnings: list[str]) -> int:
    import qasync

    from app.appearance import apply_theme
    from app.controller import ChatController
    from app.main_window import MainWindow
    from app.preferences import preferences_path

    apply_theme(app, prefs.theme)
    controller = ChatController(store, model)
    window = MainWindow(controller, prefs, preferences_path())
    for w in warnings:
        window.statusBar().showMessage(w, 10000)
    window.show()
    if not stop.attach(window):
        window.close()  # asked to stop while starting: close the normal way, then leave
        return 0

    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    closed = asyncio.Event()
    app.lastWindowClosed.connect(closed.set)
    with loop:
        loop.run_until_complete(closed.wait())
    return 0


class _StopOnSignals:
    """Ctrl-C (SIGINT) or SIGTERM closes the window the normal way: replies saved as partial, every
    thread joined. Installed before the window exists, so a signal during start-up is not lost in a
    Qt slot (which would swallow the KeyboardInterrupt and leave the app running); Qt's loop runs in
    C++, so a 200 ms timer lets Python see a signal at all."""

    def __init__(self) -> None:
        import signal

        from PySide6.QtCore import QTimer

        self.window: object | None = None
        self.requested = False
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)
        self._wake = QTimer()
        self._wake.timeout.connect(lambda: None)
        self._wake.start(200)

    def _handle(self, _signum: int, _frame: object) -> None:
        from PySide6.QtCore import QTimer

        self.requested = True
        if self.window is not None:
            QTimer.singleShot(0, self.window.close)  # type: ignore[attr-defined]

    def attach(self, window: object) -> bool:
        """Close this window on a signal from now on; False when one came already."""
        self.window = window
        return not self.requested


def _open_store(db: Path) -> Store | None:
    """The database, opened once for the whole app; a file Lanes cannot use is offered to be moved
    aside (then a fresh one is opened); None to quit."""
    from PySide6.QtWidgets import QMessageBox

    from engine.errors import NewerSchemaError, NotLanesDatabaseError, StoreError
    from engine.store.store import Store

    try:
        return Store(db)
    except (NotLanesDatabaseError, NewerSchemaError) as exc:
        if not _offer_move_aside(db, str(exc)):
            return None
    except StoreError as exc:  # locked, unreadable folder, a failed upgrade...: moving would not help
        QMessageBox.critical(None, "Lanes cannot open its database", str(exc))
        return None
    try:
        return Store(db)
    except StoreError as exc:
        QMessageBox.critical(None, "Lanes cannot open its database", str(exc))
        return None


def _offer_move_aside(db: Path, reason: str) -> bool:
    """A database Lanes cannot use: offer to move it aside and start fresh; False to quit."""
    from PySide6.QtWidgets import QMessageBox

    from engine.store.db import move_aside

    box = QMessageBox(QMessageBox.Icon.Warning, "Lanes cannot open its database", reason)
    move = box.addButton("Move It Aside and Start Fresh", QMessageBox.ButtonRole.AcceptRole)
    box.addButton("Quit", QMessageBox.ButtonRole.RejectRole)
    box.exec()
    if box.clickedButton() is not move:
        return False
    try:
        moved = move_aside(db)
    except OSError as exc:
        QMessageBox.critical(None, "Could not move the database", f"{db}: {exc}")
        return False
    QMessageBox.information(None, "Moved aside", f"The old file is kept, unchanged, as {moved}.")
    return True


if __name__ == "__main__":
    sys.exit(main())
