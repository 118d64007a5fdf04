"""Which torch thread count to use when another job holds a core (issue #18, item 5).

Usage: python benchmarks/thread_default.py [--model smollm2] [--new-tokens 24] [--batch 4] [--repeats 2]

Times the same batched SmolLM2 generation (fixed length, EOS ignored) with 1 thread and with
one thread per core, first on a quiet machine, then with a busy-loop process per core but one
(the "other job" of a shared box); conditions alternate within each repeat. Also prints what
``envace.policy.threads.default_threads()`` picks in each state. Run it with nothing else running.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_header, spread  # noqa: E402

from envace.core.sampling import SamplingParams  # noqa: E402
from envace.policy.threads import default_threads  # noqa: E402
from envace.policy.transformers_backend import TransformersBackend  # noqa: E402


def _spin() -> None:  # the other job: one core, pure Python, forever
    while True:
        pass


def timed(backend, prompt, threads: int, new_tokens: int, batch: int, seed: int) -> float:
    torch.set_num_threads(threads)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=seed)
    t0 = time.perf_counter()
    outs = backend.generate([prompt] * batch, params)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    cores = os.cpu_count() or 1
    print_header("thread default under load", args)
    backend = TransformersBackend.from_spec(args.model)
    backend.eos_ids = frozenset()
    prompt = backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": "List three uses of a JSON tool call."}], add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    timed(backend, prompt, 1, 4, 1, 0)  # warm-up
    counts = sorted({1, cores})
    rows: dict[tuple[str, int], list[float]] = {}
    for state in ("quiet", "busy"):
        spinners = []
        if state == "busy":
            spinners = [mp.Process(target=_spin, daemon=True) for _ in range(cores - 1)]
            for s in spinners:
                s.start()
            time.sleep(3)  # the load average moves slowly; default_threads also reads /proc/stat
        picked = default_threads()
        try:
            for r in range(args.repeats):
                for n in counts if r % 2 == 0 else reversed(counts):
                    rows.setdefault((state, n), []).append(timed(backend, prompt, n, args.new_tokens, args.batch, r))
        finally:
            for s in spinners:
                s.terminate()
        print(f"{state}: default_threads() picks {picked}")
        for n in counts:
            print(f"  {state} threads={n}: {spread(rows[(state, n)])} tok/s")
    for state in ("quiet", "busy"):
        one, many = rows[(state, 1)], rows[(state, cores)]
        print(f"{state}: threads={cores} / threads=1 = {sorted(many)[len(many) // 2] / sorted(one)[len(one) // 2]:.2f}x")


if __name__ == "__main__":
    main()
