"""The Server menu: the local OpenAI-compatible API over the window's own engine (``engine.server``).

Start / stop, the URL to copy, how many API requests run now (in the menu and the status bar),
and whether API requests are saved as conversations. Everything goes through the controller's
signals: the menu never touches the engine or the store.
"""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QLabel, QMainWindow, QMenu

from app.controller import ChatController


class ServerMenu(QObject):
    def __init__(self, window: QMainWindow, controller: ChatController) -> None:
        super().__init__(window)
        self.window, self.controller = window, controller
        self.url: str | None = None
        self.running = 0
        self.menu = QMenu("&Server", window)
        window.menuBar().addMenu(self.menu)
        self.toggle_action = QAction("Start API Server", self)
        self.toggle_action.triggered.connect(self.toggle)
        self.copy_action = QAction("Copy Server URL", self)
        self.copy_action.triggered.connect(self.copy_url)
        self.state_action = QAction("Not running", self)
        self.state_action.setEnabled(False)
        self.save_action = QAction("Save API Requests as Conversations", self, checkable=True)
        self.save_action.setToolTip("Off: requests from other programs leave no trace in your conversations")
        self.save_action.toggled.connect(controller.set_api_saves_conversations)
        for a in (self.toggle_action, self.copy_action, self.state_action):
            self.menu.addAction(a)
        self.menu.addSeparator()
        self.menu.addAction(self.save_action)
        self.label = QLabel()
        self.label.setAccessibleName("API server")
        window.statusBar().addPermanentWidget(self.label)
        controller.serverStarted.connect(self._started)
        controller.serverStopped.connect(self._stopped)
        controller.serverFailed.connect(self._failed)
        controller.serverRequests.connect(self._requests)
        controller.api_saves_conversations(self._show_saving)
        self._show()

    def toggle(self) -> None:
        self.toggle_action.setEnabled(False)  # until the server answers
        if self.url is None:
            self.state_action.setText("Starting… (once the model is loaded)")
            self.controller.start_server()
        else:
            self.controller.stop_server()

    def copy_url(self) -> None:
        if self.url is not None:
            QGuiApplication.clipboard().setText(self.url)
            self.window.statusBar().showMessage(f"Copied {self.url}", 4000)

    def _show_saving(self, on: bool) -> None:
        self.save_action.blockSignals(True)
        self.save_action.setChecked(on)
        self.save_action.blockSignals(False)

    def _started(self, url: str) -> None:
        self.url, self.running = url, 0
        self.window.statusBar().showMessage(f"Serving the model at {url} for programs on this computer", 8000)
        self._show()

    def _stopped(self, why: str) -> None:
        self.url, self.running = None, 0
        if why:
            self.window.statusBar().showMessage(f"API server stopped: {why}", 15000)
        self._show()

    def _failed(self, why: str) -> None:
        self.url = None
        self.window.statusBar().showMessage(f"The API server could not start: {why}", 15000)
        self._show()

    def _requests(self, running: int) -> None:
        self.running = running
        self._show()

    def _show(self) -> None:
        serving = self.url is not None
        self.toggle_action.setEnabled(True)
        self.toggle_action.setText("Stop API Server" if serving else "Start API Server")
        self.copy_action.setEnabled(serving)
        if serving:
            n = f"{self.running} request{'s' if self.running != 1 else ''} running"
            self.state_action.setText(f"Serving at {self.url} · {n}")
            self.label.setText(f"API: {n}")
            self.label.setToolTip(f"OpenAI-compatible API at {self.url}")
        else:
            self.state_action.setText("Not running")
            self.label.setText("")
        self.label.setVisible(serving)
