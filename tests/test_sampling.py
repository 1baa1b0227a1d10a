"""Sampled verification keeps the distribution of plain sampling (a statistical test)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.drafts.verification import adjusted_probs, verify_greedy, verify_sampled

V = 5
P0 = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
# Row-1 distribution given the first token a (a Markov chain stands in for the model).
P1 = np.array(
    [
        [0.1, 0.6, 0.1, 0.1, 0.1],
        [0.3, 0.3, 0.2, 0.1, 0.1],
        [0.05, 0.05, 0.8, 0.05, 0.05],
        [0.2, 0.2, 0.2, 0.2, 0.2],
        [0.5, 0.1, 0.1, 0.1, 0.2],
    ]
)


def two_tokens(drafts: list[int], rng: np.random.Generator) -> tuple[int, int]:
    """First two emitted tokens when the first round verifies ``drafts`` (length 2)."""
    rows = np.stack([P0, P1[drafts[0]], P1[drafts[1]]])
    accepted, nxt = verify_sampled(rows, drafts, rng)
    out = [*drafts[:accepted], nxt]
    if len(out) == 1:  # the next round samples plainly, conditioned on the real first token
        out.append(int(rng.choice(V, p=P1[out[0]])))
    return out[0], out[1]


@pytest.mark.parametrize("drafts", [[1, 1], [0, 1], [4, 4], [2, 2]])
def test_joint_distribution_matches_plain_sampling(drafts: list[int]) -> None:
    rng = np.random.default_rng(1234)
    n = 40_000
    counts = np.zeros((V, V))
    for _ in range(n):
        a, b = two_tokens(drafts, rng)
        counts[a, b] += 1
    expected = n * P0[:, None] * P1
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 24 degrees of freedom: the 0.1% critical value is 51.2.
    assert chi2 < 51.2, f"chi2={chi2:.1f}"


def test_the_check_catches_a_biased_sampler() -> None:
    """Drawing from p instead of the residual after a rejection over-weights the draft."""

    def naive(rows: np.ndarray, drafts: list[int], rng: np.random.Generator) -> tuple[int, int]:
        if rng.random() < rows[0][drafts[0]]:
            return 1, int(rng.choice(V, p=rows[1]))
        return 0, int(rng.choice(V, p=rows[0]))

    rng = np.random.default_rng(7)
    n = 40_000
    counts = np.zeros((V, V))
    for _ in range(n):
        rows = np.stack([P0, P1[1], P1[1]])
        accepted, nxt = naive(rows, [1, 1], rng)
        first = 1 if accepted else nxt
        second = nxt if accepted else int(rng.choice(V, p=P1[first]))
        counts[first, second] += 1
    expected = n * P0[:, None] * P1
    assert float(((counts - expected) ** 2 / expected).sum()) > 51.2


def test_top_p_keeps_smallest_prefix_reaching_mass() -> None:
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    p = adjusted_probs(logits, temperature=1.0, top_p=0.7)
    assert np.allclose(p, [[0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]])
    assert np.allclose(adjusted_probs(logits, 1.0, 1.0), [[0.5, 0.3, 0.15, 0.05]])


def test_probabilities_are_mlx_lms_top_p_then_temperature() -> None:
    """The worked example of ``adjusted_probs``, then mlx-lm's own sampler on random rows: top-p on
    the log-probabilities (``apply_top_p``), then the temperature on what is kept."""
    import mlx.core as mx
    from mlx_lm.sample_utils import apply_top_p

    p = adjusted_probs(np.log(np.array([[0.5, 0.3, 0.15, 0.05]])), temperature=0.5, top_p=0.85)
    assert p[0] == pytest.approx([0.25 / 0.3625, 0.09 / 0.3625, 0.0225 / 0.3625, 0.0])
    rng = np.random.default_rng(3)
    for temperature in (0.3, 0.7, 1.5):
        for top_p in (0.5, 0.9):
            logits = rng.normal(0, 3, size=(1, 50))
            logprobs = logits - np.log(np.exp(logits).sum())
            kept = np.array(apply_top_p(mx.array(logprobs, dtype=mx.float32), top_p), dtype=np.float64)
            scaled = np.exp((kept - kept.max()) / temperature)
            assert adjusted_probs(logits, temperature, top_p)[0] == pytest.approx(scaled[0] / scaled.sum(), abs=1e-6)


def test_temperature_sharpens() -> None:
    logits = np.log(np.array([[0.6, 0.4]]))
    cold = adjusted_probs(logits, temperature=0.5, top_p=1.0)
    assert cold[0, 0] > 0.6 and np.isclose(cold.sum(), 1.0)


def test_greedy_rule_worked_example() -> None:
    assert verify_greedy([7, 8, 4, 5], [7, 8, 9]) == (2, 4)
    assert verify_greedy([7, 8, 4, 5], [7, 8, 4]) == (3, 5)
    assert verify_greedy([3], []) == (0, 3)
    assert verify_greedy([1, 2], [9]) == (0, 1)


@pytest.mark.model
def test_sampling_in_lanes_is_seeded_and_varied(loaded, chat_prompt) -> None:
    from engine.events import Finished, Request
    from engine.rounds.scheduler import Scheduler
    from tests import prompts

    def run(seed: int) -> tuple[int, ...]:
        events: list = []
        sched = Scheduler(loaded, events.append)
        sched.submit(Request(prompt_tokens=tuple(chat_prompt(prompts.COPY)), max_tokens=24,
                             temperature=0.8, top_p=0.95, seed=seed))
        while sched.busy:
            sched.step()
        done = next(e for e in events if isinstance(e, Finished))
        return done.tokens

    assert run(1) == run(1)
    assert len({run(s) for s in (1, 2, 3, 4)}) > 1


@pytest.mark.model
def test_sampled_streams_read_their_own_rows_of_a_grouped_pass(loaded, chat_prompt, monkeypatch) -> None:
    """A sampled stream in a round where another stream drafts: its logits come from its own rows
    of the grouped pass (or numpy's), so a seeded reply is what the padded pass gives (logits equal
    to float rounding), and greedy neighbours still copy."""
    from engine.drafts.cost_model import CostModel
    from engine.events import Finished, Request
    from engine.passes.choice import GENERIC
    from engine.rounds.scheduler import Scheduler
    from tests import prompts

    def run(grouped: bool, host: bool = False) -> tuple[dict[str, tuple[int, ...]], int]:
        monkeypatch.setattr(CostModel, "groups_pay", lambda self, b, w, k, keys=0: grouped and k is not None and 0 < k < b and w > 1)
        events: list = []
        passes = loaded.passes if host else replace(loaded.passes, numpy_pass=None) if grouped else GENERIC
        sched = Scheduler(replace(loaded, passes=passes), events.append)
        reqs = {"sampled": Request(prompt_tokens=tuple(chat_prompt(prompts.OPEN)), max_tokens=32,
                                   temperature=0.8, top_p=0.95, seed=7, drafts=False),
                "greedy": Request(prompt_tokens=tuple(chat_prompt(prompts.COPY)), max_tokens=32)}
        for r in reqs.values():
            sched.submit(r)
        while sched.busy:
            sched.step()
        done = {e.request_id: e.tokens for e in events if isinstance(e, Finished)}
        return {name: done[r.id] for name, r in reqs.items()}, sched.rounds_host if host else sched.rounds_grouped

    grouped, n_grouped = run(True)
    padded, n_padded = run(False)
    numpy_, n_host = run(False, host=True)  # the CPU's default: numpy's pass (engine.passes.numpy_pass)
    assert n_grouped > 0 and n_padded == 0 and n_host > 0
    assert grouped == padded == numpy_

