"""Rehearse: a model writes the tool response under the simulator prompt. The policy itself
(``rehearsal``: its turns are training samples) or a frozen model (``simulator``: the
external-simulator baseline); the real world's answer is :class:`envace.rollout.sources.RealSource`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from envace.core.prompts import PromptStyle, render_simulator_prompt
from envace.core.sampling import SamplingParams
from envace.core.toolcall import RESULT_CLOSE, parse_execution_result
from envace.core.types import Example, Source, Task, TurnSample
from envace.rollout.sources import (
    ToolRequest,
    ToolResponse,
    dump_result,
    example_for,
    example_match_score,
    output_shape_error,
    record_holds,
)


class SimulatorSample(TurnSample):
    """A rehearse-role turn for a call that matches a recorded example, with ``example_match``
    (:func:`example_match_score` against the recorded result): the sample's reward in place of
    its trajectory's where the run trains the rehearse role on recorded results."""

    example_match: float | None = None


@dataclass
class ModelSource:
    """A model writing tool responses under the simulator prompt.

    ``record_samples`` is what separates rehearsal (the policy; its turns are trained) from the
    external simulator (frozen; nothing recorded).

    Grounding in what the task gives: with ``examples_as_recorded`` a call that matches a recorded
    example (:func:`example_for`) is answered with the recorded result (the model does not
    generate it unless ``example_reward`` asks for a training sample), so a recorded call is never
    rehearsed into something else; only until the episode's first write (:func:`record_holds`),
    after which the record may be stale. A generated result that does not fit the tool's declared
    output shape (:func:`output_shape_error`) reaches the caller as written but counts as a
    format failure (``format_ok`` False, the reason in ``extra["shape_error"]``), as non-JSON
    output does: the trajectory counts it and ``grpo.sim_format_reward`` does not pay it. With
    ``example_reward`` each recorded sample carries ``example_match``.
    """

    backend: Any
    name: Source = "rehearsal"
    record_samples: bool = True
    style: PromptStyle = field(default_factory=PromptStyle)
    max_new_tokens: int = 96
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    examples_as_recorded: bool = True
    example_reward: bool = False

    def start(self, task: Task) -> Any:
        return None

    def _generates(self, example: Example | None) -> bool:
        return example is None or not self.examples_as_recorded or (self.example_reward and self.record_samples)

    def respond(self, requests: list[ToolRequest]) -> list[ToolResponse]:
        if not requests:
            return []
        grounded = self.examples_as_recorded or self.example_reward
        examples = [example_for(r.task, r.call) if grounded and record_holds(r.task, r.earlier) else None
                    for r in requests]
        out: list[ToolResponse | None] = [None] * len(requests)
        todo = [i for i, ex in enumerate(examples) if self._generates(ex)]
        if todo:
            tok = self.backend.tokenizer
            prompts = {i: render_simulator_prompt(tok, requests[i].task, requests[i].call, requests[i].earlier,
                                                  self.style) for i in todo}
            params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                    top_p=self.top_p, stop=[RESULT_CLOSE], seed=self.seed)
            t0 = time.perf_counter()
            gens = self.backend.generate([prompts[i] for i in todo], params)
            per = (time.perf_counter() - t0) / len(todo)
            prefix = "<execution_result>" if self.style.prefill_result_tag else ""
            for i, g in zip(todo, gens):
                out[i] = self._response(requests[i], examples[i], prompts[i], g, prefix, per)
        for i, ex in enumerate(examples):
            if out[i] is None:  # answered as recorded, nothing generated
                out[i] = ToolResponse(text=dump_result(ex.result), rehearsed=True, extra={"as_recorded": True})
        return out  # type: ignore[return-value]

    def _response(self, r: ToolRequest, example: Example | None, prompt: list[int], g: Any, prefix: str,
                  seconds: float) -> ToolResponse:
        parsed = parse_execution_result(prefix + g.text)
        shape = output_shape_error(r.task, r.call, parsed.value) if parsed.ok else None
        ok = parsed.ok and shape is None
        extra: dict[str, Any] = {"gen_tokens": len(g.token_ids)}
        if shape is not None:
            extra["shape_error"] = shape
        match = None
        if example is not None and self.example_reward:
            match = example_match_score(example.result, parsed.text, ok)
            extra["example_match"] = match
        sample = None
        if self.record_samples:
            fields_ = dict(role="simulator", group_id=r.task.id, trajectory_index=r.trajectory_index, turn=r.turn,
                           prompt_ids=prompt, gen_ids=list(g.token_ids), logprobs=list(g.logprobs),
                           finish=g.finish, format_ok=ok)
            sample = SimulatorSample(**fields_, example_match=match) if match is not None else TurnSample(**fields_)
        if example is not None and self.examples_as_recorded:
            extra["as_recorded"] = True  # the caller sees the recorded result; the sample is still scored
            return ToolResponse(text=dump_result(example.result), rehearsed=True, sample=sample,
                                gen_seconds=seconds, extra=extra)
        return ToolResponse(text=parsed.text, rehearsed=True, format_ok=ok, sample=sample, gen_seconds=seconds,
                            extra=extra)
