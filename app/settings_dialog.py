"""The settings dialog: edits a copy of Preferences and refuses OK while ``validate()`` finds problems,
so a bad value is caught here with its reason rather than when the model loads or a reply starts."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPlainTextEdit,
    QProgressDialog,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.model_download import ModelDownload
from app.preferences import (
    MAX_TOKENS_RANGE,
    OWN_COPY_RATES,
    TEMPERATURE_RANGE,
    ModelKind,
    Preferences,
    model_kind,
    model_problem,
)
from engine.model.local_models import local_models
from engine.model.locate import EMBEDDED
from engine.store import paths

MODEL_KINDS: tuple[tuple[ModelKind, str], ...] = (
    ("embedded", "Embedded SmolLM2-135M"),
    ("path", "Local folder or .gguf file…"),
    ("hub", "Hugging Face cache entry"),
)
OWN_COPY_RATE_LABELS = {"family": "Family default", "on": "On", "off": "Off"}
OWN_COPY_RATES_TIP = (
    "Price copies from this conversation's own copy history instead of a fixed 0.94.\n"
    "Family default: whatever suits the model family. On: learn how often copies from this "
    "conversation land and grant drafts by that. Off: always assume 0.94."
)
RECALL_TIP = "Let replies copy text from your other conversations when it fits (Recall)."
DATA_NOTE = "A new data folder is used after Lanes restarts."


class SettingsDialog(QDialog):
    """Model, reply, Recall and data-folder settings; ``preferences()`` gives the edited copy."""

    def __init__(self, prefs: Preferences, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self._initial = prefs
        self._default_data_dir = str(paths.data_dir())

        layout = QVBoxLayout(self)
        layout.addWidget(self._model_group())
        layout.addWidget(self._reply_group())
        layout.addWidget(self._recall_group())
        layout.addWidget(self._data_group())
        layout.addWidget(self._appearance_group())

        self.download_status = QLabel()
        self.download_status.setAccessibleName("Download")
        self.download_status.setWordWrap(True)
        self.download_status.hide()
        layout.addWidget(self.download_status)

        self.problems = QLabel()
        self.problems.setObjectName("problems")
        self.problems.setWordWrap(True)
        self.problems.setTextFormat(Qt.TextFormat.PlainText)  # paths may hold < or &
        self.problems.setAccessibleName("Problems")
        layout.addWidget(self.problems)

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.ok_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        layout.addWidget(self.buttons)
        for button in self.findChildren(QPushButton):  # Enter means OK, never "open a file chooser"
            button.setAutoDefault(False)
        self.ok_button.setDefault(True)  # only once in the dialog: setDefault looks for its QDialog

        self._load(prefs)
        for signal in (self.model_kind.currentIndexChanged, self.model_path.textChanged,
                       self.model_repo.textChanged, self.system_prompt.textChanged,
                       self.temperature.valueChanged, self.top_p.valueChanged, self.max_tokens.valueChanged,
                       self.own_copy_rates.currentIndexChanged, self.recall.toggled, self.data_dir.textChanged):
            signal.connect(self._refresh)
        self._refresh()
        self.model_kind.setFocus()

    # -- building ------------------------------------------------------------------------------------
    def _appearance_group(self) -> QGroupBox:
        group = QGroupBox("Appearance")
        form = QFormLayout(group)
        self.theme = QComboBox()
        self.theme.setAccessibleName("Theme")
        for key, label in (("system", "As the system"), ("light", "Light"), ("dark", "Dark")):
            self.theme.addItem(label, key)
        form.addRow("Theme:", self.theme)
        return group

    def _model_group(self) -> QGroupBox:
        group = QGroupBox("Model")
        form = QFormLayout(group)
        self.model_kind = QComboBox()
        for kind, label in MODEL_KINDS:
            self.model_kind.addItem(label, kind)
        self.model_kind.setAccessibleName("Model")
        _add_row(form, "&Model:", self.model_kind)

        self.model_path = QLineEdit()
        self.model_path.setPlaceholderText("/path/to/model-folder or /path/to/model.gguf")
        self.model_path.setAccessibleName("Model folder or .gguf file")
        browse = QPushButton("&Browse")
        browse.setAccessibleName("Browse for a model")
        menu = QMenu(browse)
        menu.addAction("A .gguf file…", self._browse_model_file)
        menu.addAction("An mlx-lm folder…", self._browse_model_folder)
        browse.setMenu(menu)
        self._model_path_row = _with_button(self.model_path, browse)
        self.model_browse = browse
        _add_row(form, "Folder or &file:", self._model_path_row, buddy=self.model_path)

        self.model_repo = QLineEdit()
        self.model_repo.setPlaceholderText("owner/name, e.g. HuggingFaceTB/SmolLM2-360M-Instruct")
        self.model_repo.setAccessibleName("Hugging Face repository")
        self.model_repo.setToolTip("A model in the local Hugging Face cache, or one to download with Download.")
        self.download_button = QPushButton("&Download")
        self.download_button.setAccessibleName("Download the model from the Hugging Face Hub")
        self.download_button.setToolTip("Download this model from the Hugging Face Hub now (only when you ask)")
        self.download_button.clicked.connect(self.start_download)
        self.download: ModelDownload | None = None
        self.download_progress: QProgressDialog | None = None
        self._model_repo_row = _with_button(self.model_repo, self.download_button)
        _add_row(form, "&Repository:", self._model_repo_row, buddy=self.model_repo)
        self.on_machine = QListWidget()  # the models already here: choosing one fills the fields above
        self._fill_on_machine()
        _add_row(form, "On this &machine:", self.on_machine)
        self._model_form = form
        return group

    def _fill_on_machine(self) -> None:
        if not self.on_machine.accessibleName():
            self.on_machine.setAccessibleName("Models on this machine")
            self.on_machine.setMaximumHeight(self.fontMetrics().lineSpacing() * 6)
            self.on_machine.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # long names elide
            self.on_machine.setTextElideMode(Qt.TextElideMode.ElideRight)  # a local model's folder goes first
            self.on_machine.setMinimumWidth(self.fontMetrics().averageCharWidth() * 60)
            self.on_machine.itemActivated.connect(self._choose_local)
            self.on_machine.itemClicked.connect(self._choose_local)
        self.on_machine.clear()
        chosen = self._initial.model
        for m in local_models([Path(chosen)] if chosen and model_kind(chosen) == "path" else []):
            size = f"{m.size / 2**30:.1f} GB" if m.size >= 2**30 else f"{m.size / 2**20:.0f} MB"
            local = m.spec != EMBEDDED and model_kind(m.spec) == "path"
            name = ("SmolLM2-135M-Instruct (embedded)" if m.spec == EMBEDDED
                    else Path(m.spec).name if local else m.spec)
            item = QListWidgetItem(f"{name} — {m.family or 'unknown'} · {size}"
                                   + ("" if m.supported else " · not supported")
                                   + (f" · in {_short_path(str(Path(m.spec).parent))}" if local else ""))
            item.setData(Qt.ItemDataRole.UserRole, m.spec)
            item.setToolTip((f"{_short_path(m.spec)}\n" if local else "")
                            + ("Lanes runs it" if m.supported else f"Lanes cannot run it: {m.why}"))
            if not m.supported:
                item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled)
            self.on_machine.addItem(item)

    # -- downloading a model (only when asked) -------------------------------------------------------
    def start_download(self) -> None:
        repo = self.model_repo.text().strip()
        if not repo or self.download is not None:
            return
        self.download = ModelDownload(repo, parent=self)
        progress = QProgressDialog(f"Downloading {repo}…", "Cancel", 0, 1000, self)
        progress.setWindowTitle("Download Model")
        progress.setMinimumDuration(0)
        progress.canceled.connect(self.download.cancel)
        self.download_progress = progress
        self.download.progress.connect(self._download_progress)
        self.download.finished.connect(self._downloaded)
        self.download.failed.connect(lambda why: self._download_ended(f"Not downloaded: {why}"))
        self.download.cancelled.connect(lambda: self._download_ended(
            "Download stopped; the files that arrived whole are kept for the next try"))
        self.download.start()
        progress.show()

    def _download_progress(self, done: int, total: int, file: str) -> None:
        if self.download_progress is not None and total:
            self.download_progress.setValue(int(1000 * done / total))
            self.download_progress.setLabelText(
                f"Downloading {self.model_repo.text().strip()}: {done / 2**20:,.1f} of {total / 2**20:,.1f} MB ({file})")

    def _downloaded(self, repo: str) -> None:
        self._download_ended(f"Downloaded {repo}")
        self._fill_on_machine()
        self._refresh()

    def _download_ended(self, message: str) -> None:
        if self.download is not None:
            self.download.join()
            self.download = None
        if self.download_progress is not None:
            self.download_progress.reset()
            self.download_progress.close()
            self.download_progress = None
        self.download_status.setText(message)
        self.download_status.show()

    def done(self, result: int) -> None:
        if self.download is not None:  # closing stops a download and waits for its thread
            self.download.join()
            self.download = None
        super().done(result)

    def _choose_local(self, item: QListWidgetItem) -> None:
        spec = item.data(Qt.ItemDataRole.UserRole)
        if spec == EMBEDDED:
            self.model_kind.setCurrentIndex(self.model_kind.findData("embedded"))
        elif model_kind(spec) == "path":
            self.model_kind.setCurrentIndex(self.model_kind.findData("path"))
            self.model_path.setText(spec)
        else:
            self.model_kind.setCurrentIndex(self.model_kind.findData("hub"))
            self.model_repo.setText(spec)

    def _reply_group(self) -> QGroupBox:
        group = QGroupBox("Reply")
        form = QFormLayout(group)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setTabChangesFocus(True)  # Tab moves on, as everywhere else in the dialog
        self.system_prompt.setAccessibleName("System prompt")
        self.system_prompt.setMaximumHeight(self.fontMetrics().lineSpacing() * 5)
        _add_row(form, "S&ystem prompt:", self.system_prompt)

        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(*TEMPERATURE_RANGE)
        self.temperature.setSingleStep(0.1)
        self.temperature.setDecimals(2)
        self.temperature.setAccessibleName("Temperature")
        self.temperature.setToolTip("0 always picks the likeliest token; higher values vary the reply.")
        _add_row(form, "&Temperature:", self.temperature)

        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.05, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setDecimals(2)
        self.top_p.setAccessibleName("Top-p")
        self.top_p.setToolTip("Sample only from the likeliest tokens whose chances add up to this.")
        _add_row(form, "Top-&p:", self.top_p)

        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(*MAX_TOKENS_RANGE)
        self.max_tokens.setAccessibleName("Max tokens")
        self.max_tokens.setToolTip("The longest reply, in tokens.")
        _add_row(form, "Ma&x tokens:", self.max_tokens)

        self.own_copy_rates = QComboBox()
        for value in OWN_COPY_RATES:
            self.own_copy_rates.addItem(OWN_COPY_RATE_LABELS[value], value)
        self.own_copy_rates.setAccessibleName("Own copy rates")
        self.own_copy_rates.setToolTip(OWN_COPY_RATES_TIP)
        self.own_copy_rates.setAccessibleDescription(OWN_COPY_RATES_TIP)
        _add_row(form, "Own &copy rates:", self.own_copy_rates)
        return group

    def _recall_group(self) -> QGroupBox:
        group = QGroupBox("Recall")
        box = QVBoxLayout(group)
        self.recall = QCheckBox("Copy from &other conversations (Recall)")
        self.recall.setAccessibleName("Copy from other conversations (Recall)")
        self.recall.setToolTip(RECALL_TIP)
        box.addWidget(self.recall)
        return group

    def _data_group(self) -> QGroupBox:
        group = QGroupBox("Data")
        form = QFormLayout(group)
        self.data_dir = QLineEdit()
        self.data_dir.setAccessibleName("Data folder")
        self.data_dir.setToolTip(f"Where conversations are stored. Empty: {self._default_data_dir}")
        self.data_dir.setPlaceholderText(self._default_data_dir)
        browse = QPushButton("Bro&wse…")
        browse.setAccessibleName("Browse for a data folder")
        browse.clicked.connect(self._browse_data_dir)
        _add_row(form, "&Data folder:", _with_button(self.data_dir, browse), buddy=self.data_dir)

        self.show_data_dir = QPushButton("&Show in file manager")
        self.show_data_dir.setAccessibleName("Show the data folder in the file manager")
        self.show_data_dir.clicked.connect(self._show_data_dir)
        note = QLabel(DATA_NOTE)
        note.setWordWrap(True)
        form.addRow(note)
        form.addRow(self.show_data_dir)
        return group

    # -- values --------------------------------------------------------------------------------------
    def _load(self, prefs: Preferences) -> None:
        kind = model_kind(prefs.model)
        self.model_kind.setCurrentIndex(self.model_kind.findData(kind))
        if kind == "path":
            self.model_path.setText(prefs.model or "")
        elif kind == "hub":
            self.model_repo.setText(prefs.model or "")
        self.system_prompt.setPlainText(prefs.system_prompt)
        self.theme.setCurrentIndex(max(self.theme.findData(prefs.theme), 0))
        self.temperature.setValue(prefs.temperature)
        self.top_p.setValue(prefs.top_p)
        self.max_tokens.setValue(prefs.max_tokens)
        index = self.own_copy_rates.findData(prefs.own_copy_rates)
        self.own_copy_rates.setCurrentIndex(max(index, 0))
        self.recall.setChecked(prefs.recall_other_conversations)
        self.data_dir.setText(prefs.data_dir or self._default_data_dir)

    def preferences(self) -> Preferences:
        """The edited copy; fields the dialog does not show (window geometry, origins) are kept."""
        kind = self.model_kind.currentData()
        model = {"embedded": None, "path": self.model_path.text().strip(),
                 "hub": self.model_repo.text().strip()}[kind] or None
        data_dir = self.data_dir.text().strip()
        return dataclasses.replace(
            self._initial,
            model=model,
            system_prompt=self.system_prompt.toPlainText(),
            temperature=round(self.temperature.value(), 2),
            top_p=round(self.top_p.value(), 2),
            max_tokens=self.max_tokens.value(),
            own_copy_rates=self.own_copy_rates.currentData(),
            recall_other_conversations=self.recall.isChecked(),
            theme=self.theme.currentData(),
            # the default stays unpinned, so $LANES_DATA_DIR and the platform keep deciding it
            data_dir=None if data_dir in ("", self._default_data_dir) else data_dir,
        )

    def problems_found(self) -> list[str]:
        """``Preferences.validate()`` plus what only the dialog knows: which kind of model was chosen."""
        problems = self.preferences().validate()
        kind = self.model_kind.currentData()
        if kind == "path":
            extra = model_problem(self.model_path.text().strip())
        elif kind == "hub" and not self.model_repo.text().strip():
            extra = "Hugging Face repository is empty: enter one as owner/name."
        else:
            extra = None
        if extra and extra not in problems:
            problems.insert(0, extra)
        return problems

    def data_folder_url(self) -> QUrl:
        """What "Show in file manager" opens: the chosen data folder."""
        return QUrl.fromLocalFile(str(Path(self.data_dir.text().strip() or self._default_data_dir).expanduser()))

    def _refresh(self) -> None:
        kind = self.model_kind.currentData()
        self._model_form.setRowVisible(self._model_path_row, kind == "path")
        self._model_form.setRowVisible(self._model_repo_row, kind == "hub")
        self.download_button.setEnabled(bool(self.model_repo.text().strip()) and self.download is None)
        problems = self.problems_found()
        self.problems.setText("\n".join(f"• {p}" for p in problems))
        self.problems.setVisible(bool(problems))
        self.ok_button.setEnabled(not problems)
        self.show_data_dir.setEnabled(Path(self.data_folder_url().toLocalFile()).is_dir())

    # -- file choosers (non-native: the same on every platform, and scriptable) -----------------------
    def _start_dir(self, text: str) -> str:
        path = Path(text).expanduser() if text else Path.home()
        while not path.is_dir() and path != path.parent:
            path = path.parent
        return str(path)

    def _browse_model_file(self) -> None:
        chosen, _ = QFileDialog.getOpenFileName(
            self, "Choose a .gguf model", self._start_dir(self.model_path.text().strip()),
            "GGUF models (*.gguf);;All files (*)", options=QFileDialog.Option.DontUseNativeDialog)
        if chosen:
            self.model_path.setText(chosen)

    def _browse_model_folder(self) -> None:
        self._choose_folder("Choose an mlx-lm model folder", self.model_path)

    def _browse_data_dir(self) -> None:
        self._choose_folder("Choose the data folder", self.data_dir)

    def _choose_folder(self, title: str, field: QLineEdit) -> None:
        chosen = QFileDialog.getExistingDirectory(
            self, title, self._start_dir(field.text().strip()),
            QFileDialog.Option.DontUseNativeDialog | QFileDialog.Option.ShowDirsOnly)
        if chosen:
            field.setText(chosen)

    def _show_data_dir(self) -> None:
        QDesktopServices.openUrl(self.data_folder_url())


def _short_path(spec: str) -> str:
    """A path under the home folder as ~/..., anything else as it is."""
    home = str(Path.home())
    return "~" + spec[len(home):] if spec.startswith(home + os.sep) else spec


def _add_row(form: QFormLayout, text: str, field: QWidget, buddy: QWidget | None = None) -> QLabel:
    """A form row whose label's mnemonic focuses ``buddy`` (the field itself unless it is a wrapper)."""
    label = QLabel(text)
    label.setBuddy(buddy or field)
    form.addRow(label, field)
    return label


def _with_button(field: QWidget, button: QPushButton) -> QWidget:
    row = QWidget()
    box = QHBoxLayout(row)
    box.setContentsMargins(0, 0, 0, 0)
    box.addWidget(field, 1)
    box.addWidget(button)
    return row
