"""The Qt bindings themselves: a defect here crashes the app however correct its own code is."""

from __future__ import annotations

import sys

from PySide6.QtCore import QSize


def test_void_methods_keep_none_alive() -> None:
    # PySide6 6.12.0 on Python 3.11 returned None from void methods without a reference: None's
    # refcount fell by one a call and the process aborted ("deallocating None") mid-stream.
    size = QSize(1, 1)
    before = sys.getrefcount(None)
    for i in range(1000):
        size.setWidth(i)
    assert sys.getrefcount(None) >= before - 10
