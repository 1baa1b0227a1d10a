"""PyInstaller's entry script for the Lanes bundle: the same program as ``lanes-app``.

``app.main`` stays an ordinary module (not ``__main__``), so the bundle runs exactly the code that
``make run`` does; ``Lanes --self-test`` checks the build (see app/selftest.py).
"""

import sys

from app.main import main

if __name__ == "__main__":
    sys.exit(main())
