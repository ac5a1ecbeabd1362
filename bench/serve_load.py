"""Load client for an OpenAI-compatible completion server (gpt2-serve, bench/serve_peer.py).

C concurrent clients each send R streaming requests, one after another: a prompt of P random token
ids, N new tokens (ignore_eos, so every request generates exactly N). Per request: time to first
token (request sent -> first `data:` event with text or ids) and its end. Prints one RESULT line
per client count and appends a JSON object per count to --json:
  generated tokens/s (all clients' tokens / wall time of the measured round), p50/p99 TTFT in ms,
  mean inter-token latency, requests/s.
Stdlib only (asyncio, raw HTTP/1.1 with chunked decoding), so it runs on any machine's python3.
    python3 bench/serve_load.py --port 8000 --clients 1,8,32,128 --requests 4 --label ours
"""
import argparse
import asyncio
import json
import random
import statistics
import sys
import time


def percentile(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


async def read_chunked_events(reader, on_event):
    """Reads a chunked SSE body, calling on_event(payload bytes) per `data:` event; returns at [DONE]."""
    buf = b""
    while True:
        size_line = await reader.readline()
        size = int(size_line.strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return
        buf += await reader.readexactly(size)
        await reader.readexactly(2)
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if event.startswith(b"data: "):
                on_event(event[6:])


async def read_until_close_events(reader, on_event):
    buf = b""
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if event.startswith(b"data: "):
                on_event(event[6:])


async def one_request(host, port, conn, body):
    """Sends one streaming completion on `conn` (reader, writer; reopened when closed). Returns
    (ttft_s, total_s, tokens, conn)."""
    payload = json.dumps(body).encode()
    if conn is None:
        conn = await asyncio.open_connection(host, port)
    reader, writer = conn
    t0 = time.perf_counter()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % (host.encode(), len(payload)) + payload)
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"HTTP status {status!r}")
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        k, v = line.decode().split(":", 1)
        headers[k.strip().lower()] = v.strip()
    first = [None]
    tokens = [0]

    def on_event(data):
        if data == b"[DONE]":
            return
        obj = json.loads(data)
        for c in obj.get("choices", []):
            n = len(c.get("token_ids", [])) or (1 if c.get("text") else 0)
            if n and first[0] is None:
                first[0] = time.perf_counter()
            tokens[0] += n
    if headers.get("transfer-encoding") == "chunked":
        await read_chunked_events(reader, on_event)
    else:
        await read_until_close_events(reader, on_event)
        writer.close()
        conn = None
    t1 = time.perf_counter()
    return (first[0] or t1) - t0, t1 - t0, tokens[0], conn


async def run_level(args, clients):
    rng = random.Random(clients)
    results = []

    async def client(c):
        conn = None
        for r in range(args.requests + args.warmup):
            prompt = [rng.randrange(0, 50000) for _ in range(args.prompt_tokens)]
            body = {"model": args.model, "prompt": prompt, "max_tokens": args.new_tokens, "temperature": 0,
                    "stream": True, "ignore_eos": True, "return_token_ids": True}
            ttft, total, tokens, conn = await one_request(args.host, args.port, conn, body)
            if r >= args.warmup:
                results.append((ttft, total, tokens, time.perf_counter()))
        if conn is not None:
            conn[1].close()

    t0 = time.perf_counter()
    # Warm-up requests of every client first (not measured), then the measured ones back to back;
    # the wall time counts from when the first client starts its first measured request.
    await asyncio.gather(*(client(c) for c in range(clients)))
    wall = time.perf_counter() - t0
    ttfts = [r[0] * 1000 for r in results]
    tokens = sum(r[2] for r in results)
    # Throughput over the measured requests: from the earliest measured start to the last end.
    starts = [r[3] - r[1] for r in results]
    span = max(r[3] for r in results) - min(starts)
    itl = [1000 * (r[1] - r[0]) / max(1, r[2] - 1) for r in results]
    return {"label": args.label, "clients": clients, "requests": len(results), "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens, "generated_tokens": tokens, "seconds": span, "wall_s": wall,
            "tokens_per_s": tokens / span, "requests_per_s": len(results) / span,
            "ttft_p50_ms": percentile(ttfts, 50), "ttft_p99_ms": percentile(ttfts, 99),
            "itl_mean_ms": statistics.mean(itl) if itl else float("nan")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default=None, help="model name (default: the first of GET /v1/models)")
    ap.add_argument("--clients", default="1,8,32,128")
    ap.add_argument("--requests", type=int, default=4, help="measured requests per client")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured requests per client first")
    ap.add_argument("--prompt_tokens", type=int, default=128)
    ap.add_argument("--new_tokens", type=int, default=128)
    ap.add_argument("--label", default="server")
    ap.add_argument("--json", help="append one JSON object per client count to this file")
    args = ap.parse_args()
    if args.model is None:
        import urllib.request
        with urllib.request.urlopen(f"http://{args.host}:{args.port}/v1/models", timeout=30) as r:
            args.model = json.load(r)["data"][0]["id"]
    for clients in [int(c) for c in args.clients.split(",") if c]:
        res = asyncio.run(run_level(args, clients))
        print(f"RESULT {res['label']} clients={clients} tokens/s={res['tokens_per_s']:,.0f} "
              f"ttft_p50={res['ttft_p50_ms']:.1f}ms ttft_p99={res['ttft_p99_ms']:.1f}ms itl={res['itl_mean_ms']:.2f}ms "
              f"requests={res['requests']} in {res['seconds']:.1f}s", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
