"""Our LlamaModel over the paged cache against transformers' LlamaForCausalLM.

Tolerance: both sides run the same fp32 math on the same weights; they differ
only in summation order (SDPA vs the paged reference, fused vs split ops). On
this model logits reach |5| and the observed max difference is ~7e-6, so 1e-4
absolute leaves an order of magnitude of headroom while still catching real
errors (a wrong RoPE pairing, GQA mapping or mask moves logits by >1e-2).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from sluice.model import (
    CheckpointError,
    ModelInput,
    ModelRunner,
    SampleRequest,
    SamplingParams,
    SequenceInput,
    load_llama,
)

ATOL = 1e-4
GREEDY = SampleRequest(SamplingParams(temperature=0.0))


def hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0].float()  # [len, vocab]


def all_position_logits(runner: ModelRunner, token_ids: list[int], block_table: list[int]):
    """Full prefill in one step, logits at every position (not just the last)."""
    step = runner.prepare(ModelInput((SequenceInput(token_ids, 0, block_table, GREEDY),)))
    with torch.inference_mode():
        hidden = runner.model(step.input_ids, step.positions, step.attn, runner.kv_caches)
        return runner.model.compute_logits(hidden)  # [len, vocab]


def assert_greedy_agrees(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """argmax equal wherever HF's top-2 gap is larger than the tolerance."""
    top2 = theirs.topk(2, dim=-1).values  # [rows, 2]
    decisive = (top2[:, 0] - top2[:, 1]) > ATOL
    assert decisive.any()
    assert torch.equal(ours.argmax(-1)[decisive], theirs.argmax(-1)[decisive])


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 128, (n,), generator=g).tolist()


@pytest.mark.parametrize("tie", [False, True])
def test_full_prefill_logits_match(tmp_path, make_hf_checkpoint, tie):
    hf_model = make_hf_checkpoint(tmp_path, tie=tie)
    model = load_llama(tmp_path)
    if tie:
        assert model.lm_head.weight is model.embed_tokens.weight
    runner = ModelRunner.from_pretrained(tmp_path, num_blocks=8, block_size=16)
    tokens = prompt(45, seed=1)
    ours = all_position_logits(runner, tokens, block_table=[5, 2, 7])
    theirs = hf_logits(hf_model, tokens)
    assert (ours - theirs).abs().max() < ATOL
    assert_greedy_agrees(ours, theirs)


@pytest.mark.parametrize("block_size", [16, 32])
def test_chunked_prefill_and_decode_match(tmp_path, make_hf_checkpoint, block_size):
    """Seq A prefills in three chunks while seq B prefills then decodes beside it."""
    hf_model = make_hf_checkpoint(tmp_path)
    runner = ModelRunner.from_pretrained(tmp_path, num_blocks=12, block_size=block_size)
    a_prompt, b_prompt = prompt(40, seed=2), prompt(9, seed=3)
    a_chunks = [a_prompt[:16], a_prompt[16:27], a_prompt[27:]]
    a_blocks, b_blocks = [9, 0, 4, 11], [6, 3]  # deliberately scattered
    a_tokens, b_tokens = [], list(b_prompt)
    a_logits, b_logits = [], []  # (position, logits row)

    a_pos = 0
    for step in range(7):
        seqs = []
        if step < 3:
            chunk = a_chunks[step]
            last = step == 2
            seqs.append(SequenceInput(chunk, a_pos, a_blocks, GREEDY if last else None))
        else:
            seqs.append(SequenceInput([a_tokens[-1]], a_pos, a_blocks, GREEDY))
        if step == 0:
            seqs.append(SequenceInput(b_prompt, 0, b_blocks, GREEDY))
        else:
            seqs.append(SequenceInput([b_tokens[-1]], len(b_tokens) - 1, b_blocks, GREEDY))
        out = runner.execute(ModelInput(tuple(seqs), return_logits=True))

        a_pos += len(seqs[0].token_ids)
        row = 0
        if out.sampled_token_ids[0] is not None:
            a_tokens.append(out.sampled_token_ids[0])
            a_logits.append((a_pos - 1, out.logits[row]))
            row += 1
        else:
            assert step < 2
        b_logits.append((len(b_tokens) - 1, out.logits[row]))
        b_tokens.append(out.sampled_token_ids[1])

    for full, rows in ((a_prompt + a_tokens, a_logits), (b_tokens, b_logits)):
        theirs_all = hf_logits(hf_model, full)
        positions = [p for p, _ in rows]
        ours = torch.stack([r for _, r in rows])
        theirs = theirs_all[positions]
        assert (ours - theirs).abs().max() < ATOL
        assert_greedy_agrees(ours, theirs)
    assert len(a_tokens) == 5 and len(b_tokens) == 9 + 7


def test_sharded_checkpoint_loads(tmp_path, make_hf_checkpoint):
    hf_model = make_hf_checkpoint(tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (tmp_path / "model.safetensors").exists()
    runner = ModelRunner.from_pretrained(tmp_path, num_blocks=4, block_size=16)
    tokens = prompt(20, seed=4)
    ours = all_position_logits(runner, tokens, block_table=[1, 3])
    assert (ours - hf_logits(hf_model, tokens)).abs().max() < ATOL


def test_loads_in_bfloat16(tmp_path, make_hf_checkpoint):
    make_hf_checkpoint(tmp_path)
    model = load_llama(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.rotary_emb.inv_freq.dtype == torch.float32  # RoPE precision kept


def _rewrite_checkpoint(hf_model, dst, edit):
    tensors = {k: v.detach().clone().contiguous() for k, v in hf_model.state_dict().items()}
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "1 missing: layers.1.mlp.up_proj.weight"),
        (lambda t: t.__setitem__("model.layers.0.extra.weight", torch.zeros(2)), "1 unexpected"),
        (
            lambda t: t.__setitem__("model.norm.weight", torch.ones(65)),
            r"misshaped: model.norm.weight: checkpoint \(65,\)",
        ),
    ],
)
def test_checkpoint_errors_are_named(tmp_path, make_hf_checkpoint, edit, match):
    src_dir, bad_dir = tmp_path / "src", tmp_path / "bad"
    bad_dir.mkdir()
    hf_model = make_hf_checkpoint(src_dir)
    (bad_dir / "config.json").write_text((src_dir / "config.json").read_text())
    _rewrite_checkpoint(hf_model, bad_dir, edit)
    with pytest.raises(CheckpointError, match=match):
        load_llama(bad_dir)


def test_missing_weights_file(tmp_path, make_hf_checkpoint):
    make_hf_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_llama(tmp_path)
