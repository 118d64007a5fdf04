"""The bf16 lever on the GRPO update (issue #20, item 1): one update of SmolLM2 + LoRA in fp32
against the same update with ``mixed_precision: bf16`` (the shipped option: the forward under bf16
autocast, fp32 weights and optimiser; this CPU has AVX512-BF16), on the same samples.

Usage: python benchmarks/bf16_update.py [--model smollm2] [--tasks 2] [--group-size 2]
           [--max-turns 2] [--repeats 2] [--threads 1]
           [--sides fp32,bf16|bf16,bf16-base|bf16,bf16-eager|bf16,bf16-math]

Samples as in train_throughput.py (the oracle's real prompts and tool results, advantages +-1,
sampler log-probs filled in by the fp32 model). Two copies of the model start from the same
weights; each repeat times one step of each, alternating who goes first. Printed: tokens per
second of each (median [min-max]) and the paired ratio, and the numerics: the largest and mean
absolute difference between the bf16 and fp32 log-probs of the batch's generated tokens at the
start weights, the cosine between the two gradients there, and how far the steps moved the LoRA
weights apart (relative). ``--old-logprobs current`` (default, as bf16 rollouts train): each side's
PPO ratio is taken against its own forward.

``--sides bf16,bf16-base`` instead pairs the shipped option against the same with the frozen base
model's linear weights stored in bf16 (LoRA only; the casts autocast makes each forward are then
already done): the same gradient, is it faster? ``bf16,bf16-eager`` pairs it against the same with
transformers' eager attention (a matmul and a softmax) instead of SDPA, ``bf16,bf16-math`` against
SDPA held to its math kernel (``sdpa_kernel(SDPBackend.MATH)``) instead of the CPU flash kernel.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load1, make_parser, peak_rss_mib, spread, start  # noqa: E402
from _samples import oracle_samples, sample_stats  # noqa: E402
from train_throughput import fill_logprobs  # noqa: E402

from envace.core.prompts import PromptStyle  # noqa: E402
from envace.experiments.tasks import select_tasks  # noqa: E402
from envace.policy.loading import load_model  # noqa: E402
from envace.train.batching import pack_samples, sequence_length, split_micro_batches  # noqa: E402
from envace.train.forward import autocast, token_logprobs  # noqa: E402
from envace.train.step import GRPOUpdater, UpdaterConfig  # noqa: E402


@torch.no_grad()
def logprob_gap(model, scored, pad_id: int, max_tokens: int) -> tuple[float, float]:
    diffs = []
    for mb in split_micro_batches(scored, max_tokens):
        packed = pack_samples(mb, pad_id=pad_id)
        ref, _ = token_logprobs(model, packed)
        with autocast(model, "bf16"):  # the context the updater's forward runs in
            low, _ = token_logprobs(model, packed)
        diffs.append((low - ref)[packed.token_mask].abs())
    d = torch.cat(diffs)
    return float(d.max()), float(d.mean())


def lora_pair_and_samples(args) -> tuple:
    """Two copies of ``args.model`` + LoRA r=16 with the same weights, and the oracle samples of
    ``args`` with the first copy's log-probs: (a, b, pad_id, scored, tokens). Shared with
    compile_update.py."""
    from peft import LoraConfig, get_peft_model

    base, tok = load_model(args.model)
    a = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")).train()
    b = copy.deepcopy(a)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    tasks = select_tasks(args.world, "test", limit=args.tasks, tool_distractors=1)
    scored = oracle_samples(tok, tasks, PromptStyle(max_examples=2, max_history_results=3), args.group_size,
                            args.max_turns)
    scored = fill_logprobs(a, scored, pad_id, args.micro_batch_tokens)
    print(f"samples     {sample_stats(scored)}")
    return a, b, pad_id, scored, sum(sequence_length(s) for s in scored)


# "first,second": the copies as they are timed
SIDES = ("fp32,bf16", "bf16,bf16-base", "bf16,bf16-eager", "bf16,bf16-math")


def store_base_bf16(model) -> int:
    """Store the frozen (non-LoRA) linear weights of ``model``'s decoder layers in bf16; how many
    were cast. Not the head: tied to the embeddings, it would put the residual stream in bf16."""
    n = 0
    for name, m in model.named_modules():
        if (isinstance(m, torch.nn.Linear) and "lora_" not in name and not name.endswith("lm_head")
                and not m.weight.requires_grad):
            m.weight.data = m.weight.data.to(torch.bfloat16)
            n += 1
    return n


def main() -> None:
    p = make_parser(__doc__, model="smollm2", world="shop", tasks=2, group_size=2, max_turns=2)
    p.add_argument("--micro-batch-tokens", type=int, default=4096)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--old-logprobs", choices=["current", "sampler"], default="current")
    p.add_argument("--sides", choices=SIDES, default="fp32,bf16")
    args = start(p, "GRPO update: fp32 vs bf16 autocast (SmolLM2 + LoRA r=16)")
    first, second = args.sides.split(",")
    model_a, model_b, pad_id, scored, tokens = lora_pair_and_samples(args)
    gap_max, gap_mean = logprob_gap(model_a, scored, pad_id, args.micro_batch_tokens)
    print(f"log-probs   bf16 autocast vs fp32 at the start weights: max |diff| {gap_max:.4f}, mean {gap_mean:.5f}")
    if second == "bf16-base":
        print(f"base        {store_base_bf16(model_b)} frozen linear weights of the second copy stored in bf16")
    if second == "bf16-eager":
        model_b.get_base_model().set_attn_implementation("eager")
        print("attention   the second copy: eager")
    kernel = {name: contextlib.nullcontext for name in (first, second)}
    if second == "bf16-math":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        kernel[second] = lambda: sdpa_kernel(SDPBackend.MATH)
    cfg = UpdaterConfig(lr=args.lr, micro_batch_tokens=args.micro_batch_tokens, pad_id=pad_id,
                        old_logprobs=args.old_logprobs)
    ups = {first: GRPOUpdater(model_a, replace(cfg, mixed_precision="no" if first == "fp32" else "bf16")),
           second: GRPOUpdater(model_b, replace(cfg, mixed_precision="bf16"))}
    grads = {}
    for name, up in ups.items():
        with kernel[name]():
            up.compute_gradients(scored)
        grads[name] = torch.cat([p.grad.flatten() for p in up.params])
        up.optimizer.zero_grad(set_to_none=True)
    cos = float(torch.nn.functional.cosine_similarity(grads[first].double(), grads[second].double(), dim=0))
    print(f"gradient    cosine({second}, {first}) at the start weights: {cos:.6f}, "
          f"max |diff| {float((grads[first] - grads[second]).abs().max()):.3g}")

    times: dict[str, list[float]] = {first: [], second: []}
    for rep in range(args.repeats + 1):  # repeat 0 is the warm-up, not timed
        for name in ([first, second] if rep % 2 == 0 else [second, first]):
            with kernel[name]():
                t = time.perf_counter()
                ups[name].step(scored)
                dt = time.perf_counter() - t
            if rep:
                times[name].append(dt)
            print(f"repeat {rep}  {name}  {dt:.1f} s = {tokens / dt:.1f} tok/s (load1 {load1():.2f})", flush=True)
    a = {n: p for n, p in model_a.named_parameters() if p.requires_grad}
    moved = max(float((p - a[n]).detach().norm() / a[n].detach().norm().clamp_min(1e-12))
                for n, p in model_b.named_parameters() if p.requires_grad)
    print("-- summary (median [min-max])")
    for name in times:
        print(f"{name:<5} tok/s  {spread([tokens / t for t in times[name]])}")
    print(f"{second} / {first} throughput  {spread([f / b for f, b in zip(times[first], times[second])])}")
    print(f"after {args.repeats + 1} steps each: largest relative difference of a LoRA weight {moved:.4f}")
    print(f"peak RSS {peak_rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
