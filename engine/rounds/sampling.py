"""Sampled rows, drawn on the device with one key per position of a reply.

A sampling stream's token at output position n is drawn from its row's distribution with key n of
the stream's seed (``position_keys``): mlx-lm's top-p on the model's log-probabilities, then the
temperature (``mlx_lm.sample_utils.make_sampler``'s order), then the Gumbel-max draw that
``mx.random.categorical`` makes. Every row of a round is drawn so, copied rows too, and verification
keeps the copies that equal their row's draw (``engine.drafts.verification.verify``). That is
speculative sampling's rule with the draws coupled: a copy x lands with probability p(x), and on a
mismatch the token emitted is the draw itself, distributed as p given that it is not x (the
residual). So each token follows the model's distribution, and a seeded reply is the same token for
token whether rows were copied or not, alone or in any batch, run ahead or not: only the ints cross
to the host.

Worked example: a stream at output position 40 drafts two copied tokens (a, b), so its round has
rows at positions 40, 41, 42. Their draws with keys 40..42 are (a, c, e): the copy a lands, b does
not (c was drawn where it was offered), and the stream emits a, c. Without copies it would have
drawn a at 40 with key 40, then c at 41 with key 41 from the same distribution: the same tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import NamedTuple

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p

_gumbel_rows = mx.vmap(lambda key, noise: mx.random.gumbel(shape=noise.shape, key=key), in_axes=(0, 0))


def position_keys(seed: int, count: int) -> mx.array:
    """``count`` keys [count, 2], key n for output position n of a reply sampled with ``seed``."""
    return mx.random.split(mx.random.key(seed), count)


def _draws(logits: mx.array, keys: mx.array, inverse_temperature: mx.array, top_p: mx.array | None) -> mx.array:
    logits = logits.astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if top_p is not None:
        logprobs = apply_top_p(logprobs, top_p)
    noise = _gumbel_rows(keys, logprobs)
    return mx.argmax(logprobs * inverse_temperature + noise, axis=-1).astype(mx.int32)


# On an accelerator the draw is compiled, so that its element-wise steps fuse into a few kernels
# (there each kernel costs host time); the settings are inputs, not constants, so a new temperature
# is not a new trace (nor new kernels to build). Traced once per shape, with and without top-p. On
# the CPU the first trace builds its kernels with the C++ compiler: a stall of the first sampled
# reply that fusing does not win back there.
_with_top_p = mx.compile(_draws)
_without_top_p = mx.compile(partial(_draws, top_p=None))


def sample_rows(logits: mx.array, keys: mx.array, temperature: float, top_p: float,
                compiled: bool = False) -> mx.array:
    """One token per row of ``logits`` [rows, vocab], row i drawn with ``keys[i]`` (int32 [rows]);
    ``compiled`` draws the same tokens through ``mx.compile``."""
    inverse = mx.array(1.0 / temperature, dtype=mx.float32)
    nucleus = mx.array(top_p, dtype=mx.float32) if 0.0 < top_p < 1.0 else None
    if not compiled:
        return _draws(logits, keys, inverse, nucleus)
    if nucleus is not None:
        return _with_top_p(logits, keys, inverse, nucleus)
    return _without_top_p(logits, keys, inverse)


class Rows(NamedTuple):
    """A sampling stream's rows of a round: its ``keys`` (``position_keys``), ``logits`` [rows, vocab]
    at output positions ``position`` on (a number, or an array still on the device: a round run
    ahead after a drafting one), and how it samples."""

    keys: mx.array
    logits: mx.array
    position: int | mx.array
    temperature: float
    top_p: float


def draw_all(streams: Mapping[int, Rows], compiled: bool = False) -> dict[int, mx.array]:
    """Each stream's draws for its ``Rows`` (rows past its last key, padding never kept, reuse that
    key), with one ``sample_rows`` for all streams that sample alike: every call sorts its rows'
    vocabularies and builds a graph, so a round's sampling streams share one. A row's draw depends
    on its logits and key alone, so this equals drawing stream by stream. ``compiled``: see
    ``sample_rows`` (the passes say where: ``RoundPasses.compiled_draws``)."""
    groups: dict[tuple[float, float], list[int]] = {}
    for i, r in streams.items():
        groups.setdefault((r.temperature, r.top_p), []).append(i)
    out: dict[int, mx.array] = {}
    for (temperature, top_p), ids in groups.items():
        rows = [streams[i] for i in ids]
        keys = [_keys_at(r.keys, r.position, r.logits.shape[0]) for r in rows]
        one = len(rows) == 1
        drawn = sample_rows(rows[0].logits if one else mx.concatenate([r.logits for r in rows]),
                            keys[0] if one else mx.concatenate(keys), temperature, top_p, compiled)
        at = 0
        for i, r in zip(ids, rows, strict=True):
            out[i] = drawn[at : at + r.logits.shape[0]]
            at += r.logits.shape[0]
    return out


def _keys_at(keys: mx.array, position: int | mx.array, rows: int) -> mx.array:
    """Keys of ``rows`` positions from ``position`` on, the last key reused past the end."""
    if isinstance(position, int) and position + rows <= keys.shape[0]:
        return keys[position : position + rows]  # a view: no kernel
    return keys[mx.minimum(mx.arange(rows, dtype=mx.int32) + position, keys.shape[0] - 1)]


def with_draws(choices: mx.array, draws: dict[int, mx.array]) -> mx.array:
    """``choices`` [streams, width] with row i replaced by ``draws[i]`` (as many rows or fewer: the
    rest of the row is padding and keeps what it had)."""
    if not draws:
        return choices
    width = choices.shape[1]
    if choices.shape[0] == 1 and 0 in draws and draws[0].shape[0] == width:
        return draws[0][None]  # a lone stream's own draws: no copy
    rows = []
    for i in range(choices.shape[0]):
        d = draws.get(i)
        if d is None:
            rows.append(choices[i])
        else:
            rows.append(d if d.shape[0] == width else mx.concatenate([d, choices[i, d.shape[0]:]]))
    return mx.stack(rows)
