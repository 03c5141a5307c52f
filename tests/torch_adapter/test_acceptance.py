"""Acceptance rules by exact enumeration on toy distributions, and their samplers by chi-square.

A toy "language model" is a table of next-token distributions over a vocabulary of 3, one per
context. Losslessness is checked the strong way: the rule's emitted tokens, continued by the
target until g + 1 tokens, must have exactly the target's joint distribution.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from latticekit.torch import (
    DraftError,
    DraftTree,
    block_verification_plan,
    block_verify,
    target_probs,
    token_verification_plan,
    token_verify,
)
from latticekit.torch.acceptance import greedy_accept, tree_sampling_accept
from lk_torch_helpers import chi_square_pvalue

V = 3
G = 3
Table = dict[tuple[int, ...], torch.Tensor]


def toy_table(rng: np.random.Generator, depth: int, concentration: float, zeros: bool) -> Table:
    """Next-token distributions for every context of length 0..depth; some entries 0 if ``zeros``."""
    table: Table = {}
    for n in range(depth + 1):
        for ctx in itertools.product(range(V), repeat=n):
            probs = rng.dirichlet(np.full(V, concentration))
            if zeros and rng.random() < 0.5:
                probs[rng.integers(V)] = 0.0
                probs /= probs.sum()
            table[ctx] = torch.tensor(probs, dtype=torch.float64)
    return table


def target_joint(P: Table, z: tuple[int, ...], start: int = 0) -> float:
    return math.prod(float(P[z[:i]][z[i]]) for i in range(start, len(z)))


def tau_distribution(rule: str, accept: torch.Tensor) -> list[float]:
    """P(tau = t), t = 0..g, from a plan's acceptance probabilities."""
    a = accept.tolist()
    g = len(a)
    if rule == "token":  # sequential: stop at the first rejection
        return [math.prod(a[:t]) * (1 - a[t]) for t in range(g)] + [math.prod(a)]
    # block: sub-blocks decided independently, tau = the largest accepted
    return [a[t - 1] * math.prod(1 - x for x in a[t:]) if t else math.prod(1 - x for x in a) for t in range(g + 1)]


def enumerate_single_draft(rule: str, P: Table, Q: Table) -> tuple[dict[tuple[int, ...], float], float]:
    """Exact distribution of emitted sequences, and E[tau], over every draft x ~ q."""
    plan_fn = token_verification_plan if rule == "token" else block_verification_plan
    emitted: dict[tuple[int, ...], float] = defaultdict(float)
    expected_tau = 0.0
    for x in itertools.product(range(V), repeat=G):
        q_x = math.prod(float(Q[x[:i]][x[i]]) for i in range(G))
        if q_x == 0:
            continue
        p = torch.stack([P[x[:i]] for i in range(G + 1)])
        q = torch.stack([Q[x[:i]] for i in range(G)])
        plan = plan_fn(p, q, torch.tensor(x))
        for tau, p_tau in enumerate(tau_distribution(rule, plan.accept_probs)):
            expected_tau += q_x * p_tau * tau
            for y in range(V):
                emitted[x[:tau] + (y,)] += q_x * p_tau * float(plan.residuals[tau, y])
    return emitted, expected_tau


def max_error_vs_target(emitted: dict[tuple[int, ...], float], P: Table, length: int) -> float:
    """Largest gap between (emitted, then continued by the target) and the target's joint."""
    worst = 0.0
    for z in itertools.product(range(V), repeat=length):
        got = math.fsum(
            prob * target_joint(P, z, len(e)) for e, prob in emitted.items() if z[: len(e)] == e
        )
        worst = max(worst, abs(got - target_joint(P, z)))
    return worst


CASES = [(seed, conc, zeros) for seed in range(6) for conc, zeros in ((1.0, False), (0.3, True))]


@pytest.mark.parametrize("seed, concentration, zeros", CASES)
def test_single_draft_rules_are_exactly_lossless_and_block_accepts_more(
    seed: int, concentration: float, zeros: bool
) -> None:
    rng = np.random.default_rng(seed)
    P = toy_table(rng, G, concentration, zeros)
    Q = toy_table(rng, G - 1, concentration, zeros)
    taus = {}
    for rule in ("token", "block"):
        emitted, taus[rule] = enumerate_single_draft(rule, P, Q)
        assert math.isclose(math.fsum(emitted.values()), 1.0, abs_tol=1e-15)
        assert max_error_vs_target(emitted, P, G + 1) <= 1e-15, rule
    assert taus["block"] >= taus["token"] - 1e-15


def test_block_beats_token_strictly_on_most_toys() -> None:
    gains = []
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        P, Q = toy_table(rng, G, 1.0, False), toy_table(rng, G - 1, 1.0, False)
        gains.append(enumerate_single_draft("block", P, Q)[1] - enumerate_single_draft("token", P, Q)[1])
    assert min(gains) >= -1e-15
    assert sum(g > 1e-9 for g in gains) >= 15, gains


def test_identical_draft_and_target_accept_everything() -> None:
    rng = np.random.default_rng(7)
    P = toy_table(rng, G, 1.0, False)
    for plan_fn in (token_verification_plan, block_verification_plan):
        x = (0, 2, 1)
        p = torch.stack([P[x[:i]] for i in range(G + 1)])
        plan = plan_fn(p, p[:-1], torch.tensor(x))
        assert torch.equal(plan.accept_probs, torch.ones(G, dtype=torch.float64))


def tree_rule_distribution(tree: DraftTree, rows: list[torch.Tensor]) -> dict[tuple[int, ...], float]:
    """Exact output distribution of ``tree_sampling_accept`` itself.

    Every assignment of a draw y_r to every row r is enumerated, with weight prod_r p_r(y_r);
    the sampler sees one-hot rows so its draws are those y_r, and rows it never queries
    marginalise out of the weight.
    """
    emitted: dict[tuple[int, ...], float] = defaultdict(float)
    for draws in itertools.product(range(V), repeat=len(rows)):
        weight = math.prod(float(rows[r][y]) for r, y in enumerate(draws))
        if weight == 0:
            continue
        path = tree_sampling_accept(tree, lambda r: torch.nn.functional.one_hot(torch.tensor(draws[r]), V).double())
        tokens = tuple(int(t) for t in tree.tokens[path.nodes]) + (path.bonus_token,)
        emitted[tokens] += weight
    return emitted


@pytest.mark.parametrize("seed", range(4))
def test_tree_sampling_rule_is_exactly_lossless(seed: int) -> None:
    rng = np.random.default_rng(seed)
    P = toy_table(rng, 3, 0.5, zeros=seed % 2 == 1)
    tree = DraftTree.from_drafts([[0, 1], [0, 2], [1, 0], [0, 1]])
    rows = [P[()]] + [P[tuple(int(t) for t in tree.tokens[tree.path(i)])] for i in range(tree.num_nodes)]
    emitted = tree_rule_distribution(tree, rows)
    assert max_error_vs_target(emitted, P, 3) <= 1e-15


def test_greedy_accept_walks_the_argmax_path() -> None:
    tree = DraftTree.from_drafts([[5, 6, 7], [5, 6, 8], [5, 9]])  # nodes 5 6 7 8 9
    # row 0 = root, row i+1 = node i
    assert greedy_accept(tree, [5, 6, 8, 0, 0, 0]) == ([0, 1, 3], 0)
    assert greedy_accept(tree, [5, 9, 3, 3, 3, 2]) == ([0, 4], 2)
    assert greedy_accept(tree, [4, 6, 8, 0, 0, 0]) == ([], 4)


@pytest.mark.statistical
def test_samplers_follow_their_plans() -> None:
    """(tau, y) frequencies of token_verify / block_verify match the plan's exact law."""
    rng = np.random.default_rng(3)
    P, Q = toy_table(rng, G, 1.0, False), toy_table(rng, G - 1, 1.0, False)
    x = (1, 0, 2)
    p = torch.stack([P[x[:i]] for i in range(G + 1)])
    q = torch.stack([Q[x[:i]] for i in range(G)])
    gen = torch.Generator().manual_seed(11)
    for rule, plan_fn, sampler in (
        ("token", token_verification_plan, token_verify),
        ("block", block_verification_plan, block_verify),
    ):
        plan = plan_fn(p, q, torch.tensor(x))
        law = np.array([pt * float(plan.residuals[t, y])
                        for t, pt in enumerate(tau_distribution(rule, plan.accept_probs)) for y in range(V)])
        counts = np.zeros(law.shape)
        for _ in range(6000):
            tau, y = sampler(p, q, torch.tensor(x), gen)
            counts[tau * V + y] += 1
        assert chi_square_pvalue(counts, law) > 1e-3, rule


def test_chi_square_helper_has_power() -> None:
    """The goodness-of-fit check used across these tests rejects a wrong law at this sample size."""
    gen = np.random.default_rng(0)
    truth = np.array([0.5, 0.3, 0.2])
    wrong = np.array([0.45, 0.35, 0.2])
    counts = np.bincount(gen.choice(3, size=6000, p=wrong), minlength=3)
    assert chi_square_pvalue(counts, truth) < 1e-3
    counts = np.bincount(gen.choice(3, size=6000, p=truth), minlength=3)
    assert chi_square_pvalue(counts, truth) > 1e-3


def test_target_probs_temperature_and_top_p() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    probs = target_probs(logits, temperature=0.5)
    assert torch.allclose(probs, torch.softmax(logits.double() / 0.5, -1))
    base = torch.softmax(logits.double(), -1)  # 0.644, 0.237, 0.087, 0.032
    nucleus = target_probs(logits, top_p=0.85)
    kept = base[:2] / base[:2].sum()
    assert torch.allclose(nucleus, torch.cat([kept, torch.zeros(2, dtype=torch.float64)]))
    assert target_probs(logits, top_p=1e-6).tolist() == [1.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        target_probs(logits, temperature=0.0)
    with pytest.raises(ValueError):
        target_probs(logits, top_p=1.5)


def test_plan_input_errors() -> None:
    p = torch.full((3, 4), 0.25, dtype=torch.float64)
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25] * 4], dtype=torch.float64)
    with pytest.raises(DraftError, match="zero probability"):
        block_verification_plan(p, q, torch.tensor([2, 0]))
    with pytest.raises(DraftError, match="g = 2"):
        token_verification_plan(p[:2], q, torch.tensor([0, 0]))
