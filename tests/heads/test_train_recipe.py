"""The head-training recipe's exact steps (:mod:`latticekit.heads.recipe`, run by ``benchmarks/train_heads.py``): widening a heads file
(``--intermediate-size`` with a narrower ``--init``) keeps every head's logits, training a subset
of heads (``--train-heads``) computes exactly those heads' states, and ``--domain-weights``
batches hold the shares asked for."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)


from heads_helpers import HIDDEN, VOCAB, final_hidden, tiny_llama  # noqa: E402
from latticekit.heads import BlockHeads  # noqa: E402
from latticekit.heads.recipe import DomainData, batch_shares, domain_weight, evaluate, trained_states, widen  # noqa: E402


def randomize(heads: BlockHeads, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in heads.named_parameters():
            if not name.startswith("lm_head"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def hidden(model):
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    return final_hidden(model, ids)


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("conditioned", [False, True])
@pytest.mark.parametrize("wide", [HIDDEN + 1, 3 * HIDDEN])
def test_widen_keeps_every_heads_logits(model, hidden, num_layers, conditioned, wide):
    narrow = BlockHeads.for_model(model, 5, num_layers=num_layers, token_conditioned=conditioned)
    randomize(narrow, seed=num_layers)
    wider = BlockHeads.for_model(model, 5, num_layers=num_layers, token_conditioned=conditioned,
                                 intermediate_size=wide)
    randomize(wider, seed=7)  # the new units' input weights are whatever the template holds
    wider.load_weights(widen(narrow.trainable_state(), wider.trainable_state()))
    assert wider.intermediate_size == wide
    with torch.no_grad():
        torch.testing.assert_close(wider(hidden), narrow(hidden), rtol=1e-5, atol=1e-5)
        token = torch.randint(0, VOCAB, hidden.shape[:-1], generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(wider(hidden, next_token=token), narrow(hidden, next_token=token),
                                   rtol=1e-5, atol=1e-5)
    # the new units are not dead: their output weights get a gradient
    loss = wider(hidden)[..., 1:, :].logsumexp(-1).sum()
    loss.backward()
    down = wider.blocks[0].down if num_layers == 1 else wider.blocks[0][0].down
    assert down.weight.grad[:, HIDDEN:].abs().sum() > 0


def test_widen_equal_shapes_is_the_state(model):
    heads = BlockHeads.for_model(model, 3)
    randomize(heads, seed=2)
    state = heads.trainable_state()
    out = widen(state, BlockHeads.for_model(model, 3).trainable_state())
    assert all(torch.equal(out[k], state[k]) for k in state)


def test_widen_refuses_a_narrower_template(model):
    wide = BlockHeads.for_model(model, 3, intermediate_size=2 * HIDDEN)
    with pytest.raises(ValueError, match="cannot widen"):
        widen(wide.trainable_state(), BlockHeads.for_model(model, 3).trainable_state())


@pytest.mark.parametrize("conditioned", [False, True])
@pytest.mark.parametrize("trained", [[2], [3, 5], [2, 3, 4, 5]])
def test_trained_states_are_those_heads_states(model, hidden, conditioned, trained):
    heads = BlockHeads.for_model(model, 5, token_conditioned=conditioned)
    randomize(heads, seed=4)
    flat = hidden.reshape(-1, HIDDEN)
    token = torch.randint(0, VOCAB, (len(flat),), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        every = heads.head_states(flat, token)
        torch.testing.assert_close(trained_states(heads, flat, token, trained),
                                   torch.stack([every[:, i - 1] for i in trained], dim=1))


@pytest.mark.parametrize("conditioned", [False, True])
@pytest.mark.parametrize("only", [[2], [3, 5], [1, 2, 3, 4, 5]])
def test_evaluate_some_heads_measures_them_as_evaluate_all(model, hidden, conditioned, only):
    heads = BlockHeads.for_model(model, 5, token_conditioned=conditioned)
    randomize(heads, seed=6)
    flat = hidden.reshape(-1, HIDDEN)
    with torch.no_grad():
        greedy = model.lm_head(flat).argmax(-1).int().numpy()
    greedy[::3] = (greedy[::3] + 1) % VOCAB  # some labels the heads miss
    data = DomainData({"hidden": flat.half().numpy(), "greedy": greedy,
                       "segment": np.repeat(np.arange(2, dtype=np.int32), len(flat) // 2)}, 5)
    every, some = evaluate(heads, data, chunk=5), evaluate(heads, data, chunk=7, only=only)
    for k in every:
        assert some[k] == [v if i + 1 in only else None for i, v in enumerate(every[k])]
    assert 0 < sum(every["top1"][1:]) < 4  # neither all hits nor all misses


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 5000), st.lists(st.floats(0, 100), min_size=3, max_size=3).filter(lambda w: sum(w) > 0))
def test_batch_shares_are_proportional_and_exact(batch, w):
    weights = dict(zip(("code", "english", "instruction"), w))
    shares = batch_shares(batch, weights)
    assert sum(shares.values()) == batch
    for d, n in shares.items():
        assert abs(n - batch * weights[d] / sum(w)) < 1 + 1e-9
        assert weights[d] > 0 or n == 0


def test_equal_weights_give_the_first_recipes_thirds():
    assert batch_shares(3072, {"code": 1.0, "english": 1.0, "instruction": 1.0}) == \
        {"code": 1024, "english": 1024, "instruction": 1024}


@pytest.mark.parametrize("text", ["code", "code=", "code=x", "code=-1", "code=inf", "code=nan", "python=1"])
def test_domain_weight_refuses_bad_values(text):
    with pytest.raises(argparse.ArgumentTypeError, match="DOMAIN=WEIGHT"):
        domain_weight(text)


def test_domain_weight_reads_a_weight():
    assert domain_weight("instruction=0.5") == ("instruction", 0.5)
