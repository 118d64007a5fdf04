"""SmolLM2 generation speed with the transformers backend: tokens/s at batch 1 and batch 8.

Usage: python benchmarks/generation_speed.py [--model smollm2] [--new-tokens 64] [--threads N]
                                             [--batches 1 8] [--dtype float32|bfloat16]

Every row generates exactly --new-tokens tokens (EOS is not a stop here), so the figures are
comparable across runs; a shared machine's other load shows up as run-to-run spread.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time

import torch

from envace.core.sampling import SamplingParams
from envace.policy.transformers_backend import TransformersBackend

PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a short story about a robot who learns to cook."},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"date        {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"machine     {platform.machine()} {platform.processor() or ''} cpus={os.cpu_count()} load1={load:.2f}")
    print(f"python      {platform.python_version()}  torch {torch.__version__}  threads={torch.get_num_threads()}")

    start = time.perf_counter()
    backend = TransformersBackend.from_spec(args.model, dtype=getattr(torch, args.dtype))
    backend.eos_ids = frozenset()  # fixed-length rows: measure speed, not when the story ends
    print(f"load        {args.model} ({args.dtype}): {time.perf_counter() - start:.1f} s")
    prompt = backend.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt)
    print(f"prompt      {len(prompt)} tokens, {args.new_tokens} new tokens, temperature 1")

    # Warm-up: first calls pay for allocator and kernel set-up.
    backend.generate([prompt], SamplingParams(max_new_tokens=8, temperature=1.0, seed=0))
    for batch in args.batches:
        best = 0.0
        for repeat in range(args.repeats):
            params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=repeat)
            start = time.perf_counter()
            outs = backend.generate([prompt] * batch, params)
            elapsed = time.perf_counter() - start
            generated = sum(len(o.token_ids) for o in outs)
            best = max(best, generated / elapsed)
            print(f"batch {batch:<4}  run {repeat}: {generated} tokens in {elapsed:.2f} s = {generated / elapsed:.1f} tok/s")
        print(f"batch {batch:<4}  best {best:.1f} tok/s")


if __name__ == "__main__":
    main()
