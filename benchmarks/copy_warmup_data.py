"""Does a model trained from scratch copy a real tool result it has in its context? The world
model's job in rehearsal is mostly that (a list of orders, events or accounts shown by an example
call), and JSON lists repeat their keys in every item, unlike the random spans of the copy warm-up.

    python benchmarks/copy_warmup_data.py --threads 1 --data-frac 0,0.5 [--steps 1500]
    python benchmarks/copy_warmup_data.py --threads 1 --checkpoint RUN/sft/step-00000000

For each setting, a fresh ``llama:128x2`` (``--model``) on a 2,048-token BPE trained on the results runs the copy
warm-up (``--data-frac``: the share of steps copying windows of real results of 200 train tasks
per world); with ``--checkpoint`` a saved model is measured as it is. The measure: rows ``[R filler
R]`` for the real results R (over 60 tokens, up to 300) of the reference calls of 40 other train
tasks per world; teacher-forced greedy accuracy on the repeat, and the share of results repeated
without one wrong token.
"""

from __future__ import annotations

import json
import random
import time

import torch

from _common import make_parser, start
from envace.envs.registry import make_world
from envace.envs.tasks import load_tasks
from envace.policy.data_tokenizer import train_data_tokenizer
from envace.policy.loading import load_model, scratch_llama, smollm2_tokenizer
from envace.train.copy_warmup import copy_warmup, data_vocabulary
from envace.train.forward import decoder_and_head

WORLDS = ("shop", "calendar", "bank")


def real_results(first: int, last: int) -> list[str]:
    """The real results of the reference calls of difficulty-1 train tasks ``first..last-1`` per world."""
    out = []
    for w in WORLDS:
        for task in load_tasks(w, split="train", n=1200, difficulties=[1])[first:last]:
            world = make_world(w, task.env.seed)
            out += [json.dumps(world.call(c.name, c.arguments)) for c in task.reference.calls]
    return out


def held_rows(tok, texts: list[str]) -> list[list[int]]:
    """The token ids of the results over 60 tokens, cut at 300 (the simulator cap is 320)."""
    return [ids[:300] for ids in (tok(t, add_special_tokens=False)["input_ids"] for t in texts) if len(ids) > 60]


@torch.no_grad()
def copy_scores(model, rows: list[list[int]], seed: int = 0) -> tuple[float, float]:
    decoder, head = decoder_and_head(model)
    rng = random.Random(seed)
    accuracy, whole = [], 0
    for r in rows:
        filler = [rng.choice(r) for _ in range(rng.randint(4, 24))]
        h = decoder(input_ids=torch.tensor([r + filler + r])).last_hidden_state
        pred = head(h[:, len(r) + len(filler) - 1: 2 * len(r) + len(filler) - 1]).argmax(-1)[0]
        ok = pred == torch.tensor(r)
        accuracy.append(float(ok.float().mean()))
        whole += bool(ok.all())
    return sum(accuracy) / len(accuracy), whole / len(rows)


def main() -> None:
    p = make_parser(__doc__)
    p.add_argument("--data-frac", default="0,0.5", help="comma list of copy_warmup_data settings")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--data-span", type=int, default=128)
    p.add_argument("--model", default="llama:128x2", help="the llama:HIDDENxLAYERS model to warm up")
    p.add_argument("--checkpoint", default=None, help="measure this saved model instead of warming up")
    args = start(p, "copy of real tool results: random-span vs real-result copy warm-up")
    train, held = real_results(0, 200), real_results(300, 340)
    if args.checkpoint:
        model, tok = load_model(args.checkpoint)
        rows = held_rows(tok, held)
        acc, whole = copy_scores(model.eval(), rows)
        print(f"checkpoint {args.checkpoint}: {len(rows)} results, copy accuracy {acc:.3f}, whole {whole:.3f}")
        return
    tok = train_data_tokenizer(train, 2048, smollm2_tokenizer())
    data = [tok(t, add_special_tokens=False)["input_ids"] for t in train]
    rows = held_rows(tok, held)
    print(f"{len(data)} training results, {len(rows)} held-out results over 60 tokens")
    print("| copy_warmup_data | steps | seconds | last loss | copy accuracy | whole results |")
    print("|---|---|---|---|---|---|")
    for frac in (float(x) for x in args.data_frac.split(",")):
        model = scratch_llama(args.model, tok)
        t0 = time.perf_counter()
        stats = copy_warmup(model, data_vocabulary(data, 4096), args.steps, lr=1e-3, span=16, seed=0,
                            data=data, data_frac=frac, data_span=args.data_span)
        seconds = time.perf_counter() - t0
        acc, whole = copy_scores(model.eval(), rows)
        print(f"| {frac} | {args.steps} | {seconds:.0f} | {stats.last_loss:.3f} | {acc:.3f} | {whole:.3f} |")


if __name__ == "__main__":
    main()
