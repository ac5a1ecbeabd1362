"""The peers of bench/serve_bench.sh: Hugging Face transformers on the same weights.

  serve    FastAPI + uvicorn + transformers `generate`, one request at a time (a lock around
           generate, as a plain FastAPI deployment does): POST /v1/completions with gpt2-serve's
           request and SSE format for what the load client uses (token-id prompts, max_tokens,
           temperature 0, stream, ignore_eos, return_token_ids), GET /v1/models. Tokens stream as
           generate makes them (a streamer feeding the event loop).
  batched  transformers' batched `generate` without a server: B prompts of P random ids at once,
           N new tokens each; prints one RESULT line (generated tokens/s) per B, appends JSON to --json.

    python3 bench/serve_peer.py serve --model DIR --device cuda --dtype bf16 --port 8001
    python3 bench/serve_peer.py batched --model DIR --device cuda --dtype bf16 --batches 1,8,32,128
"""
import argparse
import asyncio
import json
import random
import sys
import threading
import time

import torch
from transformers import GPT2LMHeadModel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
EOT = 50256


def load(args):
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    model = GPT2LMHeadModel.from_pretrained(args.model).to(device=device, dtype=DTYPES[args.dtype]).eval()
    return model, device


def serve(args):
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse
    from transformers.generation.streamers import BaseStreamer

    model, device = load(args)
    name = args.name
    app = FastAPI()
    lock = threading.Lock()  # one generate at a time

    class QueueStreamer(BaseStreamer):
        """Hands each new token to the event loop; generate's first put() is the prompt."""

        def __init__(self, loop, queue):
            self.loop, self.queue, self.prompt_seen = loop, queue, False

        def put(self, value):
            if not self.prompt_seen:
                self.prompt_seen = True
                return
            self.loop.call_soon_threadsafe(self.queue.put_nowait, value.reshape(-1).tolist())

        def end(self):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, None)

    def run_generate(ids, body, streamer):
        n = int(body.get("max_tokens", 16))
        greedy = float(body.get("temperature", 1.0)) == 0.0
        kw = dict(max_new_tokens=n, do_sample=not greedy, pad_token_id=EOT, streamer=streamer)
        if body.get("ignore_eos"):
            kw.update(eos_token_id=None, min_new_tokens=n)
        if not greedy:
            kw.update(temperature=float(body["temperature"]), top_p=float(body.get("top_p", 1.0)),
                      top_k=int(body.get("top_k", 0)))
        with lock, torch.inference_mode():
            x = torch.tensor([ids], device=device)
            return model.generate(x, attention_mask=torch.ones_like(x), **kw)[0, len(ids):].tolist()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "transformers"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        ids = body["prompt"]
        if not (isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids)):
            return JSONResponse({"error": {"message": "this peer takes token-id prompts", "param": "prompt"}}, 400)
        created, cid = int(time.time()), f"cmpl-peer-{time.monotonic_ns()}"
        loop = asyncio.get_running_loop()
        if not body.get("stream"):
            out = await loop.run_in_executor(None, run_generate, ids, body, None)
            choice = {"index": 0, "text": "", "finish_reason": "length", "logprobs": None}
            if body.get("return_token_ids"):
                choice["token_ids"] = out
            return {"id": cid, "object": "text_completion", "created": created, "model": name, "choices": [choice],
                    "usage": {"prompt_tokens": len(ids), "completion_tokens": len(out),
                              "total_tokens": len(ids) + len(out)}}
        queue = asyncio.Queue()
        task = loop.run_in_executor(None, run_generate, ids, body, QueueStreamer(loop, queue))

        async def events():
            while True:
                new = await queue.get()
                if new is None:
                    break
                choice = {"index": 0, "text": "", "finish_reason": None, "logprobs": None, "token_ids": new}
                yield "data: " + json.dumps({"id": cid, "object": "text_completion", "created": created,
                                             "model": name, "choices": [choice]}) + "\n\n"
            await task
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


def batched(args):
    model, device = load(args)
    rng = random.Random(0)
    for b in [int(x) for x in args.batches.split(",") if x]:
        x = torch.tensor([[rng.randrange(0, 50000) for _ in range(args.prompt_tokens)] for _ in range(b)], device=device)
        kw = dict(attention_mask=torch.ones_like(x), do_sample=False, pad_token_id=EOT, eos_token_id=None)
        with torch.inference_mode():
            model.generate(x, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(x, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, **kw)
            if device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
        tokens = b * (out.shape[1] - x.shape[1])
        res = {"label": "transformers-batched", "batch": b, "prompt_tokens": args.prompt_tokens,
               "new_tokens": args.new_tokens, "generated_tokens": tokens, "seconds": seconds,
               "tokens_per_s": tokens / seconds}
        print(f"RESULT transformers-batched batch={b} tokens/s={res['tokens_per_s']:,.0f} "
              f"({tokens} tokens in {seconds:.2f}s; no server, every row starts and ends together)", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(res) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["serve", "batched"])
    ap.add_argument("--model", required=True, help="a Hugging Face GPT-2 directory")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--name", default="peer")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--prompt_tokens", type=int, default=128)
    ap.add_argument("--new_tokens", type=int, default=128)
    ap.add_argument("--json")
    args = ap.parse_args()
    serve(args) if args.mode == "serve" else batched(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
