"""Peak memory (RSS) of one training update, one fresh process per case (issue #6, item 3).

Usage: python benchmarks/train_memory.py [--cases demo smollm2 smollm2-plain smollm2-lora]
           [--tasks 2] [--group-size 2] [--max-turns 2] [--threads 1]

Each case runs ``benchmarks/train_throughput.py --only ... --repeats 1`` in its own process
(peak RSS is a per-process high-water mark) and reports the RSS after loading the model and
the peak after a warm-up and one full update over the same oracle samples:

* ``demo``: configs/demo.yaml's model (``llama:128x2`` from scratch) and ``micro_batch_tokens``
  8192, role-wise GRPO update;
* ``smollm2``: SmolLM2-135M, full fine-tuning, GRPO update, ``micro_batch_tokens`` 4096 (the
  updater's default); ``smollm2-8k``: the same at 8192;
* ``smollm2-plain``: SmolLM2 with the plain loop (logits at every position) for comparison;
* ``smollm2-lora``: SmolLM2 with a LoRA adapter (r=16, all linear layers), GRPO update;
  ``smollm2-lora-2k`` / ``-1k``: the same at 2048 / 1024 tokens per micro-batch (activations,
  which dominate, scale with it; configs/smollm2_cpu.yaml uses 2048);
* ``smollm2-lora-ckpt`` / ``-ckpt-2k``: the LoRA update with ``grpo.gradient_checkpointing``;
* ``smollm2-lora-noshare-2k``: the LoRA update without the shared-prefix forward (one padded forward);
* ``smollm2-lora-trl`` / ``-trl-2k``: TRL's GRPOTrainer loss and optimiser on the same samples and
  adapter (``train_throughput.py --only trl``; needs ``pip install trl``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import load1, make_parser, start  # noqa: E402

CASES = {
    "demo": ["--model", "llama:128x2", "--only", "grpo", "--micro-batch-tokens", "8192"],
    "smollm2": ["--model", "smollm2", "--only", "grpo", "--micro-batch-tokens", "4096"],
    "smollm2-8k": ["--model", "smollm2", "--only", "grpo", "--micro-batch-tokens", "8192"],
    "smollm2-plain": ["--model", "smollm2", "--only", "plain", "--micro-batch-tokens", "4096"],
    "smollm2-lora": ["--model", "smollm2", "--only", "grpo", "--micro-batch-tokens", "4096", "--lora"],
    "smollm2-lora-2k": ["--model", "smollm2", "--only", "grpo", "--micro-batch-tokens", "2048", "--lora"],
    "smollm2-lora-1k": ["--model", "smollm2", "--only", "grpo", "--micro-batch-tokens", "1024", "--lora"],
    "smollm2-lora-ckpt": ["--model", "smollm2", "--only", "grpo", "--micro-batch-tokens", "4096", "--lora",
                          "--gradient-checkpointing"],
    "smollm2-lora-ckpt-2k": ["--model", "smollm2", "--only", "grpo", "--micro-batch-tokens", "2048", "--lora",
                             "--gradient-checkpointing"],
    "smollm2-lora-noshare-2k": ["--model", "smollm2", "--only", "grpo", "--micro-batch-tokens", "2048", "--lora",
                                "--no-share-prefixes"],
    "smollm2-lora-trl": ["--model", "smollm2", "--only", "trl", "--micro-batch-tokens", "4096", "--lora"],
    "smollm2-lora-trl-2k": ["--model", "smollm2", "--only", "trl", "--micro-batch-tokens", "2048", "--lora"],
}


def main() -> None:
    p = make_parser(__doc__, tasks=2, group_size=2, max_turns=2)
    p.add_argument("--cases", nargs="+", default=[c for c in CASES if "trl" not in c], choices=list(CASES))
    args = start(p, "peak RSS of one training update (a fresh process per case)")
    common = ["--tasks", str(args.tasks), "--group-size", str(args.group_size), "--max-turns",
              str(args.max_turns), "--repeats", "1", "--threads", str(args.threads)]
    print(f"{'case':<14} {'after load MiB':>14} {'peak MiB':>9} {'update s':>9} {'tok/s':>7} {'load1':>6}  samples")
    for case in args.cases:
        la = load1()
        cmd = [sys.executable, str(HERE / "train_throughput.py"), *CASES[case], *common]
        out = subprocess.run(cmd, capture_output=True, text=True)
        text = out.stdout
        if out.returncode != 0:
            print(f"{case:<14} failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
            continue
        peak = re.search(r"peak RSS\s+(\d+) MiB \(after load (\d+) MiB\)", text)
        upd = re.search(r"repeat 0\s+\w+\s+([\d.]+) s = ([\d.]+) tok/s", text)
        samples = re.search(r"samples\s+(.*)", text)
        print(f"{case:<14} {peak.group(2):>14} {peak.group(1):>9} {upd.group(1):>9} {upd.group(2):>7} {la:>6.2f}  "
              f"{samples.group(1) if samples else ''}", flush=True)


if __name__ == "__main__":
    main()
