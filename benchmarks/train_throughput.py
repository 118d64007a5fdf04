"""Training throughput (issue #6, item 2): one role-wise GRPO update vs a plain PyTorch loop.

Usage: python benchmarks/train_throughput.py [--model smollm2] [--tasks 2] [--group-size 2]
           [--max-turns 2] [--micro-batch-tokens 4096] [--repeats 2] [--threads 1]
           [--only grpo|plain|trl] [--trl] [--recompute] [--lora]
           [--gradient-checkpointing] [--mixed-precision bf16]

Samples: the scripted oracle's trajectories of the first ``--tasks`` shop test tasks (real
prompts as the rollout engine renders them, real tool results), ``--group-size`` copies each,
caller and simulator turns, advantages +-1, sampler log-probs filled in by the model (so the
PPO ratio starts at 1, as in a real step).

* **grpo**: ``envace.train.step.GRPOUpdater.step`` (micro-batches by token budget, role-wise
  clipped PPO loss on generated tokens, the vocabulary head only at generated positions,
  grad-norm clipping, AdamW).
* **plain**: the loop anyone would write first, over the same samples in length-sorted
  micro-batches of the same token budget: ``model(ids).logits`` at every position, ``log_softmax``, advantage-weighted
  log-likelihood of the generated tokens, ``backward``, clip, AdamW step.
* **trl** (``--trl``): TRL's ``GRPOTrainer`` loss and optimiser on the same samples (see TRLStep).
* **recompute** / **own-forward** (``--recompute``): rollouts from a bf16 copy or a serving engine
  need the trainer's log-probs; a separate scoring pass before the update, or the update's own
  forward (``UpdaterConfig.old_logprobs="current"``, what ``envace train`` does at one PPO epoch).
  With ``--mixed-precision bf16`` a third side, **own-forward-bf16**, is that update under
  ``mixed_precision: bf16``: the whole lever stack against the separate-pass fp32 update.

All sides run back to back in one process, alternating, ``--repeats`` times after one warm-up step
each; the figure is tokens (prompt + generated, no padding) per second of update wall time, and
the ratio grpo/plain per repeat (both over the same samples; the updater may merge a
trajectory's caller turns into one sequence, which is part of what is measured). Padding waste: the padded share of our length-sorted
micro-batches, next to the same budget filled in arrival order. ``--only`` runs one side (for
the peak-memory script, which needs one side per process). Peak RSS is printed at the end.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import current_rss_mib, load1, make_parser, peak_rss_mib, spread, start  # noqa: E402
from _samples import oracle_samples, sample_stats  # noqa: E402

from envace.core.prompts import PromptStyle  # noqa: E402
from envace.experiments.tasks import select_tasks  # noqa: E402
from envace.policy.loading import load_model  # noqa: E402
from envace.train.advantages import ScoredSample  # noqa: E402
from envace.train.batching import pack_samples, padding_fraction, sequence_length, split_micro_batches  # noqa: E402
from envace.train.forward import recompute_logprobs, token_logprobs  # noqa: E402
from envace.train.step import GRPOUpdater, UpdaterConfig  # noqa: E402

try:  # caller-turn merging (newer trees); older ones train turn by turn
    from envace.train.batching import merge_trajectory_turns  # noqa: E402
except ImportError:
    merge_trajectory_turns = None


def arrival_order_split(batch: list[ScoredSample], max_tokens: int) -> list[list[ScoredSample]]:
    """The same token budget filled in arrival order (no length sorting): the padding baseline."""
    out: list[list[ScoredSample]] = []
    cur: list[ScoredSample] = []
    for s in batch:
        longest = max([sequence_length(x) for x in cur] + [sequence_length(s)])
        if cur and (len(cur) + 1) * longest > max_tokens:
            out.append(cur)
            cur = []
        cur.append(s)
    return out + ([cur] if cur else [])


@torch.no_grad()
def fill_logprobs(model, scored: list[ScoredSample], pad_id: int, max_tokens: int) -> list[ScoredSample]:
    """Replace placeholder sampler log-probs by the model's own (ratio 1 at the first step)."""
    out = []
    model.eval()
    for mb in split_micro_batches(scored, max_tokens):
        packed = pack_samples(mb, pad_id=pad_id)
        logp, _ = token_logprobs(model, packed)
        for i, s in enumerate(mb):
            row = logp[i][packed.token_mask[i]].tolist()
            out.append(ScoredSample(sample=s.sample.model_copy(update={"logprobs": row}), advantage=s.advantage,
                                    reward=s.reward))
    model.train()
    return out


class PlainLoop:
    """Plain forward/backward/step over the same micro-batches (see the module doc)."""

    def __init__(self, model, lr: float, max_tokens: int, pad_id: int) -> None:
        self.model, self.max_tokens, self.pad_id = model, max_tokens, pad_id
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=lr)

    def step(self, scored: list[ScoredSample]) -> dict[str, float]:
        self.opt.zero_grad(set_to_none=True)
        n_gen = sum(s.n_tokens for s in scored)
        for mb in split_micro_batches(scored, self.max_tokens):
            packed = pack_samples(mb, pad_id=self.pad_id)
            ids, mask = packed.input_ids, packed.attention_mask
            logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            gen_mask = torch.zeros_like(logp)
            gen_mask[:, packed.window_start:] = packed.token_mask.float()
            loss = -(logp * gen_mask * packed.advantages[:, None]).sum() / n_gen
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return {}


class TRLStep:
    """TRL's ``GRPOTrainer`` loss (``compute_loss``: the forward with ``logits_to_keep``, its
    default "dapo" token-mean loss, the entropy it logs) and its optimiser over the same samples,
    as a TRL user's update would run them: prompts left-padded and completions right-padded per
    micro-batch, micro-batches of the same token budget in arrival order (TRL batches a fixed number
    of rows, unsorted), then clip and AdamW. Generation, which TRL would run first, is not timed:
    both sides update on the same given samples. TRL's defaults stay (gradient checkpointing on),
    except fp32 (``bf16=False``) as our side runs. Beside other sides it trains its own copy of the
    model (``own_copy``): TRL switches checkpointing on in the model it gets. Needs ``pip install
    trl`` (the ``trl`` extra; not an envace dependency)."""

    def __init__(self, model, tok, lr: float, max_tokens: int, pad_id: int, own_copy: bool = True) -> None:
        import tempfile

        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        self.max_tokens, self.pad_id = max_tokens, pad_id
        args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl-peer-"), use_cpu=not torch.cuda.is_available(),
                          report_to="none", save_strategy="no", learning_rate=lr, beta=0.0, bf16=False,
                          num_generations=2, per_device_train_batch_size=2, max_grad_norm=1.0)
        self.trainer = GRPOTrainer(model=copy.deepcopy(model) if own_copy else model,
                                   reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                                   train_dataset=Dataset.from_dict({"prompt": ["-"] * 2}),
                                   processing_class=tok)
        self.model = self.trainer.model
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = self.trainer.create_optimizer()
        # Trainer.train() switches activation checkpointing on (TRL's default) before its loop; we
        # never call train(), so do what it does.
        self.checkpointing = bool(getattr(args, "activation_checkpointing", args.gradient_checkpointing))
        if self.checkpointing:
            kwargs = dict(getattr(args, "activation_checkpointing_kwargs", None)
                          or args.gradient_checkpointing_kwargs or {})
            if hasattr(self.model, "activation_checkpointing_enable"):
                self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None)
            else:
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)

    def _inputs(self, mb: list[ScoredSample], n_micro: int, total_gen: int) -> dict:
        rows = len(mb)
        p_len = max(len(s.sample.prompt_ids) for s in mb)
        c_len = max(s.n_tokens for s in mb)
        prompt = torch.full((rows, p_len), self.pad_id)
        prompt_mask = torch.zeros(rows, p_len, dtype=torch.long)
        comp = torch.full((rows, c_len), self.pad_id)
        comp_mask = torch.zeros(rows, c_len, dtype=torch.long)
        for i, s in enumerate(mb):
            pi, gi = s.sample.prompt_ids, s.sample.gen_ids
            prompt[i, p_len - len(pi):] = torch.tensor(pi)
            prompt_mask[i, p_len - len(pi):] = 1
            comp[i, :len(gi)] = torch.tensor(gi)
            comp_mask[i, :len(gi)] = 1
        # "dapo" divides by num_items_in_batch * accumulation steps / steps_per_generation: this makes
        # the summed micro-batch losses the token mean over the whole batch, as ours is.
        items = total_gen * self.trainer.args.steps_per_generation / n_micro
        return {"prompt_ids": prompt, "prompt_mask": prompt_mask, "completion_ids": comp,
                "completion_mask": comp_mask, "advantages": torch.tensor([s.advantage for s in mb]),
                "num_items_in_batch": torch.tensor(items)}

    def step(self, scored: list[ScoredSample]) -> dict[str, float]:
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        micro = arrival_order_split(scored, self.max_tokens)
        total_gen = sum(s.n_tokens for s in scored)
        self.trainer.current_gradient_accumulation_steps = len(micro)  # what Trainer sets in its loop
        for mb in micro:
            with self.trainer.compute_loss_context_manager():  # as Trainer.training_step runs it
                loss = self.trainer.compute_loss(self.model, self._inputs(mb, len(micro), total_gen))
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return {}


def main() -> None:
    p = make_parser(__doc__, model="smollm2", world="shop", tasks=2, group_size=2, max_turns=2)
    p.add_argument("--micro-batch-tokens", type=int, default=4096)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", choices=["grpo", "plain", "trl"], default=None)
    p.add_argument("--trl", action="store_true", help="also time TRL's GRPOTrainer loss and optimiser (needs trl)")
    p.add_argument("--unmerged", action="store_true",
                   help="also time the GRPO update with caller-turn merging off (grpo-unmerged)")
    p.add_argument("--lora", action="store_true", help="train a LoRA adapter (r=16) instead of all weights")
    p.add_argument("--recompute", action="store_true",
                   help="rollouts from another dtype/engine: time a separate log-prob recompute pass + the update "
                        "(recompute) against the update taking them from its own forward (own-forward)")
    p.add_argument("--mixed-precision", choices=["no", "bf16"], default="no",
                   help="with --recompute: also time the own-forward update under mixed_precision bf16")
    p.add_argument("--no-share-prefixes", action="store_true",
                   help="grpo side: one plain forward over the padded rows (no shared-prefix forward)")
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="grpo side: grpo.gradient_checkpointing (activations recomputed in the backward)")
    args = start(p, "training throughput: role-wise GRPO update vs plain forward/backward/step")

    t0 = time.perf_counter()
    model, tok = load_model(args.model)
    if args.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    model.train()
    rss_loaded = current_rss_mib()
    print(f"load        {args.model}: {time.perf_counter() - t0:.1f} s, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, RSS {rss_loaded:.0f} MiB")
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    tasks = select_tasks(args.world, "test", limit=args.tasks, tool_distractors=1)
    style = PromptStyle(max_examples=2, max_history_results=3)  # configs/demo.yaml's prompt settings
    scored = oracle_samples(tok, tasks, style, args.group_size, args.max_turns)
    scored = fill_logprobs(model, scored, pad_id, args.micro_batch_tokens)
    real_tokens = sum(sequence_length(s) for s in scored)
    print(f"samples     {sample_stats(scored)}; peak RSS so far {peak_rss_mib():.0f} MiB (before any update)")
    plain_mb = split_micro_batches(scored, args.micro_batch_tokens)
    merged = merge_trajectory_turns(scored) if merge_trajectory_turns is not None else scored
    ours_mb = split_micro_batches(merged, args.micro_batch_tokens)
    merged_tokens = sum(sequence_length(s) for s in merged)
    print(f"merging     the updater's caller-turn merging: {len(merged)} sequences, {merged_tokens} tokens "
          f"({merged_tokens / real_tokens:.0%} of the samples' tokens)")
    print(f"padding     length-sorted micro-batches: {padding_fraction(plain_mb):.1%} of {len(plain_mb)} "
          f"(unmerged), {padding_fraction(ours_mb):.1%} of {len(ours_mb)} (merged); arrival order, same budget: "
          f"{padding_fraction(arrival_order_split(scored, args.micro_batch_tokens)):.1%}")
    gen = sum(s.n_tokens for s in scored)
    padded = sum(len(mb) * max(sequence_length(s) for s in mb) for mb in plain_mb)
    print(f"head        vocabulary rows: grpo {gen} (generated positions only), plain {padded - len(plain_mb)} "
          f"(every position)")

    sides = {}
    if args.only in (None, "grpo"):
        sides["grpo"] = GRPOUpdater(model, UpdaterConfig(lr=args.lr, micro_batch_tokens=args.micro_batch_tokens,
                                                         pad_id=pad_id, share_prefixes=not args.no_share_prefixes,
                                                         gradient_checkpointing=args.gradient_checkpointing)).step
    if args.unmerged:
        sides["grpo-unmerged"] = GRPOUpdater(model, UpdaterConfig(
            lr=args.lr, micro_batch_tokens=args.micro_batch_tokens, pad_id=pad_id, merge_turns=False)).step
    if args.only in (None, "plain"):
        sides["plain"] = PlainLoop(model, args.lr, args.micro_batch_tokens, pad_id).step
    if args.recompute:
        cfg = dict(lr=args.lr, micro_batch_tokens=args.micro_batch_tokens, pad_id=pad_id)
        sampler_side = GRPOUpdater(model, UpdaterConfig(**cfg))
        own_side = GRPOUpdater(model, UpdaterConfig(**cfg, old_logprobs="current"))

        def recompute_then_update(batch: list[ScoredSample]) -> dict[str, float]:
            recompute_logprobs(model, [s.sample for s in batch], 1.0, pad_id, args.micro_batch_tokens)
            return sampler_side.step(batch)

        sides["recompute"] = recompute_then_update
        sides["own-forward"] = own_side.step
        if args.mixed_precision == "bf16":
            sides["own-forward-bf16"] = GRPOUpdater(model, UpdaterConfig(**cfg, old_logprobs="current",
                                                                          mixed_precision="bf16")).step
    if args.only == "trl" or (args.only is None and args.trl):
        trl = TRLStep(model, tok, args.lr, args.micro_batch_tokens, pad_id, own_copy=bool(sides))
        sides["trl"] = trl.step
        print(f"trl         GRPOTrainer loss + AdamW, gradient checkpointing {'on' if trl.checkpointing else 'off'}, "
              f"arrival-order micro-batches: {len(arrival_order_split(scored, args.micro_batch_tokens))}")
    warm = scored[:2]
    for name, step in sides.items():  # allocator, optimiser state, first-call set-up
        step(warm)
    times: dict[str, list[float]] = {k: [] for k in sides}
    ratios, loads = [], []
    for rep in range(args.repeats):
        loads.append(load1())
        order = list(sides.items()) if rep % 2 == 0 else list(sides.items())[::-1]  # alternate who goes first
        for name, step in order:
            t = time.perf_counter()
            step(scored)
            times[name].append(time.perf_counter() - t)
            print(f"repeat {rep}  {name:<13} {times[name][-1]:.1f} s = {real_tokens / times[name][-1]:.1f} tok/s "
                  f"(load1 {load1():.2f})", flush=True)
        if "grpo" in sides and "plain" in sides:
            ratios.append(times["plain"][-1] / times["grpo"][-1])
            print(f"repeat {rep}  grpo/plain throughput = {ratios[-1]:.3f}", flush=True)
        if "recompute" in sides:
            print(f"repeat {rep}  own-forward/recompute throughput = "
                  f"{times['recompute'][-1] / times['own-forward'][-1]:.3f}", flush=True)
        if "own-forward-bf16" in sides:
            print(f"repeat {rep}  own-forward-bf16/recompute throughput = "
                  f"{times['recompute'][-1] / times['own-forward-bf16'][-1]:.3f}", flush=True)
        if "grpo" in sides and "trl" in sides:
            print(f"repeat {rep}  grpo/trl throughput = {times['trl'][-1] / times['grpo'][-1]:.3f}", flush=True)
    print("-- summary (median [min-max])")
    for name in sides:
        print(f"{name:<13} tok/s   {spread([real_tokens / t for t in times[name]])}")
    if ratios:
        print(f"grpo / plain  {spread(ratios)}   (target >= 0.9)")
    if "recompute" in sides:
        print(f"own-forward / recompute  {spread([r / o for r, o in zip(times['recompute'], times['own-forward'])])}")
    if "own-forward-bf16" in sides:
        print(f"own-forward-bf16 / recompute  "
              f"{spread([r / o for r, o in zip(times['recompute'], times['own-forward-bf16'])])}")
    if "grpo" in sides and "trl" in sides:
        print(f"grpo / trl    {spread([t / g for t, g in zip(times['trl'], times['grpo'])])}")
    if "grpo-unmerged" in sides and "plain" in sides:
        print(f"grpo-unmerged / plain  {spread([p / u for p, u in zip(times['plain'], times['grpo-unmerged'])])}")
    print(f"load1         {spread(loads)}")
    print(f"peak RSS      {peak_rss_mib():.0f} MiB (after load {rss_loaded:.0f} MiB)")


if __name__ == "__main__":
    main()
