"""Generation speed, paired: envace's transformers backend vs Hugging Face ``generate``, in fp32 and
bf16, at batch 1 and 8 rows, in one process.

Usage: python benchmarks/generation_speed.py [--model smollm2] [--new-tokens 64] [--threads 1]
                                             [--batches 1 8] [--dtypes float32 bfloat16] [--repeats 3]

Every row generates exactly --new-tokens tokens (EOS is not a stop for either engine), sampling at
temperature 1 over the whole vocabulary (HF: ``top_k=0``), from the same weights. Each repeat runs
every variant once, in turn, so a shared machine's load falls on all of them alike; the best
repeat is reported, as wall-clock and as process CPU time (what the run itself used, which a
loaded machine inflates less). ``envace bf16 plain`` is envace without the one-row matrix-vector
path (``TransformersBackend.one_row_matvec``), the loop as it was before.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from collections.abc import Callable

import torch

from envace.core.sampling import SamplingParams
from envace.policy.loading import load_model
from envace.policy.transformers_backend import TransformersBackend

PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a short story about a robot who learns to cook."},
]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-hf", action="store_true", help="envace only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    print(f"date        {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"cpu         {cpu_model()} ({os.cpu_count()} logical CPUs)")
    print(f"threads     {torch.get_num_threads()}   load average {load_average()}")
    print(f"python      {platform.python_version()}  torch {torch.__version__}")

    variants: dict[str, Callable[[list[int], int, int], int]] = {}
    prompt: list[int] = []
    for dtype_name in args.dtypes:
        start = time.perf_counter()
        model, tokenizer = load_model(args.model, dtype=getattr(torch, dtype_name))
        print(f"load        {args.model} ({dtype_name}): {time.perf_counter() - start:.1f} s")
        backend = TransformersBackend(model, tokenizer)
        backend.eos_ids = frozenset()  # fixed-length rows: measure speed, not when the story ends
        prompt = list(tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=False))
        short = dtype_name.replace("float32", "fp32").replace("bfloat16", "bf16")
        variants[f"envace {short}"] = _envace(backend, matvec=backend.one_row_matvec)
        if short == "bf16" and backend.one_row_matvec:
            variants["envace bf16 plain"] = _envace(backend, matvec=False)
        if not args.no_hf:
            variants[f"hf generate {short}"] = _hf(model, tokenizer.pad_token_id)
    print(f"prompt      {len(prompt)} tokens, {args.new_tokens} new tokens per row, temperature 1")

    for run in variants.values():  # warm-up: first calls pay for allocator and kernel set-up
        run(prompt, 1, 4)
    for batch in args.batches:
        wall = {name: float("inf") for name in variants}
        cpu = {name: float("inf") for name in variants}
        for _ in range(args.repeats):
            for name, run in variants.items():
                w0, c0 = time.perf_counter(), time.process_time()
                tokens = run(prompt, batch, args.new_tokens)
                wall[name] = min(wall[name], time.perf_counter() - w0)
                cpu[name] = min(cpu[name], time.process_time() - c0)
                assert tokens == batch * args.new_tokens, (name, tokens)
        n = batch * args.new_tokens
        print(f"\nbatch {batch}  (best of {args.repeats}; load average {load_average()})")
        print(f"  {'variant':<20} {'wall tok/s':>10} {'cpu tok/s':>10} {'vs hf (cpu)':>12}")
        for name in variants:
            hf = "hf generate " + name.split()[1]
            ratio = f"{cpu[hf] / cpu[name]:.2f}x" if hf in cpu and not name.startswith("hf") else ""
            print(f"  {name:<20} {n / wall[name]:>10.2f} {n / cpu[name]:>10.2f} {ratio:>12}")


def _envace(backend: TransformersBackend, matvec: bool) -> Callable[[list[int], int, int], int]:
    def run(prompt: list[int], batch: int, new_tokens: int) -> int:
        backend.one_row_matvec = matvec
        outs = backend.generate([prompt] * batch, SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=0))
        return sum(len(o.token_ids) for o in outs)

    return run


def _hf(model: torch.nn.Module, pad_id: int | None) -> Callable[[list[int], int, int], int]:
    def run(prompt: list[int], batch: int, new_tokens: int) -> int:
        ids = torch.tensor([prompt] * batch)
        torch.manual_seed(0)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_id)
        return int(out[:, len(prompt):].numel())

    return run


if __name__ == "__main__":
    main()
