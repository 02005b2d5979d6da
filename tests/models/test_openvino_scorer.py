"""The cross-encoder compiled by OpenVINO (models/openvino_scorer.py) scores as the torch module it was traced from:
in fp32 to 1e-3 on padded batches of any shape (its input shapes stay dynamic), for the plain one-logit head and the
shipped gated head; in bf16 it keeps the rank guard. The runtime choice (SIEVE_CE_RUNTIME) follows the CPU, the
precision and the setting, and a model OpenVINO cannot convert leaves the torch path with the reason in the record."""
from __future__ import annotations

import threading

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from sieve import checkpoints
from sieve.models import openvino_scorer
from sieve.models.ce_base import PairScorer, cosine
from sieve.models.cross_encoder import CrossEncoder, PairLengths
from sieve.models.precision import MIN_SPEARMAN, native_bf16, worst_spearman
from sieve.models.precision_stages import ce_probe, lower_cross_encoder

QUERY = "what happens when a star runs out of hydrogen"
DOCS = ["Red giant stars swell as hydrogen runs out in the core.", "Exoplanet transits dim a star's light.",
        "Photosynthesis in leaves " * 40, "Bread rises because yeast makes gas.", "Volcanoes erupt.", "Stars."]


@pytest.fixture(scope="module")
def plain_ce(ce_checkpoint):
    """The plain one-logit head a user's Hugging Face checkpoint has (packaged MiniLM body, seeded head)."""
    return CrossEncoder.from_pretrained(ce_checkpoint, lengths=PairLengths(64, 256))


@pytest.fixture(scope="module")
def gated_ce():
    return CrossEncoder.from_pretrained(checkpoints.CROSS_ENCODER, lengths=PairLengths(64, 256))


def example(ce: CrossEncoder) -> dict:
    return ce.tokenize_pairs("a query", ["a document", "another, longer document"])


@pytest.mark.parametrize("which", ["plain_ce", "gated_ce"])
def test_fp32_scores_match_torch_on_any_batch_shape(which, request):
    ce = request.getfixturevalue(which)
    compiled = openvino_scorer.compile_scorer(ce.scorer, example(ce), "fp32")
    for docs in (DOCS, DOCS[:1], DOCS[2:5] * 7):  # shapes other than the traced one, with padding
        batch = ce.tokenize_pairs(QUERY, docs)
        assert batch["attention_mask"].min() == 0 or len(docs) == 1
        with torch.inference_mode():
            expected, got = ce.scorer(**batch), compiled(**batch)
        assert got.dtype == torch.float32 and got.shape == (len(docs),)
        torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)


def test_the_compiled_scorer_keeps_the_heads_other_methods(gated_ce):
    compiled = openvino_scorer.compile_scorer(gated_ce.scorer, example(gated_ce), "fp32")
    assert compiled.part_names == gated_ce.scorer.part_names and compiled.pair_inputs == gated_ce.scorer.pair_inputs
    served = CrossEncoder(compiled, gated_ce.tokenizer, name="x", weights_hash="x", lengths=gated_ce.lengths)
    torch.testing.assert_close(served.score(QUERY, DOCS), gated_ce.score(QUERY, DOCS), atol=1e-3, rtol=1e-3)


def test_concurrent_callers_share_a_bounded_pool_of_requests(plain_ce):
    compiled = openvino_scorer.compile_scorer(plain_ce.scorer, example(plain_ce), "fp32")
    assert compiled.created == 0
    batches = [plain_ce.tokenize_pairs(QUERY, DOCS[i:] + DOCS[:i]) for i in range(4)]
    with torch.inference_mode():
        expected = [compiled(**b) for b in batches]
    got = [None] * 4

    def work(i: int) -> None:
        for _ in range(5):
            got[i] = compiled(**batches[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, atol=0, rtol=0)
    assert 1 <= compiled.created <= 2  # 4 threads, at most 2 infer requests (their memory stays bounded)


def test_cosine_is_torchs_cosine_similarity():
    a, b = torch.randn(5, 7, 16), torch.randn(5, 7, 16)
    torch.testing.assert_close(cosine(a, b), F.cosine_similarity(a, b, dim=-1), atol=1e-6, rtol=1e-5)


def test_auto_compiles_in_bf16_where_the_cpu_has_it_and_keeps_rankings(gated_ce):
    served, choice = lower_cross_encoder(gated_ce, "auto")
    if not native_bf16():  # emulated bf16 is slower than fp32 (docs/performance.md): such a CPU keeps torch fp32
        assert served is gated_ce and (choice.runtime, choice.dtype) == ("torch", "fp32"), choice
        return
    assert (choice.runtime, choice.dtype) == ("openvino", "bf16"), choice
    assert isinstance(served.scorer, openvino_scorer.OpenVINOScorer) and choice.spearman >= MIN_SPEARMAN
    probe = ce_probe(gated_ce, n_queries=2, n_docs=16)
    assert worst_spearman(probe(gated_ce.scorer), probe(served.scorer)) >= MIN_SPEARMAN
    assert served.score(QUERY, DOCS[:3]).argmax() == 0


def test_runtime_follows_the_setting_and_the_precision(plain_ce):
    torch_ce, choice = lower_cross_encoder(plain_ce, "auto", "torch")
    assert choice.runtime == "torch" and not isinstance(torch_ce.scorer, openvino_scorer.OpenVINOScorer)
    same, choice = lower_cross_encoder(plain_ce, "fp32", "auto")  # fp32 is the reference: torch, untouched
    assert same is plain_ce and (choice.dtype, choice.runtime) == ("fp32", "torch")
    auto_ce, choice = lower_cross_encoder(plain_ce, "auto", "auto")
    assert choice.runtime == ("openvino" if native_bf16() else "torch"), choice
    forced, choice = lower_cross_encoder(plain_ce, "fp32", "openvino")  # forced: OpenVINO in the precision's dtype
    assert (choice.runtime, choice.dtype) == ("openvino", "fp32") and choice.spearman >= MIN_SPEARMAN
    with pytest.raises(ValueError):
        lower_cross_encoder(plain_ce, "auto", "onnx")


class Unconvertible(nn.Module):
    """A head with an operation OpenVINO has no rule for (aten::cosine_similarity, which the gated head used to call)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        states = self.inner.classifier.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return F.cosine_similarity(states[:, 0], states[:, 1], dim=-1)


def test_a_model_openvino_cannot_convert_stays_on_torch_and_says_why(plain_ce):
    assert isinstance(plain_ce.scorer, PairScorer)
    odd = CrossEncoder(Unconvertible(plain_ce.scorer), plain_ce.tokenizer, name="odd", weights_hash="odd",
                       lengths=plain_ce.lengths)
    served, choice = lower_cross_encoder(odd, "fp32", "openvino")
    assert served is odd and choice.runtime == "torch" and choice.dtype == "fp32"
    assert "OpenVINO failed" in choice.reason and "cosine_similarity" in choice.reason, choice


QUIET_START = """
import warnings
warnings.simplefilter("default")  # every warning shown, as a server's log would
from sieve.models import openvino_scorer
from sieve.models.cross_encoder import CrossEncoder
from sieve.models.ce_base import PairLengths
ce = CrossEncoder.from_pretrained(%r, lengths=PairLengths(16, 32))
openvino_scorer.compile_scorer(ce.scorer, ce.tokenize_pairs("q", ["a document", "another"]), "fp32")
print("compiled")
"""


def test_compiling_the_cross_encoder_prints_no_transformers_warnings(ce_checkpoint):
    """The start-up trace read every attribute of the model, and transformers warned about training-only ones
    (`loss_type=None ... unrecognized`, a deprecated property) at every start. A fresh interpreter: transformers
    warns once per process."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", QUIET_START % str(ce_checkpoint)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and "compiled" in out.stdout, out.stderr[-3000:]
    assert "loss_type" not in out.stderr and "FutureWarning" not in out.stderr, out.stderr[-3000:]
