"""Rollout throughput (issue #6, item 1): our episode engine vs plain batched ``model.generate``
vs one episode at a time.

Usage: python benchmarks/rollout_throughput.py [--model smollm2] [--tasks 4] [--group-size 8]
           [--max-turns 2] [--caller-tokens 48] [--sim-tokens 64] [--temperature 1]
           [--repeats 1] [--single-rows 4] [--threads 1] [--caller forced|policy] [--no-share]

The fixed set of episodes: the first ``--tasks`` shop test tasks x ``--group-size`` (default
4 x 8 = 32), rehearsal source (the same model writes the tool responses), configs/demo.yaml's
prompt settings, one backend batch per role and turn (``--max-batch`` 32).

* **engine**: ``envace.rollout.engine.run_episodes``; generated tokens (both roles) per second
  of engine time: prompt rendering, parsing, validation, samples and log-probs included.
* **plain**: the same generations with nothing else: right after each batched backend call of
  the engine, the same prompt ids go through one ``model.generate`` call (left padding, greedy
  over logits forced to the engine's tokens, so it produces exactly the engine's rows and
  stops where they stopped; max_new_tokens = the longest row). No log-probs, no parsing.
* **single**: right after each batched call, ``--single-rows`` of its prompts are generated
  alone (batch 1, our backend, the same number of new tokens as the engine's row): the cost
  of running episodes one at a time.

Pairing each batched call with its plain and single replays keeps each comparison within
seconds, so a shared machine's changing load hits both sides alike. Ratios are summed over
the run's calls: engine/plain = plain seconds / (engine seconds), engine/single = engine
tok/s / single tok/s. ``--repeats`` runs it all again with the next seed (median printed).

``--caller forced`` (default): the untrained SmolLM2 mostly answers in prose, which ends an
episode at once and never exercises the rehearsal source. In forced mode the policy still
generates every caller turn (its tokens and time count), but a turn without a well-formed tool
call is replaced by the task's next reference call, so every episode runs ``--max-turns`` turns
with a rehearsed response each, as after an SFT warm start. ``--caller policy`` runs it as is.
``--no-share`` turns the backend's shared-prefix prefill off (the engine before issue #6).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load1, make_parser, spread, start  # noqa: E402

from envace.core.prompts import PromptStyle  # noqa: E402
from envace.core.toolcall import format_tool_call, parse_tool_calls  # noqa: E402
from envace.experiments.tasks import select_tasks  # noqa: E402
from envace.core.sampling import Generation, SamplingParams  # noqa: E402
from envace.policy.transformers_backend import TransformersBackend, pad_rows  # noqa: E402
from envace.rollout.actors import PolicyActor  # noqa: E402
from envace.rollout.engine import RolloutConfig, run_episodes  # noqa: E402
from envace.rollout.rehearse import ModelSource  # noqa: E402


@dataclass
class Call:
    prompts: list[list[int]]
    params: SamplingParams
    outputs: list[Generation]
    seconds: float


@dataclass
class PairedBackend:
    """Delegates to our backend, keeps every batched call, and replays each one at once with
    plain ``model.generate`` and (a few rows) one prompt at a time."""

    inner: TransformersBackend
    single_rows: int = 0
    plain: bool = True
    calls: list[Call] = field(default_factory=list)
    plain_seconds: float = 0.0
    plain_tokens: int = 0
    plain_same_rows: int = 0
    single_seconds: float = 0.0
    single_tokens: int = 0
    paired_ours_seconds: float = 0.0  # our time of the calls that got single replays

    @property
    def tokenizer(self):
        return self.inner.tokenizer

    @property
    def replay_seconds(self) -> float:
        return self.plain_seconds + self.single_seconds

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        t0 = time.perf_counter()
        out = self.inner.generate(prompts, params)
        call = Call([list(p) for p in prompts], params, out, time.perf_counter() - t0)
        self.calls.append(call)
        if self.plain:
            seconds, rows = plain_generate(self.inner, call)
            self.plain_seconds += seconds
            self.plain_tokens += sum(len(r) for r in rows)
            self.plain_same_rows += sum(r == o.token_ids for r, o in zip(rows, out))
        if self.single_rows:
            self.single_seconds += single_generate(self.inner, call, self.single_rows)
            self.single_tokens += sum(len(o.token_ids) for o in out[: self.single_rows])
            self.paired_ours_seconds += call.seconds
        return out


class ForcedCallActor:
    """The policy writes every caller turn; a turn without a well-formed call becomes the task's
    next reference call (see the module doc)."""

    def __init__(self, inner: PolicyActor) -> None:
        self.inner = inner

    def act(self, views, turn):
        turns = self.inner.act(views, turn)
        for view, at in zip(views, turns):
            if at is None:
                continue
            parsed = parse_tool_calls(at.text)
            if parsed.calls and parsed.error is None:
                continue
            ref = view.task.reference
            done = sum(1 for m in view.history if m.role == "assistant")
            if ref is not None and done < len(ref.calls):
                at.text = format_tool_call(ref.calls[done])
        return turns


def make_engine(backend, style, args, seed: int):
    actor = PolicyActor(backend, style=style, max_new_tokens=args.caller_tokens, max_prompt_tokens=2048,
                        temperature=args.temperature, seed=seed)
    source = ModelSource(backend, style=style, max_new_tokens=args.sim_tokens, temperature=args.temperature,
                         seed=seed + 104729)
    return (ForcedCallActor(actor) if args.caller == "forced" else actor), source


class ForceTokens:
    """Logits processor: every row's logits allow only its next target token (EOS once the row's
    targets are used up), so greedy ``generate`` reproduces the target rows exactly."""

    def __init__(self, targets: list[list[int]], prompt_width: int, eos: int) -> None:
        longest = max(len(t) for t in targets) + 1
        self.targets = torch.full((len(targets), longest), eos, dtype=torch.long)
        for i, t in enumerate(targets):
            self.targets[i, : len(t)] = torch.tensor(t, dtype=torch.long)
        self.width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.width
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(1, self.targets[:, step : step + 1], 0.0)


def row_length(tokenizer, row: list[int], eos: frozenset[int], stops: list[str]) -> int:
    """Generated tokens of one ``model.generate`` row, up to and including EOS or the stop string."""
    for k, tok in enumerate(row, 1):
        if tok in eos:
            return k
        if stops:
            text = tokenizer.decode(row[:k], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            if any(s in text for s in stops):
                return k
    return len(row)


def plain_generate(backend: TransformersBackend, call: Call) -> tuple[float, list[list[int]]]:
    """One ``model.generate`` call over the call's prompts, forced to the call's outputs;
    (seconds, generated rows trimmed at EOS / stop string)."""
    from transformers import GenerationConfig, LogitsProcessorList

    model, tok = backend.model, backend.tokenizer
    eos = sorted(backend.eos_ids) or [backend.pad_id]
    ids, mask = pad_rows(call.prompts, backend.pad_id)
    width = ids.shape[1]
    targets = [o.token_ids for o in call.outputs]
    params = call.params
    gc = GenerationConfig(max_new_tokens=max(len(t) for t in targets), do_sample=False, top_k=None, top_p=None,
                          temperature=None, eos_token_id=eos, pad_token_id=backend.pad_id,
                          stop_strings=list(params.stop) or None)
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc, tokenizer=tok,
                             logits_processor=LogitsProcessorList([ForceTokens(targets, width, eos[0])]))
    seconds = time.perf_counter() - t0
    model.train(was_training)
    rows = [row[width:].tolist() for row in out]
    return seconds, [r[: row_length(tok, r, backend.eos_ids, list(params.stop))] for r in rows]


def single_generate(backend: TransformersBackend, call: Call, rows: int) -> float:
    """The first ``rows`` prompts of the call, each alone (batch 1), each generating exactly as
    many tokens as the engine's row did (no EOS, no stop string): one-at-a-time cost."""
    eos_ids = backend.eos_ids
    backend.eos_ids = frozenset()
    try:
        seconds = 0.0
        for prompt, out in list(zip(call.prompts, call.outputs))[:rows]:
            params = SamplingParams(max_new_tokens=len(out.token_ids), temperature=call.params.temperature,
                                    top_p=call.params.top_p, seed=call.params.seed)
            t0 = time.perf_counter()
            backend.generate([prompt], params)
            seconds += time.perf_counter() - t0
        return seconds
    finally:
        backend.eos_ids = eos_ids


def run(backend: TransformersBackend, tasks, style, args, seed: int) -> dict:
    paired = PairedBackend(backend, single_rows=args.single_rows, plain=not args.skip_plain)
    actor, source = make_engine(paired, style, args, seed)
    t0 = time.perf_counter()
    trajs, stats = run_episodes(tasks, actor, source,
                                RolloutConfig(group_size=args.group_size, max_turns=args.max_turns))
    engine_s = time.perf_counter() - t0 - paired.replay_seconds
    tokens = stats.caller_tokens + stats.simulator_tokens
    return {"engine_s": engine_s, "tokens": tokens, "caller": stats.caller_tokens,
            "simulator": stats.simulator_tokens, "episodes": len(trajs), "paired": paired,
            "gen_s": sum(c.seconds for c in paired.calls),
            "prompt_tokens": sum(len(p) for c in paired.calls for p in c.prompts)}


def main() -> None:
    p = make_parser(__doc__, model="smollm2", world="shop", tasks=4, group_size=8, max_turns=2)
    p.add_argument("--caller-tokens", type=int, default=48)
    p.add_argument("--sim-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-batch", type=int, default=32, help="backend rows per forward (32: one batch per turn)")
    p.add_argument("--caller", choices=["forced", "policy"], default="forced")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--single-rows", type=int, default=4, help="rows of each call replayed one at a time (0: skip)")
    p.add_argument("--skip-plain", action="store_true")
    p.add_argument("--no-share", action="store_true", help="turn shared-prefix prefill off")
    p.add_argument("--seed", type=int, default=0)
    args = start(p, "rollout throughput: engine vs plain model.generate vs one episode at a time")

    t0 = time.perf_counter()
    backend = TransformersBackend.from_spec(args.model, max_batch=args.max_batch)
    backend.share_prefixes = not args.no_share
    print(f"load        {args.model}: {time.perf_counter() - t0:.1f} s")
    tasks = select_tasks(args.world, "test", limit=args.tasks, tool_distractors=1)
    style = PromptStyle(max_examples=2, max_history_results=3)  # configs/demo.yaml's prompt settings
    backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, temperature=0))  # warm-up

    ratios, gains, speeds, loads = [], [], [], []
    for rep in range(args.repeats):
        loads.append(load1())
        r = run(backend, tasks, style, args, args.seed + rep)
        pb = r["paired"]
        speeds.append(r["tokens"] / r["engine_s"])
        print(f"repeat {rep}  engine: {r['episodes']} episodes, {r['tokens']} tokens ({r['caller']} caller + "
              f"{r['simulator']} simulator), {r['prompt_tokens']} prompt tokens, {len(pb.calls)} batched calls; "
              f"{r['engine_s']:.1f} s = {speeds[-1]:.1f} tok/s [backend.generate {r['gen_s']:.1f} s, "
              f"everything else {r['engine_s'] - r['gen_s']:.2f} s]", flush=True)
        if not args.skip_plain:
            ratios.append(pb.plain_seconds / r["engine_s"])
            print(f"repeat {rep}  plain:  {pb.plain_tokens} tokens in {pb.plain_seconds:.1f} s = "
                  f"{pb.plain_tokens / pb.plain_seconds:.1f} tok/s; rows identical to the engine's "
                  f"{pb.plain_same_rows}/{sum(len(c.prompts) for c in pb.calls)}; engine/plain = {ratios[-1]:.3f}",
                  flush=True)
        if args.single_rows:
            ours_tps = sum(len(o.token_ids) for c in pb.calls for o in c.outputs) / pb.paired_ours_seconds
            gains.append(ours_tps / (pb.single_tokens / pb.single_seconds))
            print(f"repeat {rep}  single: {pb.single_tokens} tokens one prompt at a time in {pb.single_seconds:.1f} s "
                  f"= {pb.single_tokens / pb.single_seconds:.1f} tok/s; batched/single = {gains[-1]:.2f}x", flush=True)
        print(f"repeat {rep}  load1 before/after {loads[-1]:.2f}/{load1():.2f}", flush=True)
    print("-- summary (median [min-max])")
    print(f"engine tok/s        {spread(speeds)}")
    if ratios:
        print(f"engine / plain      {spread(ratios)}   (target >= 0.9)")
    if gains:
        print(f"batched / single    {spread(gains)}   (target >= 4)")
    print(f"load1 at starts     {spread(loads)}")


if __name__ == "__main__":
    main()
