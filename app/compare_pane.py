"""The comparison pane: one request answered with own copy rates off and on (and optionally with no
drafts), side by side, streaming live; then whether the tokens are equal, tok/s per repeat with the
median, spread and ratio, draft rows by source, and the "on" run's copy rate per round.

The engine side (``engine/service/compare.py``, run by ``ChatService.start_comparison``) makes it fair: each
run is a fresh stream from the same copy history and Recall, one at a time, the order alternated
over the repeats. Results are saved by the store; the pane lists past ones (newest first) and exports
the shown one as Markdown or JSON. Every table, ratio and sentence here comes from the comparison's
A/B report (``engine.store.ab_report.ABReport``), the same one ``lanes compare`` and transcripts show.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Slot
from PySide6.QtGui import QCloseEvent, QKeyEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.compare_parts import (
    LiveRun,
    SideColumn,
    json_report,
    markdown_report,
    marked_spans,
    past_label,
    run_spans,
)
from app.controller import REPAINT_MS, ChatController
from app.rate_chart import RateChart
from app.theme import FOCUS_RING
from engine.drafts.copy_rates import DOUBT_PRIOR
from engine.events import Event, Failed, Finished, RoundStats, Tokens
from engine.service.compare import CompareSpec, rate_trajectory
from engine.service.comparisons import report_of
from engine.service.spans import origin_spans
from engine.store.ab_report import ABReport, Run
from engine.store.records import Comparison

TITLE_WIDTH = 280  # pixels of the conversation's title on its checkbox, beside the run's options


class ComparePane(QWidget):
    """Compare own copy rates off / on (/ plain) for a new prompt or a conversation's next message."""

    def __init__(self, controller: ChatController, conversation_id: int | None = None, max_tokens: int = 256,
                 parent: QWidget | None = None, title: str = "") -> None:
        super().__init__(parent, Qt.WindowType.Window)
        self.controller = controller
        self.conversation_id: int | None = None
        self.running = False
        self._chart_dirty = False
        self.spec: CompareSpec | None = None
        self.runs: list[Run] = []
        self.shown: Comparison | None = None
        self.columns: dict[str, SideColumn] = {}
        self._live: dict[str, LiveRun] = {}  # by side: its run streaming now (or last)
        self._dirty: set[str] = set()
        self._past: dict[int, Comparison] = {}
        self._timer = QTimer(self)
        self._timer.setInterval(REPAINT_MS)
        self._timer.timeout.connect(self._flush)
        self.setWindowTitle("Compare Own Copy Rates")
        self.setAccessibleName("Compare own copy rates")
        room = self.screen().availableGeometry()  # fits a small screen: at most 90% of it
        self.resize(min(1200, int(room.width() * 0.9)), min(880, int(room.height() * 0.9)))
        self._build(max_tokens)
        c = controller
        c.comparisonBegun.connect(self._begun)
        c.comparisonEvent.connect(self._event)
        c.comparisonRunDone.connect(self._run_done)
        c.comparisonSaved.connect(self._saved)
        c.comparisonFailed.connect(self._failed)
        self.set_conversation(conversation_id, title)
        self._set_busy(False)
        c.list_comparisons(self._listed)

    def _build(self, max_tokens: int) -> None:
        self.prompt = QPlainTextEdit()
        self.prompt.setAccessibleName("Prompt")
        self.prompt.setMaximumHeight(72)
        self.use_conversation = QCheckBox()
        self.use_conversation.setAccessibleName("Use the conversation")
        self.use_conversation.toggled.connect(self._update_placeholder)
        self.repeats = QSpinBox()
        self.repeats.setRange(1, 10)
        self.repeats.setValue(3)
        self.repeats.setAccessibleName("Repeats")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 32768)
        self.max_tokens.setValue(max_tokens)
        self.max_tokens.setAccessibleName("Max tokens")
        self.plain = QCheckBox("Also run without drafts")
        self.plain.setAccessibleName("Also run without drafts")
        self.run_button = QPushButton("Run")
        self.run_button.setAccessibleName("Run the comparison")
        self.run_button.clicked.connect(self.run)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setAccessibleName("Stop the comparison")
        self.stop_button.clicked.connect(self.stop)
        self.status = QLabel("")
        self.status.setAccessibleName("Comparison status")
        self.status.setWordWrap(True)

        options = QHBoxLayout()
        options.addWidget(self.use_conversation)
        for text, spin in (("Repeats", self.repeats), ("Max tokens", self.max_tokens)):
            label = QLabel(text)
            label.setBuddy(spin)
            label.setAccessibleName(text)
            options.addWidget(label)
            options.addWidget(spin)
        options.addWidget(self.plain)
        options.addStretch(1)
        options.addWidget(self.run_button)
        options.addWidget(self.stop_button)

        self.columns_box = QWidget()
        self.columns_box.setAccessibleName("Sides")
        self.columns_row = QHBoxLayout(self.columns_box)
        self.columns_row.setContentsMargins(0, 0, 0, 0)

        self.badge = QLabel("Run a comparison to see whether the sides are token-equal")
        self.badge.setAccessibleName("Token equality")
        self.difference = QLabel("")
        self.difference.hide()
        self.difference.setAccessibleName("First difference")
        self.difference.setWordWrap(True)
        self.ratio = QLabel("")
        self.ratio.setAccessibleName("Speed ratio")
        self.verdict = QLabel("")  # the comparison in one sentence, first
        self.verdict.setAccessibleName("Verdict")
        self.verdict.setWordWrap(True)
        self.verdict.setStyleSheet("font-size: 14px;")
        self.details_button = QToolButton()
        self.details_button.setText("Details: speeds by round, draft rows, copy rate")
        self.details_button.setCheckable(True)
        self.details_button.setAutoRaise(True)
        self.details_button.setArrowType(Qt.ArrowType.RightArrow)
        self.details_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.details_button.setAccessibleName("Show the details")
        self.details_button.setStyleSheet(FOCUS_RING)
        self.speed_table = _table("Tokens per second by round")
        self.rows_table = _table("Draft rows by source")
        self.chart = RateChart()
        results = QWidget()
        res = QVBoxLayout(results)
        for w in (self.verdict, self.badge, self.difference, self.details_button):
            res.addWidget(w)
        self.details = QWidget()  # the lab detail, behind the disclosure
        self.details.setAccessibleName("Details")
        detail = QVBoxLayout(self.details)
        detail.setContentsMargins(0, 0, 0, 0)
        detail.addWidget(self.ratio)
        tables = QVBoxLayout()
        tables.addWidget(self.speed_table)
        tables.addWidget(self.rows_table)
        row = QHBoxLayout()
        row.addLayout(tables, 1)
        row.addWidget(self.chart, 1)
        detail.addLayout(row, 1)
        self.details.hide()
        self.details_button.toggled.connect(self._show_details)
        res.addWidget(self.details, 1)
        res.addStretch(1)  # while the details are hidden, the lines above stay together at the top
        self._results = res
        results_scroll = QScrollArea()
        results_scroll.setWidgetResizable(True)
        results_scroll.setWidget(results)
        results_scroll.setAccessibleName("Results")

        self.past = QListWidget()
        self.past.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # long labels elide
        self.past.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.past.setAccessibleName("Past comparisons")
        self.past.currentItemChanged.connect(self._past_selected)
        self.export_md = QPushButton("Export Markdown…")
        self.export_md.setAccessibleName("Export the comparison as Markdown")
        self.export_md.clicked.connect(lambda: self.export("md"))
        self.export_json = QPushButton("Export JSON…")
        self.export_json.setAccessibleName("Export the comparison as JSON")
        self.export_json.clicked.connect(lambda: self.export("json"))
        side = QWidget()
        side_col = QVBoxLayout(side)
        past_label = QLabel("Past comparisons (newest first)")
        past_label.setBuddy(self.past)
        side_col.addWidget(past_label)
        side_col.addWidget(self.past, 1)
        side_col.addWidget(self.export_md)
        side_col.addWidget(self.export_json)

        bottom = QSplitter(Qt.Orientation.Horizontal)
        bottom.addWidget(results_scroll)
        bottom.addWidget(side)
        bottom.setStretchFactor(0, 3)
        bottom.setStretchFactor(1, 1)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.columns_box)
        split.addWidget(bottom)
        split.setSizes([380, 460])
        layout = QVBoxLayout(self)
        layout.addWidget(self.prompt)
        layout.addLayout(options)
        layout.addWidget(self.status)
        layout.addWidget(split, 1)

    # -- setup -------------------------------------------------------------------------------------
    def set_conversation(self, conversation_id: int | None, title: str = "") -> None:
        """Offer ``conversation_id``'s turns and copy history as the request's start (None: a new prompt),
        naming it by ``title`` (as the sidebar shows it), cut to fit beside the options."""
        self.conversation_id = conversation_id
        self.use_conversation.setVisible(conversation_id is not None)
        name = title or "New conversation"
        shown = self.use_conversation.fontMetrics().elidedText(name, Qt.TextElideMode.ElideRight, TITLE_WIDTH)
        self.use_conversation.setText(f"Use “{shown}”" if conversation_id is not None else "")
        self.use_conversation.setToolTip(f"Start from “{name}”: its turns and its copy history"
                                         if conversation_id is not None else "")
        self.use_conversation.setChecked(conversation_id is not None)
        self._update_placeholder()

    def _update_placeholder(self) -> None:
        if self.conversation_id is not None and self.use_conversation.isChecked():
            self.prompt.setPlaceholderText("The next message (leave empty to answer the conversation's last "
                                           "message again)")
        else:
            self.prompt.setPlaceholderText("A prompt to answer with own copy rates off and on")

    def _set_busy(self, busy: bool) -> None:
        self.running = busy
        self.run_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        self.past.setEnabled(not busy)
        for w in (self.prompt, self.use_conversation, self.repeats, self.max_tokens, self.plain):
            w.setEnabled(not busy)
        self.export_md.setEnabled(not busy and self.shown is not None)
        self.export_json.setEnabled(not busy and self.shown is not None)
        if busy:
            self._timer.start()
        else:
            self._timer.stop()

    def _ensure_columns(self, sides: Sequence[str]) -> None:
        if tuple(self.columns) == tuple(sides):
            return
        for col in self.columns.values():
            self.columns_row.removeWidget(col)
            col.deleteLater()
        self.columns = {s: SideColumn(s) for s in sides}
        for col in self.columns.values():
            self.columns_row.addWidget(col, 1)

    # -- running -----------------------------------------------------------------------------------
    def run(self) -> None:
        """Start the comparison with the controls' settings (nothing waits here)."""
        if self.running:
            return
        text = self.prompt.toPlainText()
        use_conv = self.conversation_id is not None and self.use_conversation.isChecked()
        if not use_conv and not text.strip():
            self.status.setText("Type a prompt to compare.")
            return
        started = self.controller.start_comparison(
            prompt=text if text.strip() else None, conversation_id=self.conversation_id if use_conv else None,
            max_tokens=self.max_tokens.value(), repeats=self.repeats.value(), plain=self.plain.isChecked())
        if not started:
            self.status.setText("Another comparison is running; stop it or wait for it first.")
            return
        self.runs, self._live, self._dirty, self.shown, self.spec = [], {}, set(), None, None
        self._set_busy(True)
        self.status.setText("Starting…")

    def stop(self) -> None:
        if self.running:
            self.controller.stop_comparison()
            self.stop_button.setEnabled(False)
            self.status.setText("Stopping… (what ran is saved, marked cancelled)")

    @Slot(object)
    def _begun(self, spec: CompareSpec) -> None:
        if not self.running:
            return  # another pane's comparison
        self.spec = spec
        self._ensure_columns(spec.sides)
        for col in self.columns.values():
            col.view.show_spans([])
            col.speed.setText("–")
            col.showing.setText("waiting")
            col.set_results([])
        self._show_results(ABReport.of([], spec.sides, spec.repeats))
        wait = "" if self.controller.info is not None else " (waiting for the model)"
        self.status.setText(f"Running {spec.repeats} repeat(s) of {', '.join(spec.sides)}, one run at a time, "
                            f"the order alternating{wait}…")

    @Slot(object, object)
    def _event(self, run: Run, ev: Event) -> None:
        if not self.running or run.side not in self.columns:
            return
        live = self._live.get(run.side)
        if live is None or live.repeat != run.repeat:
            live = self._live[run.side] = LiveRun(run.repeat)
        if isinstance(ev, Tokens):
            live.tokens += len(ev.tokens)
            live.add(origin_spans(self.controller.decode, ev.tokens, ev.origins, ev.text))
        elif isinstance(ev, Finished):
            live.state = "stopped" if ev.reason == "cancelled" else "complete"
            live.spans = run_spans(self.controller.decode, run) or live.spans
            self.columns[run.side].speed.setText(f"{ev.stats.tokens_per_s:.1f} tok/s")
        elif isinstance(ev, Failed):
            live.state = f"error: {ev.message}"
            self.columns[run.side].speed.setText("error")
        elif isinstance(ev, RoundStats) and run.side == "on":
            live.rounds.append(ev)  # the rate chart follows the on side round by round
            self._chart_dirty = True
        else:
            return
        self._dirty.add(run.side)

    def _flush(self) -> None:
        dirty, self._dirty = self._dirty, set()
        repeats = self.spec.repeats if self.spec else 0
        for side in dirty:
            live, col = self._live.get(side), self.columns.get(side)
            if live is None or col is None:
                continue
            col.view.show_spans(live.spans)
            col.showing.setText(f"repeat {live.repeat + 1} of {repeats} · {live.state}")
            if side == "on" and self._chart_dirty and self.spec is not None:
                self._chart_dirty = False  # redrawn when a round came in, not at every repaint
                info = self.controller.info
                prior, doubt = (info.copy_rate, info.doubt_prior) if info is not None else (0.94, DOUBT_PRIOR)
                self.chart.set_points(rate_trajectory(self.spec.copy_history, prior, live.rounds, doubt),
                                      f"Copy rate per round (own copy rates on, repeat {live.repeat + 1}, live)")
            if live.state == "streaming":
                col.speed.setText(f"{live.tokens / max(time.monotonic() - live.started, 1e-3):.1f} tok/s (live)")

    @Slot(object)
    def _run_done(self, run: Run) -> None:
        if not self.running or self.spec is None:
            return
        self.runs.append(run)
        col = self.columns.get(run.side)
        if col is not None:
            col.set_results([r for r in self.runs if r.side == run.side])
        self._show_results(ABReport.of(self.runs, self.spec.sides, self.spec.repeats))

    @Slot(object)
    def _saved(self, comparison: Comparison) -> None:
        if not self.running:
            self._add_past(comparison, select=False)
            return
        self._flush()
        self.shown = comparison
        self._set_busy(False)
        self._add_past(comparison, select=True)
        self.show_comparison(comparison)
        self.status.setText(f"Saved as comparison {comparison.id} ({comparison.status}).")

    @Slot(str)
    def _failed(self, reason: str) -> None:
        if self.running:
            self._set_busy(False)
            self.status.setText(f"The comparison could not run: {reason}")

    # -- results -----------------------------------------------------------------------------------
    def show_comparison(self, c: Comparison) -> None:
        """Show a finished comparison: each side's last run, its results, the first difference."""
        self.shown = c
        report = report_of(c)
        self._ensure_columns(report.sides)
        by = {s.side: s for s in report.summaries}
        for side, col in self.columns.items():
            mine = sorted((r for r in report.runs if r.side == side), key=lambda r: r.repeat)
            col.set_results(mine)
            s = by.get(side)
            col.speed.setText(f"{s.median:.1f} tok/s (median)" if s is not None and s.tok_s else "–")
            col.showing.setText(f"repeat {mine[-1].repeat + 1} of {report.repeats} · {mine[-1].status}" if mine else "")
            col.view.show_spans(run_spans(self.controller.decode, mine[-1]) if mine else [])
        self._show_results(report)
        self._mark_difference(report)
        self._set_busy(self.running)

    def _mark_difference(self, report: ABReport) -> None:
        diff = report.difference
        if diff is None:
            return
        ref = next(r for r in report.runs if r.status == "complete")
        other = next(r for r in report.runs if (r.side, r.repeat) == (diff.side, diff.repeat))
        for run in (ref, other):
            col = self.columns.get(run.side)
            marked = marked_spans(self.controller.decode, run, diff.position)
            if col is None or marked is None:
                continue
            spans, start, length = marked
            col.view.show_spans(spans, (start, length))
            col.showing.setText(f"repeat {run.repeat + 1} · first difference at token {diff.position}")

    def _show_results(self, report: ABReport) -> None:
        done = [r for r in report.runs if r.status == "complete"]
        diff = report.difference
        self.difference.setVisible(diff is not None)
        self.difference.setText("")
        if len(done) < 2:
            self._badge("Not enough finished runs to compare tokens yet", "")
        elif report.token_equal is None:
            self._badge("Token ids not saved for every finished run: token equality unknown", "")
        elif diff is None:
            self._badge(f"✓ Token-equal: all {len(done)} finished runs gave the same tokens", "#2e7d32")
        else:
            self._badge("✗ Tokens differ", "#c62828")
            self.difference.setText(
                f"first difference at token {diff.position}: {diff.side} repeat {diff.repeat + 1} has "
                f"{self._token(diff.got)} where {done[0].side} repeat {done[0].repeat + 1} has "
                f"{self._token(diff.expected)}")
        self.verdict.setText(report.verdict())
        header, rows, _notes = report.table()  # the table lanes compare prints, with each side's ratio to off
        ratios = report.ratios()
        _fill(self.speed_table, [*header[1:], "vs off"], [r[0] for r in rows],
              [[*r[1:], f"{ratios[r[0]]:.2f}×" if r[0] in ratios else "–"] for r in rows])
        self.ratio.setText(" · ".join(f"{side} / off: {v:.2f}× (median tok/s)"
                                      for side, v in ratios.items() if side != "off"))
        summaries = report.summaries
        rows_by = [(s.side, src, c) for s in summaries for src, c in s.rows.items() if c["tested"] or c["granted"]]
        _fill(self.rows_table, ["tested", "accepted", "wasted", "granted"],
              [f"{side} · {src}" for side, src, _ in rows_by],
              [[str(c["tested"]), str(c["accepted"]), str(c["wasted"]), str(c["granted"])] for *_, c in rows_by])
        on_runs = [r for r in report.runs if r.side == "on" and r.rates]
        if on_runs:
            self.chart.set_points(on_runs[-1].rates, f"Copy rate per round (own copy rates on, repeat "
                                                     f"{on_runs[-1].repeat + 1})")
        else:
            self.chart.set_points([], "Copy rate per round (own copy rates on): no rounds with a copy window")

    def _show_details(self, on: bool) -> None:
        self.details.setVisible(on)
        self._results.setStretch(self._results.count() - 1, 0 if on else 1)
        self.details_button.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)

    def _badge(self, text: str, colour: str) -> None:
        self.badge.setText(text)
        self.badge.setStyleSheet(f"font-weight: 600; color: {colour};" if colour else "font-weight: 600;")

    def _token(self, token: int | None) -> str:
        if token is None:
            return "no token (it ended)"
        text = self.controller.decode([token])
        return f"{text!r} (id {token})" if text else f"token id {token}"

    # -- past comparisons and export ---------------------------------------------------------------
    def _listed(self, comparisons: list[Comparison]) -> None:
        for c in comparisons:
            self._past.setdefault(c.id, c)
        self._refresh_past(self.shown.id if self.shown else None)

    def _add_past(self, c: Comparison, select: bool) -> None:
        self._past[c.id] = c
        self._refresh_past(c.id if select else (self.shown.id if self.shown else None))

    def _refresh_past(self, selected: int | None) -> None:
        self.past.blockSignals(True)
        self.past.clear()
        for cid in sorted(self._past, reverse=True):
            item = QListWidgetItem(past_label(self._past[cid]))
            item.setData(Qt.ItemDataRole.UserRole, cid)
            self.past.addItem(item)
            if cid == selected:
                self.past.setCurrentItem(item)
        self.past.blockSignals(False)

    def past_ids(self) -> list[int]:
        return [self.past.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.past.count())]

    def _past_selected(self, item: QListWidgetItem | None, _previous: QListWidgetItem | None = None) -> None:
        if item is None or self.running:
            return
        c = self._past.get(item.data(Qt.ItemDataRole.UserRole))
        if c is not None:
            self.show_comparison(c)
            self.status.setText(f"Comparison {c.id} ({c.status}).")

    def export(self, fmt: str) -> None:
        """Ask where, then write the shown comparison as Markdown (``md``) or JSON (``json``)."""
        if self.shown is None:
            return
        kind = "Markdown (*.md)" if fmt == "md" else "JSON (*.json)"
        path, _chosen = QFileDialog.getSaveFileName(self, "Export Comparison", f"comparison-{self.shown.id}.{fmt}", kind)
        if path:
            self.export_to(Path(path), fmt)

    def export_to(self, path: Path, fmt: str) -> None:
        """Write the shown comparison to ``path`` on the store thread (the GUI never waits for the disk)."""
        if self.shown is None:
            return
        text = markdown_report(self.shown) if fmt == "md" else json_report(self.shown)
        self.controller.store_call(lambda _s: path.write_text(text, encoding="utf-8"),
                                   lambda _n: self.status.setText(f"Exported comparison to {path}"),
                                   lambda exc: self.status.setText(f"Export failed: {exc}"))

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() == Qt.Key.Key_Escape:  # Esc closes, as in a dialog (closing hides it: a run goes on)
            self.close()
            return
        super().keyPressEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Closing only hides the pane: a running comparison goes on, and the menu shows it again."""
        self._flush()
        event.accept()


def _table(name: str) -> QTableWidget:
    t = QTableWidget()
    t.setAccessibleName(name)
    t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    t.setMinimumHeight(110)
    return t


def _fill(table: QTableWidget, heads: list[str], rows: list[str], cells: list[list[str]]) -> None:
    table.clear()
    table.setColumnCount(len(heads))
    table.setRowCount(len(rows))
    table.setHorizontalHeaderLabels(heads)
    table.setVerticalHeaderLabels(rows)
    for i, row in enumerate(cells):
        for j, text in enumerate(row):
            item = QTableWidgetItem(text)
            item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            table.setItem(i, j, item)
    table.resizeColumnsToContents()


def open_compare_pane(controller: ChatController, conversation_id: int | None, max_tokens: int = 256,
                      parent: QWidget | None = None, title: str = "") -> ComparePane:
    """Show the window's comparison pane (made on first use), offering ``conversation_id`` (named
    ``title``) unless a comparison is running in it."""
    pane = parent.findChild(ComparePane) if parent is not None else None
    if pane is None:
        pane = ComparePane(controller, conversation_id, max_tokens, parent, title)
    elif not pane.running:
        pane.set_conversation(conversation_id, title)
    pane.show()
    pane.raise_()
    pane.activateWindow()
    return pane
