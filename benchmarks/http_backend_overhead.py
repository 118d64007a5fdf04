"""What the HTTP hop costs: the same generation in process and through ``envace serve`` on loopback.

Usage: python benchmarks/http_backend_overhead.py [--model tiny] [--prompts 8] [--new-tokens 16]
                                                   [--concurrency 1 4 8] [--threads N] [--burst 200]

Rows: in-process batched generate; HTTP one request per prompt at each concurrency (the default
mode, what vLLM wants: each prompt has its own seed); HTTP one batched request (``batch_prompts``:
what envace serve wants, since it generates one request at a time). Greedy, fixed prompts; tokens/s
counts generated tokens. On vLLM/SGLang the per-prompt mode is the fast one (continuous batching).
``--burst N`` then sends N requests at once (asyncio, one connection each) and counts the answers:
200s, 503s (queue full, ``--max-queue``) and transport errors (resets), with the wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import time

import httpx2
import torch

from envace.policy.http_backend import HTTPBackend
from envace.policy.http_server import OpenAIServer
from envace.core.sampling import SamplingParams
from envace.policy.transformers_backend import TransformersBackend


def timed(fn, repeats: int) -> tuple[float, int]:
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        gens = fn()
        best = min(best, time.perf_counter() - start)
        tokens = sum(len(g.token_ids) for g in gens)
    return best, tokens


async def burst(url: str, n: int, body: dict) -> list:
    limits = httpx2.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx2.AsyncClient(timeout=600, limits=limits) as client:
        return await asyncio.gather(*(client.post(url + "/completions", json=body) for _ in range(n)),
                                    return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--burst", type=int, default=0, help="then N concurrent requests at once (0: skip)")
    parser.add_argument("--max-queue", type=int, default=256)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"date        {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"machine     {platform.machine()} cpus={os.cpu_count()} load1={load:.2f}  torch {torch.__version__} "
          f"threads={torch.get_num_threads()}")
    backend = TransformersBackend.from_spec(args.model, max_batch=args.prompts)
    tok = backend.tokenizer
    prompts = []
    for i in range(args.prompts):
        chat = [{"role": "user", "content": f"Request {i}: cancel order o-{i} and report the refund."}]
        text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        prompts.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0)
    backend.generate(prompts[:1], params)  # warm-up

    rows = [("in-process batch", lambda: backend.generate(prompts, params))]
    with OpenAIServer(backend, model_name=args.model, max_queue=args.max_queue) as server:
        for c in args.concurrency:
            http = HTTPBackend(server.url, tokenizer=tok, max_concurrency=c)
            rows.append((f"http per-prompt c={c}", lambda http=http: http.generate(prompts, params)))
        batched = HTTPBackend(server.url, tokenizer=tok, batch_prompts=True, max_concurrency=1)
        rows.append(("http one batched request", lambda: batched.generate(prompts, params)))
        print(f"{'mode':28s} {'seconds':>8s} {'tokens':>7s} {'tok/s':>8s}")
        for name, fn in rows:
            seconds, tokens = timed(fn, args.repeats)
            print(f"{name:28s} {seconds:8.3f} {tokens:7d} {tokens / seconds:8.1f}")
        if args.burst:
            body = {"model": args.model, "prompt": prompts[0], "max_tokens": args.new_tokens, "temperature": 0}
            start = time.perf_counter()
            answers = asyncio.run(burst(server.url, args.burst, body))
            seconds = time.perf_counter() - start
            codes = [a.status_code if isinstance(a, httpx2.Response) else type(a).__name__ for a in answers]
            counts = {c: codes.count(c) for c in sorted(set(codes), key=str)}
            print(f"burst of {args.burst} concurrent requests (max_queue={args.max_queue}): {seconds:.2f} s, "
                  f"answers {counts}")


if __name__ == "__main__":
    main()
