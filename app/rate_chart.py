"""A small line chart of copy rates: x is the round (counted from the run's start), y the source's copy
rate (0..1) after that round's window was verified, one line per source (``engine.service.compare.Run.rates``
of an "on" run)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from PySide6.QtCharts import QChart, QChartView, QLineSeries, QValueAxis
from PySide6.QtCore import QMargins, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QWidget

from app.theme import is_dark


class RateChart(QChartView):
    """Each source's copy rate per round; ``set_points`` replaces what is drawn."""

    def __init__(self, title: str = "Copy rate per round (own copy rates on)", parent: QWidget | None = None) -> None:
        chart = QChart()
        super().__init__(chart, parent)
        self._chart = chart
        chart.setTitle(title)
        chart.setMargins(QMargins(4, 4, 4, 4))
        chart.legend().setVisible(True)
        chart.legend().setAlignment(Qt.AlignmentFlag.AlignBottom)
        if is_dark(self):
            chart.setTheme(QChart.ChartTheme.ChartThemeDark)
        self.axis_x = QValueAxis()
        self.axis_x.setTitleText("round")
        self.axis_x.setLabelFormat("%d")
        self.axis_x.setTickType(QValueAxis.TickType.TicksDynamic)
        self.axis_y = QValueAxis()
        self.axis_y.setTitleText("copy rate")
        self.axis_y.setRange(0.0, 1.0)
        self.axis_y.setLabelFormat("%.2f")
        chart.addAxis(self.axis_x, Qt.AlignmentFlag.AlignBottom)
        chart.addAxis(self.axis_y, Qt.AlignmentFlag.AlignLeft)
        self.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.setMinimumHeight(220)
        self.setAccessibleName("Copy rate per round chart")
        self.set_points([])

    def set_points(self, points: Sequence[Mapping[str, Any]], title: str | None = None) -> None:
        """Draw ``points`` ({"round", "source", "rate"} each), one line series per source."""
        chart = self._chart
        if title is not None:
            chart.setTitle(title)
        chart.removeAllSeries()
        by_source: dict[str, list[tuple[int, float]]] = {}
        for p in points:
            by_source.setdefault(str(p["source"]), []).append((int(p["round"]), float(p["rate"])))
        for source, values in by_source.items():
            series = QLineSeries()
            series.setName(source)
            series.setPointsVisible(True)  # a run may verify only one window
            for rnd, rate in values:
                series.append(float(rnd), rate)
            chart.addSeries(series)
            series.attachAxis(self.axis_x)
            series.attachAxis(self.axis_y)
        rounds = [rnd for values in by_source.values() for rnd, _ in values] or [1]
        first, last = min(rounds), max(rounds)  # the engine's round numbers
        if first == last:  # one point: keep it off the plot's edges
            first, last = first - 1, last + 1
        self.axis_x.setRange(float(first), float(last))
        self.axis_x.setTickAnchor(float(first))
        self.axis_x.setTickInterval(float(max(1, math.ceil((last - first) / 7))))  # whole rounds, <= 8 ticks
        if by_source:
            described = "; ".join(f"{s}: {len(v)} rounds, last rate {v[-1][1]:.2f}" for s, v in by_source.items())
        else:
            described = "no copy windows were verified"
        self.setAccessibleDescription(described)
        self.setToolTip(described)

    def series_names(self) -> list[str]:
        """The sources drawn, in order (for tests and the accessible description)."""
        return [s.name() for s in self._chart.series()]

    def points(self, source: str) -> list[tuple[float, float]]:
        """The (round, rate) points drawn for ``source``."""
        for s in self._chart.series():
            if s.name() == source and isinstance(s, QLineSeries):
                return [(p.x(), p.y()) for p in s.points()]
        return []
