"""``lanes-app`` (what ``make run`` opens): the chat window on the embedded model, or the one chosen
in Settings. The window shows at once; the model loads on the engine thread."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from engine import blas


def main(argv: list[str] | None = None) -> int:
    blas.ensure_fast_blas()  # Linux: re-executes with OpenBLAS preloaded, before MLX loads
    parser = argparse.ArgumentParser(prog="lanes-app", description="Lanes: the chat window")
    parser.add_argument("--data-dir", default=None, help="folder of the database (overrides Settings)")
    parser.add_argument("--model", default=None, help="model to load (overrides Settings)")
    parser.add_argument("--self-test", action="store_true",
                        help="check this build offscreen (Qt, the model, a database) and exit")
    args = parser.parse_args(argv)
    if args.self_test:
        from app import selftest

        return selftest.main(model=args.model)

    import qasync
    from PySide6.QtWidgets import QApplication

    from app.controller import ChatController
    from app.main_window import MainWindow
    from app.preferences import load_preferences, preferences_path
    from engine.errors import StoreError
    from engine.store import paths

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Lanes")
    app.setOrganizationName("Lanes")
    prefs, warnings = load_preferences()
    db = paths.database_path(args.data_dir or prefs.data_dir)
    try:
        from engine.store.store import Store

        Store(db).close()  # a foreign or newer file: say so now, before any window
    except StoreError as exc:
        if not _offer_move_aside(db, str(exc)):
            return 2
    controller = ChatController(db, args.model or prefs.model)
    window = MainWindow(controller, prefs, preferences_path())
    for w in warnings:
        window.statusBar().showMessage(w, 10000)
    window.show()

    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    closed = asyncio.Event()
    app.lastWindowClosed.connect(closed.set)
    _close_on_signals(window)
    try:
        with loop:
            loop.run_until_complete(closed.wait())
    finally:
        if "mlx.core" in sys.modules:  # MLX wants every thread that used it to drop its streams
            sys.modules["mlx.core"].clear_streams()
    return 0


def _close_on_signals(window: object) -> None:
    """Ctrl-C (SIGINT) or SIGTERM in the terminal closes the window the normal way: replies are saved
    as partial and every thread is joined. Qt's loop runs in C++, so a 200 ms timer lets Python see
    the signal at all."""
    import signal

    from PySide6.QtCore import QTimer

    def close(_signum: int, _frame: object) -> None:
        QTimer.singleShot(0, window.close)  # type: ignore[attr-defined]

    signal.signal(signal.SIGINT, close)
    signal.signal(signal.SIGTERM, close)
    wake = QTimer(window)  # type: ignore[arg-type]
    wake.timeout.connect(lambda: None)
    wake.start(200)


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
    moved = move_aside(db)
    QMessageBox.information(None, "Moved aside", f"The old file is now {moved}.")
    return True


if __name__ == "__main__":
    sys.exit(main())
