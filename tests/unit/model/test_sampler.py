from __future__ import annotations

import pytest
import torch

from sluice.model import SampleRequest, Sampler, SamplingParams

VOCAB = 50
EOS = 7


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def request(seed=None, num_generated=0, **params) -> SampleRequest:
    p = SamplingParams(seed=seed, **params)
    return SampleRequest(p, num_generated=num_generated, generator=p.make_generator())


def test_greedy_is_argmax():
    logits = random_logits(4)
    tokens = Sampler([EOS]).sample(logits, [request(temperature=0.0)] * 4)
    assert tokens == logits.argmax(-1).tolist()


def test_top_k_one_equals_greedy_even_when_hot():
    logits = random_logits(6, seed=1)
    reqs = [request(temperature=5.0, top_k=1)] * 3
    reqs += [request(seed=i, temperature=2.0, top_k=1) for i in range(3)]
    assert Sampler().sample(logits, reqs) == logits.argmax(-1).tolist()


def test_seeded_sampling_reproducible_and_independent_of_batch():
    target = random_logits(1, seed=5)[0]
    sampler = Sampler()

    def run(batch_rows: int, position: int) -> list[int]:
        """Five steps of the seeded request at `position` among unseeded neighbours."""
        seeded = request(seed=1234, temperature=1.0, top_p=0.9)
        out = []
        for step in range(5):
            logits = random_logits(batch_rows, seed=100 + step + batch_rows)
            logits[position] = target
            reqs = [request(temperature=1.0) for _ in range(batch_rows)]
            reqs[position] = seeded  # same generator object across steps, as an engine would
            out.append(sampler.sample(logits, reqs)[position])
        return out

    alone = run(1, 0)
    assert run(1, 0) == alone
    assert run(4, 2) == alone
    assert run(7, 6) == alone
    assert len(set(alone)) > 1  # it is really sampling, not collapsing to argmax


def test_sampling_follows_the_distribution():
    """Cheap sanity check: frequencies close to softmax probabilities."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = SamplingParams(seed=0)
    g = p.make_generator()
    counts = torch.zeros(4)
    sampler = Sampler()
    for _ in range(2000):
        counts[sampler.sample(logits, [SampleRequest(p, generator=g)])[0]] += 1
    torch.testing.assert_close(counts / 2000, torch.softmax(logits[0], -1), atol=0.03, rtol=0)


def test_top_k_and_top_p_restrict_support():
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0, -1.0]]).repeat(200, 1)
    sampler = Sampler()
    top_k = sampler.sample(logits, [request(seed=i, top_k=2) for i in range(200)])
    assert set(top_k) == {0, 1}
    # softmax ~ [0.66, 0.24, 0.09, ...]: top_p 0.8 keeps the first two tokens only.
    top_p = sampler.sample(logits, [request(seed=i, top_p=0.8) for i in range(200)])
    assert set(top_p) == {0, 1}


def test_min_tokens_masks_eos_and_stop_ids():
    logits = torch.full((3, VOCAB), -5.0)
    logits[:, EOS] = 10.0
    logits[:, 11] = 9.0
    logits[:, 3] = 8.0
    sampler = Sampler([EOS])
    reqs = [
        request(temperature=0.0, min_tokens=2, num_generated=1, stop_token_ids=(11,)),
        request(temperature=0.0, min_tokens=2, num_generated=2),  # reached: EOS allowed
        request(temperature=0.0, min_tokens=2, num_generated=0, ignore_eos=True),
    ]
    assert sampler.sample(logits, reqs) == [3, EOS, EOS]


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -1.0}, {"top_p": 0.0}, {"top_k": -1}, {"max_tokens": 0},
     {"min_tokens": 5, "max_tokens": 2}],
)
def test_invalid_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_row_count_mismatch():
    with pytest.raises(ValueError):
        Sampler().sample(random_logits(2), [request()])
