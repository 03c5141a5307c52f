"""Sampling rules end to end on a tiny Llama: the first emitted token follows the target.

Fixed seeds; 4000 verification steps per rule, each from the same prefix, compared with the
target's (temperature / top-p adjusted) next-token distribution by a chi-square test
(bins with < 5 expected draws pooled). At this size the test rejects a rule that emits the
draft distribution instead (checked below), so a pass is evidence, not a formality.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

from latticekit.torch import (
    DraftTree,
    block_verification_plan,
    prefill,
    target_probs,
    token_verification_plan,
    tree_forward,
    verify,
)
from lk_torch_helpers import VOCAB, chi_square_pvalue, pbest_drafts, plain_greedy, tiny_llama

PROMPT = [3, 17, 42, 8, 25, 60, 11]
SAMPLES = 4000
G = 3
SETTINGS = {"sampling": (0.8, 0.95), "token": (0.7, 1.0), "block": (0.7, 1.0)}  # temperature, top_p


@pytest.fixture(scope="module")
def setup() -> dict[str, Any]:
    model = tiny_llama(torch.float32)
    _, ref_logits = plain_greedy(model, PROMPT, G + 1)
    cache = prefill(model, torch.tensor(PROMPT))
    # The drafter: per-position distributions from perturbed target logits, hotter than the target.
    gen = torch.Generator().manual_seed(4)
    q = torch.softmax((ref_logits[:G] + 1.0 * torch.randn(G, VOCAB, generator=gen)) / 0.9, -1).double()
    return {"model": model, "ref_logits": ref_logits, "cache": cache, "q": q}


_runs: dict[tuple[str, int], tuple[np.ndarray, list[int], np.ndarray]] = {}


def run(setup: dict[str, Any], rule: str, seed: int) -> tuple[np.ndarray, list[int], np.ndarray]:
    """SAMPLES verification steps; returns first-token counts, accepted counts, target law."""
    if (rule, seed) not in _runs:
        _runs[rule, seed] = _run(setup, rule, seed)
    return _runs[rule, seed]


def _run(setup: dict[str, Any], rule: str, seed: int) -> tuple[np.ndarray, list[int], np.ndarray]:
    model, q = setup["model"], setup["q"]
    temperature, top_p = SETTINGS[rule]
    gen = torch.Generator().manual_seed(seed)
    law = target_probs(setup["ref_logits"][0], temperature, top_p).numpy()
    pbest = pbest_drafts(setup["ref_logits"][:G], 4, 3, 0.3, np.random.default_rng(seed))
    counts, accepted = np.zeros(VOCAB), []
    for _ in range(SAMPLES):
        cache = copy.deepcopy(setup["cache"])
        if rule == "sampling":
            tree, probs = DraftTree.from_drafts(pbest), None
        else:
            draft = torch.multinomial(q, 1, generator=gen)[:, 0]
            tree, probs = DraftTree.from_drafts([draft.tolist()]), q
        result = verify(model, cache, torch.tensor(PROMPT), tree, rule, temperature=temperature,
                        top_p=top_p, draft_probs=probs, generator=gen)
        counts[int(result.emitted_tokens[0])] += 1
        accepted.append(result.num_accepted)
        assert cache.get_seq_length() == len(PROMPT) + result.num_accepted
    return counts, accepted, law


@pytest.mark.statistical
@pytest.mark.parametrize("rule", ["sampling", "token", "block"])
def test_first_token_follows_target(setup: dict[str, Any], rule: str) -> None:
    counts, accepted, law = run(setup, rule, seed=1)
    assert chi_square_pvalue(counts, law) > 1e-3
    assert np.mean(accepted) > 0.2  # drafts were accepted often enough for the rule to matter


def test_chi_square_rejects_the_draft_distribution(setup: dict[str, Any]) -> None:
    """Power check: emitting draws from q (a lossy 'always accept' verifier) is detected."""
    gen = torch.Generator().manual_seed(9)
    draws = torch.multinomial(setup["q"][0], SAMPLES, replacement=True, generator=gen).numpy()
    law = target_probs(setup["ref_logits"][0], *SETTINGS["token"]).numpy()
    assert chi_square_pvalue(np.bincount(draws, minlength=VOCAB), law) < 1e-3


def test_block_accepts_at_least_as_many_as_token(setup: dict[str, Any]) -> None:
    """Expected accepted tokens of both rules on the same sampled drafts, from the exact plans.

    For each draft x ~ q, one tree pass gives the target's p_1..p_{g+1} along x; the plans give
    E[tau | x] exactly, so only the draft draw is random.
    """
    model, q = setup["model"], setup["q"]
    gen = torch.Generator().manual_seed(2)
    temperature, top_p = SETTINGS["block"]
    expected = {"token": [], "block": []}
    for _ in range(200):
        draft = torch.multinomial(q, 1, generator=gen)[:, 0]
        out = tree_forward(model, copy.deepcopy(setup["cache"]), torch.tensor(PROMPT),
                           DraftTree.from_drafts([draft.tolist()]))
        p = target_probs(out.logits, temperature, top_p)
        a = token_verification_plan(p, q, draft).accept_probs.tolist()
        expected["token"].append(sum(np.prod(a[:i]) for i in range(1, G + 1)))
        h = block_verification_plan(p, q, draft).accept_probs.tolist()
        expected["block"].append(sum(i * h[i - 1] * np.prod([1 - x for x in h[i:]]) for i in range(1, G + 1)))
    token, block = np.mean(expected["token"]), np.mean(expected["block"])
    assert block >= token, (block, token)
    assert block > 0.2


@pytest.mark.statistical
def test_block_vs_token_empirical(setup: dict[str, Any]) -> None:
    """The sampled runs agree: block verification's mean accepted count is not below token's."""
    _, token, _ = run(setup, "token", seed=1)
    _, block, _ = run(setup, "block", seed=1)
    stderr = np.sqrt((np.var(token) + np.var(block)) / SAMPLES)
    assert np.mean(block) >= np.mean(token) - 3 * stderr
