"""Draw the Lanes icon: resources/icon.png (1024 px) and resources/icon.icns (macOS, every size).

    .venv/bin/python packaging/make_icon.py

Three replies streaming side by side in shared rounds, tinted like the window's token origins: the
model's own tokens (white), copied from the conversation (teal), recalled from another (violet).
Qt draws it (no Pillow, no iconutil), so it runs on Linux too; the outputs are committed, and the
build only reads them. The .icns holds PNG images, which macOS reads since 10.7.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QImage, QLinearGradient, QPainter, QPainterPath

ROOT = Path(__file__).resolve().parents[1]
NAVY_TOP, NAVY_BOTTOM = QColor("#23345f"), QColor("#0d1326")
WHITE, TEAL, VIOLET = QColor("#f8fafc"), QColor("#2dd4bf"), QColor("#a78bfa")
# Each lane: (colour of each segment, as fractions of the lane's width).
LANES = (
    ((WHITE, 0.30), (TEAL, 0.38)),
    ((WHITE, 0.20), (VIOLET, 0.30), (WHITE, 0.20)),
    ((TEAL, 0.46), (WHITE, 0.20)),
)
# .icns element types holding PNG data, by pixel size (Apple's "ic07".."ic14", "icp4".."icp6").
ICNS_TYPES = (
    (b"icp4", 16),
    (b"icp5", 32),
    (b"icp6", 64),
    (b"ic07", 128),
    (b"ic08", 256),
    (b"ic09", 512),
    (b"ic10", 1024),
    (b"ic11", 32),
    (b"ic12", 64),
    (b"ic13", 256),
    (b"ic14", 512),
)


def render(size: int) -> QImage:
    """The icon at ``size`` pixels square, drawn afresh (not scaled) so small sizes stay sharp."""
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    p = QPainter(image)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    s = size / 1024.0
    # macOS icon grid: an 824 px rounded square centred on the 1024 px canvas.
    body = QRectF(100 * s, 100 * s, 824 * s, 824 * s)
    gradient = QLinearGradient(body.topLeft(), body.bottomLeft())
    gradient.setColorAt(0.0, NAVY_TOP)
    gradient.setColorAt(1.0, NAVY_BOTTOM)
    path = QPainterPath()
    path.addRoundedRect(body, 185 * s, 185 * s)
    p.fillPath(path, gradient)
    left, width = 210 * s, 604 * s
    thickness = 92 * s
    for i, segments in enumerate(LANES):
        y = 300 * s + i * 212 * s
        track = QRectF(left, y, width, thickness)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(QColor(255, 255, 255, 28))
        p.drawRoundedRect(track, thickness / 2, thickness / 2)
        x = left
        for colour, fraction in segments:
            seg = QRectF(x, y, width * fraction, thickness)
            p.setBrush(colour)
            p.drawRoundedRect(seg.adjusted(4 * s, 0, -4 * s, 0), thickness / 2, thickness / 2)
            x += width * fraction
        # the cursor where this reply has got to
        p.setBrush(WHITE)
        p.drawEllipse(QPointF(x + 34 * s, y + thickness / 2), 18 * s, 18 * s)
    p.end()
    return image


def png_bytes(image: QImage) -> bytes:
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    if not image.save(buffer, "PNG"):
        raise RuntimeError("Qt could not encode a PNG")
    buffer.close()
    return bytes(data.data())


def icns_bytes(pngs: dict[int, bytes]) -> bytes:
    """An .icns file: 'icns' + total length, then (type, length, PNG data) elements, big-endian."""
    body = b"".join(kind + struct.pack(">I", 8 + len(pngs[px])) + pngs[px] for kind, px in ICNS_TYPES)
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def main() -> int:
    out = ROOT / "resources"
    pngs = {px: png_bytes(render(px)) for px in sorted({px for _, px in ICNS_TYPES})}
    (out / "icon.png").write_bytes(pngs[1024])
    (out / "icon.icns").write_bytes(icns_bytes(pngs))
    print(f"wrote {out / 'icon.png'} and {out / 'icon.icns'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
