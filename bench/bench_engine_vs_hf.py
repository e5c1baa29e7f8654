"""Engine throughput vs Hugging Face `generate`, side by side in one process.

Tiny model, fp32, 64 concurrent sequences, 128 prompt / 128 output tokens,
greedy, ignore_eos. Prints both rates and the ratio (issue target >= 1.2x).

    .venv/bin/python bench/bench_engine_vs_hf.py [--model-dir DIR] [--repeats N]
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_harness import build, greedy_request, run_to_completion, tune_process  # noqa: E402

BATCH, PROMPT, OUTPUT = 64, 128, 128


def prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(PROMPT)] for _ in range(BATCH)]


def engine_tokens_per_s(model_dir: Path, batch: list[list[int]]) -> float:
    core, executor = build(model_dir)
    warm = run_to_completion(core, executor, [(0.0, greedy_request("warm", batch[0], 4))])
    assert warm.output_tokens == 4
    stats = run_to_completion(core, executor, [(0.0, greedy_request(f"r{i}", p, OUTPUT)) for i, p in enumerate(batch)])
    assert stats.output_tokens == BATCH * OUTPUT
    return stats.output_tokens_per_s


def hf_tokens_per_s(model_dir: Path, batch: list[list[int]]) -> float:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    ids = torch.tensor(batch)
    with torch.inference_mode():
        model.generate(ids[:1], max_new_tokens=4, min_new_tokens=4, do_sample=False)
        started = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=OUTPUT,
                             min_new_tokens=OUTPUT, do_sample=False, pad_token_id=0)
        wall_s = time.perf_counter() - started
    assert out.shape == (BATCH, PROMPT + OUTPUT)
    return BATCH * OUTPUT / wall_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, default=Path(".sluice/models/tiny-llama"))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    tune_process()  # before either side runs: the HF baseline gets the same allocator
    torch.manual_seed(0)
    vocab = json.loads((args.model_dir / "config.json").read_text())["vocab_size"]
    batch = prompts(vocab)
    engine, hf = [], []
    for _ in range(args.repeats):  # interleaved, so machine noise hits both alike
        engine.append(engine_tokens_per_s(args.model_dir, batch))
        hf.append(hf_tokens_per_s(args.model_dir, batch))
    e, h = max(engine), max(hf)
    print(f"engine: {e:,.0f} output tok/s   HF generate (batch {BATCH}): {h:,.0f} output tok/s")
    print(f"ratio engine / HF = {e / h:.2f}x   (target >= 1.2x)")
    print(json.dumps({"bench": "engine_vs_hf", "engine_tok_s": round(e, 1), "hf_tok_s": round(h, 1),
                      "ratio": round(e / h, 3), "runs_engine": [round(x) for x in engine],
                      "runs_hf": [round(x) for x in hf]}))


if __name__ == "__main__":
    main()
