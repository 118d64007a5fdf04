"""GPU check of the vLLM backend (needs ``pip install 'envace[vllm]'`` and a CUDA GPU; not run on CPU).

Usage: python benchmarks/vllm_rollout.py --model PATH_OR_SPEC [--prompts 64] [--new-tokens 256]
                                          [--gpu-memory-utilization 0.5]

Prints, for the model: engine start time; generation tokens/s for --prompts chat prompts at
temperature 1 (one seed per prompt); the mean |vLLM logprob - transformers logprob| on the same
tokens (the train/inference mismatch the PPO ratio sees at step 0); and the time to sync the
weights from a transformers copy (vllm_state_dict + load_weights + prefix-cache reset), then
checks that a greedy continuation is unchanged by a sync of identical weights.
"""

from __future__ import annotations

import argparse
import time

import torch

from envace.policy.loading import load_model
from envace.core.sampling import SamplingParams
from envace.policy.vllm_backend import VLLMBackend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()

    start = time.perf_counter()
    backend = VLLMBackend.from_spec(args.model, gpu_memory_utilization=args.gpu_memory_utilization, dtype=args.dtype,
                                    enforce_eager=False)
    print(f"engine start      {time.perf_counter() - start:.1f} s")
    tok = backend.tokenizer
    prompts = []
    for i in range(args.prompts):
        chat = [{"role": "user", "content": f"Customer {i}: cancel my last order and tell me the refund amount."}]
        text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        prompts.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    backend.generate(prompts[:2], params)  # warm-up
    start = time.perf_counter()
    gens = backend.generate(prompts, params)
    seconds = time.perf_counter() - start
    tokens = sum(len(g.token_ids) for g in gens)
    print(f"generation        {tokens} tokens in {seconds:.2f} s = {tokens / seconds:.0f} tok/s "
          f"({args.prompts} prompts, {len({tuple(g.token_ids) for g in gens})} distinct)")

    dtype = getattr(torch, args.dtype)
    model, _ = load_model(backend.llm.llm_engine.model_config.model, dtype=dtype)
    model = model.cuda().eval()
    with torch.no_grad():
        diffs = []
        for p, g in zip(prompts[:8], gens[:8]):
            ids = torch.tensor([p + g.token_ids], device="cuda")
            logp = torch.log_softmax(model(input_ids=ids).logits[0, len(p) - 1 : -1].float(), dim=-1)
            ref = logp.gather(-1, torch.tensor(g.token_ids, device="cuda")[:, None]).squeeze(-1)
            diffs.append((ref - torch.tensor(g.logprobs, device="cuda")).abs().mean().item())
    print(f"logprob mismatch  mean |vllm - hf| = {sum(diffs) / len(diffs):.4f} nats/token (bf16 kernels differ)")

    greedy = SamplingParams(max_new_tokens=32, temperature=0.0)
    before = backend.generate(prompts[:4], greedy)
    torch.cuda.synchronize()
    start = time.perf_counter()
    sent = backend.sync_weights(model)
    torch.cuda.synchronize()
    print(f"weight sync       {sent} tensors in {time.perf_counter() - start:.2f} s")
    after = backend.generate(prompts[:4], greedy)
    same = sum(a.token_ids == b.token_ids for a, b in zip(before, after))
    print(f"after sync        {same}/4 greedy continuations unchanged (identical weights)")


if __name__ == "__main__":
    main()
