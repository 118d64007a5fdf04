"""torch.compile as a lever on the GRPO update (issue #20, item 1): one bf16 update of SmolLM2 +
LoRA r=16 with eager decoder layers against the same update with every decoder layer compiled
(``layer.compile(dynamic=True)``: the layers only, so the prefix-sharing cache code around them
stays eager), on the same oracle samples.

Usage: python benchmarks/compile_update.py [--model smollm2] [--tasks 2] [--group-size 2]
           [--max-turns 2] [--repeats 2] [--micro-batch-tokens 2048] [--threads 1]

Samples as in bf16_update.py. Two copies of the model start from the same weights; the first two
rounds (compilation, and recompiles for new shapes) are not timed; each timed round steps both,
alternating who goes first. Printed: tokens per second of each and the paired ratio.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load1, make_parser, peak_rss_mib, spread, start  # noqa: E402
from bf16_update import lora_pair_and_samples  # noqa: E402

from envace.train.forward import decoder_and_head  # noqa: E402
from envace.train.step import GRPOUpdater, UpdaterConfig  # noqa: E402

UNTIMED = 2  # compilation, then the recompiles for shapes the first round did not have


def main() -> None:
    p = make_parser(__doc__, model="smollm2", world="shop", tasks=2, group_size=2, max_turns=2)
    p.add_argument("--micro-batch-tokens", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=2)
    args = start(p, "GRPO update: eager vs compiled decoder layers (SmolLM2 + LoRA r=16, bf16 autocast)")
    eager, compiled, pad_id, scored, tokens = lora_pair_and_samples(args)
    parts = decoder_and_head(compiled)
    if parts is None:
        raise SystemExit(f"{args.model}: not a transformers decoder with separate layers")
    for layer in parts[0].layers:
        layer.compile(dynamic=True)
    cfg = UpdaterConfig(lr=1e-4, micro_batch_tokens=args.micro_batch_tokens, pad_id=pad_id, old_logprobs="current",
                        mixed_precision="bf16")
    ups = {"eager": GRPOUpdater(eager, cfg), "compiled": GRPOUpdater(compiled, cfg)}
    times: dict[str, list[float]] = {name: [] for name in ups}
    for rep in range(args.repeats + UNTIMED):
        for name in (["eager", "compiled"] if rep % 2 == 0 else ["compiled", "eager"]):
            t = time.perf_counter()
            ups[name].step(scored)
            dt = time.perf_counter() - t
            if rep >= UNTIMED:
                times[name].append(dt)
            print(f"round {rep}  {name:<8}  {dt:.1f} s = {tokens / dt:.1f} tok/s (load1 {load1():.2f})", flush=True)
    print("-- summary (median [min-max])")
    for name in times:
        print(f"{name:<8} tok/s  {spread([tokens / t for t in times[name]])}")
    print(f"compiled / eager throughput  {spread([e / c for e, c in zip(times['eager'], times['compiled'])])}")
    from torch._dynamo.utils import counters

    print(f"compiled graphs {counters['stats']['unique_graphs']}, graph breaks {sum(counters['graph_break'].values())}")
    print(f"peak RSS {peak_rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
