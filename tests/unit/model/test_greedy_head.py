"""The screened LM head (sluice.model.greedy_head), with either screen
(bf16 where the CPU has it, int8 everywhere the native kernels are built),
gives the argmax of the exact logits for every greedy row, near-ties and
flat rows included; its
forward is still the full float32 head; the runner takes it only for steps
that want nothing but the argmax; the fast path swaps it in where the probe
found it faster, and never in the forced modes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sluice.model import LlamaModel, ModelInput, ModelRunner, SampleRequest, SamplingParams, SequenceInput
from sluice.model import allocate_kv_caches, cpu_fast_path
from sluice.model.cpu_fast_path import LM_HEAD, apply_cpu_fast_path, choose_linears
from sluice.model.cpu_linear import PackedLinear, onednn_linear_available
from sluice.kernels.int8_head import int8_head_scores
from sluice.model.greedy_head import ScreenedHead, available_screens, screen_available, screen_bound_factor

SCREENS = [pytest.param("bf16", marks=pytest.mark.skipif(not screen_available("bf16"),
                                                         reason="no bf16 oneDNN kernels on this CPU")),
           "int8"]
BLOCK = 4


def _head(vocab: int, hidden: int, seed: int, std: float = 0.02) -> nn.Linear:
    linear = nn.Linear(hidden, vocab, bias=False).requires_grad_(False)
    linear.weight.copy_(torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed)) * std)
    return linear


def _normed(rows: int, hidden: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(seed))
    return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True))  # as a final RMSNorm leaves it


def _exact(hidden: torch.Tensor, weight: torch.Tensor) -> list[int]:
    return (hidden.double() @ weight.double().t()).argmax(dim=1).tolist()


def test_the_bound_covers_three_bf16_roundings_and_a_float32_sum():
    assert 3 * 2.0**-8 < screen_bound_factor(256) < 3.1 * 2.0**-8
    assert screen_bound_factor(4096) > screen_bound_factor(256)


def test_the_int8_screen_runs_wherever_the_native_kernels_are_built():
    assert screen_available("int8") and "int8" in available_screens()
    with pytest.raises(ValueError, match="unknown LM head screen 'fp8'"):
        screen_available("fp8")
    with pytest.raises(ValueError, match="unknown LM head screen 'fp8'"):
        ScreenedHead(_head(10, 4, seed=0), screen="fp8")


@pytest.mark.parametrize("screen", SCREENS)
def test_greedy_tokens_are_the_exact_argmax(screen):
    linear = _head(8000, 128, seed=0)
    head = ScreenedHead(linear, screen=screen)
    assert head.screening
    hidden = _normed(512, 128, seed=1)
    with torch.inference_mode():
        assert head.greedy_token_ids(hidden).tolist() == _exact(hidden, linear.weight)


@pytest.mark.parametrize("screen", SCREENS)
def test_near_ties_below_the_screens_resolution_go_to_the_exact_winner(screen):
    linear = _head(1000, 64, seed=2)
    hidden = _normed(16, 64, seed=3)[[0] * 16] * torch.linspace(0.5, 2.0, 16)[:, None]  # one direction
    direction = hidden[0] / hidden[0].norm()
    with torch.no_grad():
        linear.weight[300] = direction  # far above every random row
        linear.weight[700] = direction
        linear.weight[700, 0] += 1e-5 * direction[0].sign()  # larger, by less than bf16 can see
    head = ScreenedHead(linear, screen=screen)
    if screen == "bf16":
        screened = (hidden.bfloat16() @ linear.weight.bfloat16().t()).float()
    else:
        screened = torch.empty(16, head._int8.padded_vocab)
        int8_head_scores(hidden, head._int8, screened)
    assert set(screened.argmax(dim=1).tolist()) == {300}  # the scores alone would answer wrongly
    with torch.inference_mode():
        assert head.greedy_token_ids(hidden).tolist() == _exact(hidden, linear.weight) == [700] * 16


@pytest.mark.parametrize("screen", SCREENS)
def test_rows_with_too_many_candidates_get_their_full_logits(screen):
    linear = _head(500, 32, seed=4)
    with torch.no_grad():
        linear.weight[100:400] = linear.weight[100]  # 300 equal tokens: a flat top
        linear.weight[100:400] *= 50  # ... far above the rest
    head = ScreenedHead(linear, screen=screen, max_candidates=16)
    hidden = _normed(8, 32, seed=5)
    hidden[hidden @ linear.weight[100] < 0] *= -1  # so the flat top is the top
    with torch.inference_mode():
        got = head.greedy_token_ids(hidden).tolist()
    assert got == _exact(hidden, linear.weight) == [100] * 8  # the fallback keeps the lowest index


@pytest.mark.skipif(not onednn_linear_available(torch.float32), reason="this torch has no oneDNN")
@pytest.mark.parametrize("screen", SCREENS)
def test_forward_is_the_full_head_and_names_and_ties_are_kept(make_config, screen):
    config = make_config(tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaModel(config).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    reference = PackedLinear(model.lm_head)
    apply_cpu_fast_path(model, {LM_HEAD: f"screened_{screen}"})
    assert isinstance(model.lm_head, ScreenedHead) and model.lm_head.screen_kind == screen
    assert model.lm_head.screening
    assert model.lm_head.weight is model.embed_tokens.weight
    assert model.state_dict().keys() == before.keys()
    hidden = _normed(5, config.hidden_size, seed=6)
    with torch.inference_mode():
        torch.testing.assert_close(model.compute_logits(hidden), reference(hidden), atol=1e-5, rtol=0)
        assert model.greedy_token_ids(hidden).tolist() == _exact(hidden, model.lm_head.weight)


class _CountingHead(ScreenedHead):
    """Counts the runner's asks: for the argmax alone, or for full logits.
    The screen's own exact pass over rows it leaves unresolved (close
    calls, which depend on the CPU's bf16 rounding) is part of the first."""

    def __init__(self, linear: nn.Linear, screen: str) -> None:
        super().__init__(linear, screen=screen)
        self.greedy_calls = self.full_calls = 0
        self._in_greedy = False

    def greedy_token_ids(self, hidden):
        self.greedy_calls += 1
        self._in_greedy = True
        try:
            return super().greedy_token_ids(hidden)
        finally:
            self._in_greedy = False

    def forward(self, x):
        self.full_calls += not self._in_greedy
        return super().forward(x)


@pytest.mark.skipif(not onednn_linear_available(torch.float32), reason="this torch has no oneDNN")
@pytest.mark.parametrize("screen", SCREENS)
@pytest.mark.parametrize("case", ["greedy", "logits", "temperature", "min_tokens"])
def test_the_runner_asks_for_the_argmax_alone_only_when_that_is_all_it_needs(make_config, case, screen):
    config = make_config()
    torch.manual_seed(0)
    plain = LlamaModel(config).eval()
    screened = LlamaModel(config).eval()
    screened.load_state_dict(plain.state_dict())
    screened.lm_head = head = _CountingHead(screened.lm_head, screen)
    greedy = SamplingParams(temperature=0.0)
    params = {"greedy": greedy, "logits": greedy, "temperature": SamplingParams(temperature=0.7, seed=1),
              "min_tokens": SamplingParams(temperature=0.0, min_tokens=3)}[case]
    prompt = [5, 9, 11, 2, 7]
    tokens = {}
    for name, model in (("plain", plain), ("screened", screened)):
        runner = ModelRunner(model, allocate_kv_caches(config, 8, BLOCK, torch.float32, "cpu"))
        sample = SampleRequest(params, generator=params.make_generator())
        out = runner.execute(ModelInput((SequenceInput(prompt, 0, [0, 1], sample),
                                         SequenceInput(prompt[:3], 0, [2], SampleRequest(greedy))),
                                        return_logits=case == "logits"))
        tokens[name] = out.sampled_token_ids
        assert (out.logits is not None) == (case == "logits")
    assert tokens["screened"] == tokens["plain"]
    argmax_only = case == "greedy"
    assert (head.greedy_calls, head.full_calls) == ((1, 0) if argmax_only else (0, 1))


def test_auto_takes_the_fastest_screen_only_where_it_beats_the_full_head(make_config, tmp_path, monkeypatch):
    model = LlamaModel(make_config()).eval()

    def probe(**screens_s):
        def fake(shapes, head=None, **_):
            timings = {s.key: {"torch": 1.0, "onednn": 2.0} for s in shapes}
            if head is not None:
                timings[head.key].update(greedy_full=1.0, **{f"greedy_{k}": v for k, v in screens_s.items()})
            return timings
        return fake

    monkeypatch.setattr(cpu_fast_path, "probe_linears", probe(bf16=0.2))
    choice = choose_linears(model, "auto")
    assert choice[LM_HEAD] == "screened_bf16" and set(choice.values()) == {"torch", "screened_bf16"}
    monkeypatch.setattr(cpu_fast_path, "probe_linears", probe(bf16=0.5, int8=0.3))
    assert choose_linears(model, "auto")[LM_HEAD] == "screened_int8"
    monkeypatch.setattr(cpu_fast_path, "probe_linears", probe(int8=0.4))  # a CPU without bf16
    assert choose_linears(model, "auto")[LM_HEAD] == "screened_int8"
    monkeypatch.setattr(cpu_fast_path, "probe_linears", probe(bf16=3.0, int8=1.5))
    assert choose_linears(model, "auto")[LM_HEAD] == "torch"
    monkeypatch.setattr(cpu_fast_path, "probe_linears", probe())  # no screen at all
    assert choose_linears(model, "auto")[LM_HEAD] == "torch"
    for forced in ("torch", "onednn", "transposed"):
        assert not any(impl.startswith("screened") for impl in choose_linears(model, forced).values())


def test_the_probe_times_the_greedy_head_each_way_this_cpu_runs():
    shape = cpu_fast_path.LinearShape(64, 4000, False)
    timings = cpu_fast_path.probe_linears([shape], rows=8, trials=1, min_time_s=0.001, head=shape)
    assert set(timings[shape.key]) == {"torch", "onednn", "transposed", "greedy_full",
                                       *(f"greedy_{k}" for k in available_screens())}
    assert "greedy_int8" in timings[shape.key]
    assert min(timings[shape.key].values()) > 0
