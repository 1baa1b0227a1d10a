"""The rotary table (engine/passes/rope_table.py) against mlx.nn.RoPE itself: bit for bit, on literal data."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import pytest

from engine.passes.rope_table import RopeTable, tabled


def test_worked_example_one_pair() -> None:
    # dims 2 has one frequency, 1: the pair (1, 0) at position 2 becomes (cos 2, sin 2); (0, 1) turns to (-sin 2, cos 2).
    rope = nn.RoPE(2, traditional=True)
    table = RopeTable(rope, 2, rows=1, width=1)
    assert table.cos.item() == pytest.approx(math.cos(2), abs=1e-6)
    assert table.sin.item() == pytest.approx(math.sin(2), abs=1e-6)
    turned = table(mx.array([[[[0.0, 1.0]]]]))
    assert turned.reshape(-1).tolist() == pytest.approx([-math.sin(2), math.cos(2)], abs=1e-6)


@pytest.mark.parametrize("traditional", [True, False])
@pytest.mark.parametrize("dims", [64, 32])  # 32 of 64: the tail of each head passes through unturned
@pytest.mark.parametrize("offset", [0, 17, [3, 250, 1000]])
@pytest.mark.parametrize("width", [1, 5])
def test_table_equals_the_rope_exactly(traditional: bool, dims: int, offset: int | list[int], width: int) -> None:
    rope = nn.RoPE(dims, traditional=traditional, base=100000.0)
    rows = len(offset) if isinstance(offset, list) else 2
    at = mx.array(offset, dtype=mx.int32) if isinstance(offset, list) else offset
    x = mx.random.normal((rows, 9, width, 64), key=mx.random.key(7)) * 3
    table = RopeTable(rope, at, rows, width)
    assert mx.array_equal(table(x), rope(x, offset=at)).item()
    # One table serves queries and keys alike: another head count, the same positions.
    k = mx.random.normal((rows, 3, width, 64), key=mx.random.key(8))
    assert mx.array_equal(table(k), rope(k, offset=at)).item()


def test_only_plain_ropes_are_tabled() -> None:
    assert tabled(nn.RoPE(64))
    assert not tabled(nn.Linear(2, 2))

    class Scaled(nn.RoPE):  # a subclass may scale inside its call: a table would round differently
        pass

    assert not tabled(Scaled(64))
