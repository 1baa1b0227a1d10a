"""The engine stays free of the UI: nothing under engine/ may import Qt, qasync or app."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "engine"
FORBIDDEN = ("PySide6", "shiboken6", "qasync", "app")


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def _forbidden(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in FORBIDDEN)


ENGINE_FILES = sorted(ENGINE.rglob("*.py"))


def test_engine_has_sources() -> None:
    assert ENGINE_FILES, f"no Python files under {ENGINE}"


@pytest.mark.parametrize("path", ENGINE_FILES, ids=lambda p: str(p.relative_to(ENGINE.parent)))
def test_engine_module_imports_no_ui(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bad = [f"{path.name}:{line}: {module}" for line, module in _imported_modules(tree) if _forbidden(module)]
    assert not bad, "engine/ must not import the UI layer:\n" + "\n".join(bad)


# What each layer below the service may import of MLX and of the other layers (engine.errors,
# engine.events and engine.job_thread are shared vocabulary, free to all).
LAYER_RULES = {
    "drafts": ("mlx", "mlx_lm", "engine.model", "engine.passes", "engine.rounds", "engine.service",
               "engine.bench", "engine.store"),
    "store": ("mlx", "mlx_lm", "engine.model", "engine.passes", "engine.rounds", "engine.service",
              "engine.bench", "engine.drafts"),
    "model": ("engine.rounds", "engine.service", "engine.bench", "engine.store"),
    "passes": ("engine.rounds", "engine.service", "engine.bench", "engine.store"),
}


@pytest.mark.parametrize("layer", sorted(LAYER_RULES))
def test_each_layer_imports_only_what_is_below_it(layer: str) -> None:
    bad = []
    for path in sorted((ENGINE / layer).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, module in _imported_modules(tree):
            if any(module == m or module.startswith(m + ".") for m in LAYER_RULES[layer]):
                bad.append(f"{path.relative_to(ENGINE)}:{line}: {module}")
    assert not bad, f"engine/{layer} imports a layer it must not:\n" + "\n".join(bad)


def test_engine_top_level_holds_only_shared_vocabulary() -> None:
    """The engine is laid out by layer: its top level keeps the front door and what every layer shares."""
    top = sorted(p.name for p in ENGINE.glob("*.py"))
    assert top == ["__init__.py", "cli.py", "errors.py", "events.py", "job_thread.py"]


def test_no_engine_module_is_over_450_lines() -> None:
    long = [f"{p.relative_to(ENGINE)}: {n}" for p in ENGINE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450]
    assert not long, "files do one job and stay small:\n" + "\n".join(long)
