"""llama.cpp rollouts (rollout.backend: llamacpp) against the transformers backend, on SmolLM2 (issue 43).

Usage: python benchmarks/llamacpp_rollout.py [--threads 1] [--batch 1] [--new-tokens 64] [--rounds 3]
                                             [--quants Q4_1 Q8_0 BF16] [--syncs 3] [--kl-rows 8]

One process, one thread each (--threads), the engines paired round by round (each round runs every
engine once, in turn, so load that comes and goes on a shared machine hits all of them alike):

* tokens/s: ``--batch`` rows of the same chat prompt, exactly ``--new-tokens`` new tokens each
  (EOS does not stop a row), temperature 0.7, prefill included; transformers in fp32 and with its
  bf16 copy (rollout.dtype), llama.cpp with the weights in each of ``--quants``. The policy is
  SmolLM2 with the LoRA adapter of configs/smollm2_cpu.yaml (r=16 on every linear layer), its B
  factors non-zero, as after some training.
* sync s: one LlamaCppBackend.sync_weights after an in-place change of every LoRA factor (an
  optimiser step): merge, GGUF write in the quant, reload. Median of ``--syncs``.
* rollout/trainer KL: ``--kl-rows`` rows sampled by each engine at T 0.7, their tokens scored
  again by the trainer (fp32, forward.recompute_logprobs): mean of logp_rollout - logp_trainer
  over the sampled tokens (the run's ``rollout_kl``), the largest |gap|, and the share of tokens
  whose importance weight exp(trainer - rollout) exceeds grpo.is_cap's default 2.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import loads, median, print_header, spread  # noqa: E402

from envace.core.sampling import SamplingParams  # noqa: E402
from envace.core.types import TurnSample  # noqa: E402
from envace.policy.llamacpp_backend import LlamaCppBackend  # noqa: E402
from envace.policy.loading import load_model  # noqa: E402
from envace.policy.transformers_backend import TransformersBackend  # noqa: E402
from envace.train.forward import recompute_logprobs  # noqa: E402

PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a short story about a robot who learns to cook."},
]
TEMPERATURE = 0.7


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def lora_policy(seed: int = 0) -> tuple[torch.nn.Module, object]:
    from peft import LoraConfig, get_peft_model

    model, tok = load_model("smollm2")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    policy = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets, lora_dropout=0.0))
    nudge(policy, seed)
    return policy.eval(), tok


def nudge(policy: torch.nn.Module, seed: int) -> None:
    """An in-place change of every LoRA factor, as an optimiser step makes."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=g) * 2e-3)


def unstoppable(engine: object) -> None:
    engine.eos_ids = frozenset()  # fixed-length rows: the speed, not where the story ends


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quants", nargs="+", default=["Q4_1", "Q8_0", "BF16"])
    p.add_argument("--syncs", type=int, default=3)
    p.add_argument("--kl-rows", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print_header("llama.cpp rollouts vs transformers, SmolLM2 + LoRA r=16", args)
    print(f"cpu         {cpu_model()}  threads={args.threads}  load(1/5/15)={loads()}")

    policy, tok = lora_policy()
    text = tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    prompt = tok.encode(text, add_special_tokens=False)
    print(f"prompt      {len(prompt)} tokens, {args.new_tokens} new tokens x {args.batch} rows, T {TEMPERATURE}")

    engines: dict[str, object] = {
        "transformers fp32": TransformersBackend(policy, tok, max_batch=max(args.batch, args.kl_rows)),
        "transformers bf16": TransformersBackend(policy, tok, max_batch=max(args.batch, args.kl_rows),
                                                 dtype=torch.bfloat16),
    }
    syncs: dict[str, list[float]] = {}
    for q in args.quants:
        start = time.perf_counter()
        engines[f"llama.cpp {q}"] = LlamaCppBackend(tok, policy, quant=q, max_batch=max(args.batch, args.kl_rows),
                                                   n_threads=args.threads)
        syncs[q] = [time.perf_counter() - start]  # the first: nothing cached yet
    for e in engines.values():
        unstoppable(e)
        e.generate([prompt], SamplingParams(max_new_tokens=4, temperature=TEMPERATURE, seed=0))  # warm-up

    speed: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(args.rounds):
        params = SamplingParams(max_new_tokens=args.new_tokens, temperature=TEMPERATURE, seed=r)
        for name, e in engines.items():
            start = time.perf_counter()
            out = e.generate([prompt] * args.batch, params)
            speed[name].append(sum(len(g.token_ids) for g in out) / (time.perf_counter() - start))
        print(f"round {r + 1}/{args.rounds} load1 {os.getloadavg()[0]:.2f}: "
              + ", ".join(f"{n} {v[-1]:.1f}" for n, v in speed.items()), flush=True)

    # syncs after changed weights (each re-encodes every LoRA-merged tensor)
    for i in range(args.syncs):
        nudge(policy, 100 + i)
        for q in args.quants:
            e = engines[f"llama.cpp {q}"]
            start = time.perf_counter()
            e.sync_weights(policy)
            syncs[q].append(time.perf_counter() - start)
            unstoppable(e)

    # rollout/trainer mismatch: each engine's samples scored by the trainer's fp32 forward
    kl: dict[str, tuple[float, float, float, int]] = {}
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=TEMPERATURE, seed=7)
    for name, e in engines.items():
        if name == "transformers fp32" or args.kl_rows < 1:
            continue  # the trainer itself
        gens = e.generate([prompt] * args.kl_rows, params)
        samples = [TurnSample(role="caller", group_id="kl", trajectory_index=i, turn=0, prompt_ids=list(prompt),
                              gen_ids=list(g.token_ids), logprobs=list(g.logprobs)) for i, g in enumerate(gens)]
        rollout = [copy.copy(s.logprobs) for s in samples]
        recompute_logprobs(policy, samples, TEMPERATURE)
        diffs = [a - b for s, ro in zip(samples, rollout) for a, b in zip(ro, s.logprobs)]
        capped = sum(1 for d in diffs if -d > 0.6931471805599453) / len(diffs)  # exp(trainer - rollout) > 2
        kl[name] = (sum(diffs) / len(diffs), max(abs(d) for d in diffs), capped, len(diffs))

    base = median(speed["transformers fp32"])
    print(f"\n== results (cpu {cpu_model()}, {args.threads} thread(s), load(1/5/15) at the end {loads()})")
    print(f"{'engine':<20} {'tok/s median [min-max]':<28} {'x fp32':>7} {'sync s':>22} "
          f"{'rollout_kl':>11} {'max|gap|':>9} {'w>2':>6}")
    for name in engines:
        q = name.split()[-1]
        sync = spread(syncs[q][1:]) if name.startswith("llama") and len(syncs[q]) > 1 else "-"
        k = kl.get(name)
        ks = f"{k[0]:>11.4f} {k[1]:>9.3f} {k[2]:>6.3f}" if k else f"{'(trainer)':>11} {'':>9} {'':>6}"
        print(f"{name:<20} {spread(speed[name]):<28} {median(speed[name]) / base:>7.2f} {sync:>22} {ks}")
    firsts = ", ".join(f"{q} {v[0]:.2f}" for q, v in syncs.items())
    counted = f"; KL over {next(iter(kl.values()))[3]} sampled tokens per engine" if kl else ""
    print(f"first sync (engine start, nothing cached): {firsts} s{counted}")


if __name__ == "__main__":
    main()
