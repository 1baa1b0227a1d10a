"""Softmax and SiLU on numpy (engine/passes/numpy_ops.py) against MLX's own, on literal and random data."""

from __future__ import annotations

import doctest

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.llama import MLP, ModelArgs

import engine.passes.numpy_ops as hostexp


def test_docstring_example() -> None:
    failed, _ = doctest.testmod(hostexp)
    assert failed == 0


def test_softmax_on_literal_rows() -> None:
    scores = np.array([[1.0, 2.0, 3.0], [5.0, -np.inf, 5.0], [1000.0, 1000.0, -np.inf]], dtype=np.float32)
    probs = hostexp.softmax(scores)
    assert probs.dtype == np.float32
    np.testing.assert_allclose(probs[0], [0.09003057, 0.24472847, 0.66524096], rtol=1e-6)
    assert probs[1].tolist() == [0.5, 0.0, 0.5]  # masked keys get nothing
    assert probs[2].tolist() == [0.5, 0.5, 0.0]  # large scores do not overflow


@pytest.mark.parametrize(
    ("batch", "heads", "kv_heads", "length", "keys"), [(1, 9, 3, 1, 40), (3, 9, 3, 5, 70), (2, 4, 4, 16, 16)]
)
def test_attention_matches_mlx(batch: int, heads: int, kv_heads: int, length: int, keys: int) -> None:
    """Three blocks in one call: a lane group's mask (each stream its own length), causal (None),
    and causal over a longer key range; each equals MLX's own attention."""
    mx.random.seed(3)

    def block(n_keys: int) -> tuple[mx.array, mx.array, mx.array]:
        return (mx.random.normal((batch, heads, length, 64)), mx.random.normal((batch, kv_heads, n_keys, 64)),
                mx.random.normal((batch, kv_heads, n_keys, 64)))

    lengths = mx.array([max(keys - length - 3 * b, 0) for b in range(batch)])
    query_at = lengths[:, None, None, None] + mx.arange(length)[None, None, :, None]
    group_mask = mx.arange(keys)[None, None, None, :] <= query_at
    blocks = [(*block(keys), group_mask), (*block(keys), None), (*block(keys + 7), None)]
    mine = hostexp.attention_many(blocks, 0.125)
    for (q, k, v, mask), got in zip(blocks, mine, strict=True):
        causal = mask if mask is not None else "causal"
        theirs = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=causal)
        assert got.shape == theirs.shape
        assert mx.abs(got - theirs).max().item() < 1e-5
    # A pass's later layers reuse the masks' host forms from its first: the same outputs, bit for bit.
    masks: dict = {}
    first = hostexp.attention_many(blocks, 0.125, masks)
    assert len(masks) == (3 if length > 1 else 1)  # the group's mask, and a causal one per key count when queries are several
    again = hostexp.attention_many(blocks, 0.125, masks)
    for a, b, c in zip(mine, first, again, strict=True):
        assert mx.array_equal(a, b).item() and mx.array_equal(a, c).item()


def test_mlp_matches_mlx() -> None:
    mx.random.seed(4)
    args = ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=1, intermediate_size=160,
                     num_attention_heads=4, rms_norm_eps=1e-5, vocab_size=100)
    block = MLP(args)
    x = mx.random.normal((1, 7, 64))
    theirs, mine = block(x), hostexp.mlp(block, x)
    assert mine.shape == theirs.shape
    assert mx.abs(mine - theirs).max().item() < 1e-5


def test_mlp_far_negative_gate_is_exact_and_quiet() -> None:
    """exp(-g) overflows for a gate far below zero; SiLU is then 0 without a warning (errors here)."""
    args = ModelArgs(model_type="llama", hidden_size=4, num_hidden_layers=1, intermediate_size=2,
                     num_attention_heads=1, rms_norm_eps=1e-5, vocab_size=10)
    block = MLP(args)
    block.gate_proj.weight = mx.array([[-100.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    block.up_proj.weight = mx.ones((2, 4))
    block.down_proj.weight = mx.eye(4)[:, :2]
    x = mx.array([[[2.0, 0.0, 0.0, 0.0]]])  # gate (-200, 2), up (2, 2)
    out = hostexp.mlp(block, x)
    assert np.isfinite(np.asarray(out)).all()
    assert mx.allclose(out, block(x)).item()
    assert out[0, 0, 0].item() == 0.0  # silu(-200) * 2
