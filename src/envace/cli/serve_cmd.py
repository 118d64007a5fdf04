"""``envace serve``: an OpenAI-compatible server for a local model (judge, user simulator, external
simulator), e.g. ``envace serve --model smollm2 --port 8000``."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (/v1/completions, "
                                     "/v1/chat/completions)")
    p.add_argument("--model", required=True, help="model spec: smollm2, tiny, a local HF or adapter dir, a .gguf")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    p.add_argument("--name", default=None, help="model name the API reports (default: the spec)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    p.add_argument("--max-batch", type=int, default=8, help="rows per forward pass")
    p.add_argument("--api-key-env", default=None, metavar="VAR",
                   help="require 'Authorization: Bearer $VAR' on every request")
    p.add_argument("--allow-weight-updates", action="store_true",
                   help="accept POST /v1/load_weights (a training run with rollout.backend: http pushes its "
                        "updated weights there after every step)")
    p.add_argument("--max-queue", type=int, default=256, metavar="N",
                   help="generation requests that may wait or run at once; past that the answer is 503 with "
                        "Retry-After (default 256)")
    p.add_argument("--quiet", action="store_true", help="no request log (one line per request on stderr)")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    try:
        from envace.policy.http_server import serve
    except ImportError as err:
        raise ValueError(f"envace serve needs starlette and uvicorn ({err}): pip install 'envace[serve]'") from None

    if not args.quiet:  # the request log: method, path, status, milliseconds
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        request_log = logging.getLogger("envace.serve")
        request_log.addHandler(handler)
        request_log.setLevel(logging.INFO)
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise ValueError(f"--api-key-env {args.api_key_env}: that environment variable is not set")
    server = serve(args.model, host=args.host, port=args.port, name=args.name, device=args.device,
                   max_batch=args.max_batch, api_key=api_key, allow_weight_updates=args.allow_weight_updates,
                   max_queue=args.max_queue)
    print(f"serving {args.model!r} as {server.model_name!r} at {server.url} "
          f"(POST /completions, /chat/completions, stream too; GET /models); Ctrl-C stops", flush=True)
    server.serve_forever()
    return 0
