"""The bf16 generation lever on a real-world eval: ``eval_sides.py`` with A = generation in fp32,
B = in bf16 (``rollout.dtype``, ``envace eval --dtype``). "B minus A" is what the rounding of the
weights costs the policy.

    python benchmarks/eval_dtype.py --config configs/smollm2_cpu.yaml --model WARM/sft/step-00000000 \\
        --tasks 16 --samples 2 --rounds 2
"""

from __future__ import annotations

from _common import make_parser, start
from eval_sides import add_arguments, compare


def main() -> None:
    p = make_parser(__doc__)
    add_arguments(p)
    args = start(p, "real-world eval, generation in fp32 (A) vs bf16 (B)")
    compare(args, ["rollout.dtype=float32"], ["rollout.dtype=bfloat16"])


if __name__ == "__main__":
    main()
