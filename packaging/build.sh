#!/usr/bin/env bash
# Build Lanes for the platform this runs on (what `make package` runs):
#   macOS: dist/Lanes.app (and the one-folder dist/Lanes/ it is made from)
#   Linux: dist/Lanes/ (run dist/Lanes/Lanes)
# Then say how long it took, how big it is, and how to check it (--self-test).
# PY: the Python with the dependencies and PyInstaller (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-.venv/bin/python}

if ! "$PY" -c 'import PyInstaller' 2>/dev/null; then
  echo "ERROR: PyInstaller is not installed in $PY (it is in the dev extras: run \`make setup\`)" >&2
  exit 1
fi
case "$(uname -s)" in
  Darwin)
    if [ "$(uname -m)" != arm64 ]; then
      echo "ERROR: Lanes.app is built for Apple Silicon: run this on an arm64 Mac (MLX has no Intel build)" >&2
      exit 1
    fi
    OUT=dist/Lanes.app; RUN="dist/Lanes.app/Contents/MacOS/Lanes";;
  Linux)
    OUT=dist/Lanes; RUN="dist/Lanes/Lanes";;
  *)
    echo "ERROR: no Lanes build for $(uname -s) (macOS arm64 and Linux only)" >&2
    exit 1;;
esac

start=$(date +%s)
# --noconfirm: replace the previous dist/Lanes* without asking. build/ keeps PyInstaller's cache.
"$PY" -m PyInstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller packaging/lanes.spec
secs=$(( $(date +%s) - start ))

echo "Built $OUT in $((secs / 60))m$((secs % 60))s; size $(du -sh "$OUT" | cut -f1)"
echo "Check it: QT_QPA_PLATFORM=offscreen $RUN --self-test"
