"""The `scape` lm-eval model against hand computations from the raw logits."""

from __future__ import annotations

import pytest
import torch
from eval_test_helpers import SHAPE
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model

from eval.lm import ScapeLM
from eval.scoring import greedy_generate, log_probs
from scape.megatron.train import causal_mask, position_ids

S = SHAPE.seq_length
TEXT = (
    "Animation is the process of making the illusion of motion and change by means of the "
    "rapid display of a sequence of static images that minimally differ from each other."
)


def _request(kind: str, *args) -> Instance:
    return Instance(kind, {}, tuple(args), 0)


def _hand_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(. | ids[:i+1]) for every i: one plain forward, softmax over the real vocabulary."""
    tokens = torch.tensor([ids])
    with torch.no_grad():
        logits = model(tokens, position_ids(1, len(ids), "cpu"), causal_mask(len(ids), "cpu"))
    return torch.log_softmax(logits[0, :, : SHAPE.vocab_size].double(), dim=-1)


@pytest.fixture(scope="module")
def lm(loaded) -> ScapeLM:
    return ScapeLM(loaded=loaded, batch_size=2, progress=False)


def test_registered_for_lm_eval():
    import eval.cli  # noqa: F401  (what `python -m eval.cli` imports)

    assert get_model("scape") is ScapeLM


def test_loglikelihood_equals_hand_computation(lm, loaded):
    model, tok, _ = loaded
    pairs = [
        ("The history of", " animation"),
        ("Paris is the capital", " of France and more"),
        ("A", " b"),
        (TEXT * 2, " images"),  # longer than the context: truncated on the left
    ]
    got = lm.loglikelihood([_request("loglikelihood", c, x) for c, x in pairs])
    for (context, continuation), (ll, greedy) in zip(pairs, got, strict=True):
        whole = tok.tokenize(context + continuation)
        n = len(whole) - len(tok.tokenize(context))
        inputs = whole[-(S + 1) : -1]
        lp = _hand_logprobs(model, inputs)
        positions = range(len(inputs) - n, len(inputs))
        targets = whole[-n:]
        assert ll == pytest.approx(
            sum(float(lp[p, t]) for p, t in zip(positions, targets, strict=True)), abs=1e-4
        )
        assert greedy == all(
            int(lp[p].argmax()) == t for p, t in zip(positions, targets, strict=True)
        )


def test_is_greedy_when_the_continuation_is_the_argmax(lm, loaded):
    model, tok, _ = loaded
    context = tok.tokenize(TEXT)[:10]
    ids = list(context)
    for _ in range(3):
        ids.append(int(_hand_logprobs(model, ids)[-1].argmax()))
    greedy = ids[10:]
    wrong = greedy[:2] + [(greedy[2] + 1) % SHAPE.vocab_size]
    results = lm._loglikelihood_tokens([(None, context, greedy), (None, context, wrong)])
    assert results[0][1] is True and results[1][1] is False


@pytest.mark.parametrize("words", [12, 200])  # within one window, and several windows
def test_rolling_loglikelihood_sums_every_token_once(lm, loaded, words):
    model, tok, meta = loaded
    text = " ".join((TEXT.split() * 20)[:words])
    ids = tok.tokenize(text)
    expected, predicted = 0.0, 0
    # lm-eval's rule: the first window conditions on EOD, later ones on a full context
    while predicted < len(ids):
        end = min(len(ids), predicted + S)
        inputs = ([meta.eod] + ids)[max(0, end - S) : end]
        lp = _hand_logprobs(model, inputs)
        for k in range(predicted, end):
            expected += float(lp[k - (end - len(inputs)), ids[k]])
        predicted = end
    (got,) = lm.loglikelihood_rolling([_request("loglikelihood_rolling", text)])
    assert got == pytest.approx(expected, abs=1e-3)


class _Counter(torch.nn.Module):
    """Greedy decoding counts upward (t -> t+1 mod vocab), and the padding is loudest."""

    def __init__(self, vocab: int, padded: int) -> None:
        super().__init__()
        self.vocab, self.padded = vocab, padded
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens, position_ids, attention_mask):
        logits = torch.zeros(*tokens.shape, self.padded)
        logits.scatter_(2, ((tokens + 1) % self.vocab)[..., None], 5.0)
        logits[..., self.vocab :] = 50.0
        return logits


def _count(context: list[int], **kw) -> str:
    return greedy_generate(
        _Counter(500, 512),
        context,
        vocab_size=500,
        max_length=8,
        eod=0,
        device=torch.device("cpu"),
        detokenize=lambda ids: " ".join(map(str, ids)),
        **{"max_new_tokens": 5, **kw},
    )


def test_generation_is_greedy_over_the_real_vocabulary():
    assert _count([10]) == "11 12 13 14 15"  # never one of the louder padded ids
    assert _count(list(range(20, 40))) == "40 41 42 43 44"  # context beyond the window slides
    assert torch.equal(
        log_probs(_Counter(500, 512), torch.tensor([[3, 4]]), 500),
        torch.log_softmax(_Counter(500, 512)(torch.tensor([[3, 4]]), None, None)[..., :500], -1),
    )


def test_generation_stops_at_stop_strings_eod_and_budget():
    assert _count([10], stop=["13"]) == "11 12 "
    assert _count([10], stop=["zz", " 12"]) == "11"
    assert _count([497]) == "498 499"  # 499 -> 0 is the EOD: stop, not emitted
    assert _count([10], max_new_tokens=2) == "11 12"


def test_generate_until_plumbing(lm, loaded):
    model, tok, meta = loaded
    args = {"until": ["the"], "max_gen_toks": 6, "do_sample": False}
    (text,) = lm.generate_until([_request("generate_until", TEXT, args)])
    direct = greedy_generate(
        model,
        tok.tokenize(TEXT),
        vocab_size=meta.vocab_size,
        max_length=S,
        max_new_tokens=6,
        eod=meta.eod,
        device=torch.device("cpu"),
        detokenize=tok.detokenize,
        stop=["the"],
    )
    assert text == direct and "the" not in text and len(tok.tokenize(text)) <= 6


def test_continuation_longer_than_the_context_is_scored_in_pieces(lm, loaded):
    model, tok, meta = loaded
    ids = tok.tokenize(TEXT * 2)
    context, continuation = ids[:5], ids[5 : 5 + 2 * S + 3]
    (got,) = lm._loglikelihood_tokens([(None, context, continuation)])
    # every continuation token once, after as much preceding text as the window holds
    expected = 0.0
    for start in range(0, len(continuation), S):
        piece = continuation[start : start + S]
        inputs = (context + continuation[: start + len(piece)])[-(S + 1) : -1]
        lp = _hand_logprobs(model, inputs)
        expected += sum(float(lp[len(inputs) - len(piece) + i, t]) for i, t in enumerate(piece))
    assert got[0] == pytest.approx(expected, abs=1e-3)


def test_model_args_win_over_cli_options(export):
    # what `python -m eval.cli --model_args path=...,batch_size=3 --batch_size 8` constructs
    lm = ScapeLM.create_from_arg_string(
        f"path={export},batch_size=3,tasks_dir=/unused", {"batch_size": 8, "device": "cpu"}
    )
    assert lm.batch_size == 3 and lm.device == torch.device("cpu") and lm.max_length == S
