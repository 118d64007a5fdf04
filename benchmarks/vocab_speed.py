"""What a data vocabulary (``sft.vocab``) buys a model trained from scratch: one optimiser step
(forward + backward + AdamW) and copy warm-up steps of ``llama:HxL`` with SmolLM2's 49,152-token
vocabulary against a byte-level BPE of 2,048 tokens learned on the demo's oracle text.

    python benchmarks/vocab_speed.py --threads 1 [--models 128x2,256x4] [--repeats 3]

Both sides of each ratio run back to back (the same load hits them alike); median of --repeats.
"""

from __future__ import annotations

import time

import torch

from _common import make_parser, median, start
from envace.policy.loading import scratch_llama, smollm2_tokenizer
from envace.train.copy_warmup import copy_warmup


class _Sized:
    """Only what scratch_llama reads of a tokenizer: its size and the special ids."""

    def __init__(self, n: int) -> None:
        self.n, self.bos_token_id, self.eos_token_id, self.pad_token_id = n, 1, 2, 2

    def __len__(self) -> int:
        return self.n


def _step_seconds(model, vocab: int, rows: int, length: int, repeats: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return median(times[1:])


def _copy_seconds(model, steps: int) -> float:
    t0 = time.perf_counter()
    copy_warmup(model, list(range(3, 1100)), steps, lr=1e-3, span=16, seed=0)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    parser = make_parser(__doc__)
    parser.add_argument("--models", default="128x2,256x4", help="HIDDENxLAYERS, comma-separated")
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=600)
    parser.add_argument("--copy-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = start(parser, "data vocabulary: step cost of from-scratch models")
    full = len(smollm2_tokenizer())
    print(f"batch {args.rows} x {args.length} tokens; copy warm-up batch 32 x <= 48 tokens")
    print(f"{'model':>8} {'vocab':>6} {'params':>8} {'step s':>8} {'copy step s':>12}")
    for shape in args.models.split(","):
        row = {}
        for vocab in (full, args.vocab):
            model = scratch_llama(f"llama:{shape}", _Sized(vocab)).train()
            params = sum(p.numel() for p in model.parameters()) / 1e6
            step = _step_seconds(model, vocab, args.rows, args.length, args.repeats)
            copy = _copy_seconds(model, args.copy_steps)
            row[vocab] = (step, copy)
            print(f"{shape:>8} {vocab:>6} {params:>7.2f}M {step:>8.3f} {copy:>12.3f}")
        (s_full, c_full), (s_small, c_small) = row[full], row[args.vocab]
        print(f"{shape:>8} speed-up with {args.vocab} tokens: step x{s_full / s_small:.1f}, copy step x{c_full / c_small:.1f}")


if __name__ == "__main__":
    main()
