"""gpt2-serve on 127.0.0.1 (a free port) with a tiny random GPT-2 (drives build/bin).

Serve: greedy completions through raw HTTP and the `openai` client equal gpt2-generate's ids for the
same prompts, alone and from 32 concurrent streaming clients (8 batch slots, so batches run full);
the SSE framing byte for byte; bad requests (each its 4xx, or the connection dropped) while the
server keeps serving; a client leaving mid-stream frees its slot; /metrics, /v1/models, /health.
Guarded: an API key, a full queue (503), SIGTERM finishing the requests in flight and exiting 0.
Load (label slow): 2000 requests from 64 clients, every one answered.
ServeInt8: --quant int8 serves gpt2-generate --quant int8's greedy ids.
Run one class: test_serve.py Serve | ServeInt8 | Guarded | Load.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_generate import random_hf_model, generate, ids_of  # noqa: E402

BIN_DIR = os.environ.get("GPT2_BIN_DIR", "build/bin")
SERVE = os.path.join(BIN_DIR, "gpt2-serve")
SRC = os.environ.get("GPT2_SOURCE_DIR", ".")
CONTEXT = 128


class ServerProcess:
    """gpt2-serve MODEL --port 0 ARGS..., its port read from the log line it prints when it serves."""

    def __init__(self, model_dir, *args, env=None):
        self.log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen([SERVE, model_dir, "--port", "0", *args], stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=SRC, env={**os.environ, **(env or {})})
        deadline = time.time() + 60
        while time.time() < deadline:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.output())
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"gpt2-serve exited {self.proc.returncode}:\n{self.output()}")
            time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError("gpt2-serve did not start:\n" + self.output())

    def output(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self.log.close()
            os.unlink(self.log.name)

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, headers, body bytes) on a fresh connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = json.dumps(body) if isinstance(body, (dict, list)) else body
            conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def complete(self, body, **kw):
        status, _, data = self.request("POST", "/v1/completions", body, **kw)
        return status, json.loads(data)

    def metrics(self):
        status, _, data = self.request("GET", "/metrics")
        assert status == 200
        values = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values


def openai_client(port, key="unused"):
    import openai
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=120)


def greedy_ids(model_dir, prompts, n):
    """gpt2-generate's greedy ids for each prompt (one batch, as the tool runs several prompts)."""
    args = ["--ids", "--temperature", "0", "--max_new_tokens", str(n), "--ignore_eot", "--device", "cpu", "--dtype", "fp32"]
    for p in prompts:
        args += ["--prompt", " ".join(map(str, p))]
    rc, out, err = generate(model_dir, *args)
    assert rc == 0, err
    return [ids[len(p):] for p, ids in zip(prompts, ids_of(out))]


def raw_exchange(port, data, timeout=10):
    """Sends raw bytes, returns everything the server sends until it closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except socket.timeout:
            pass
        return out


def read_http_response(sock):
    """(status line, headers dict, raw body bytes as sent: chunked framing kept) of one response."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError(buf)
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        while not rest.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                raise EOFError(rest)
            rest += chunk
    else:
        n = int(headers.get("content-length", 0))
        while len(rest) < n:
            rest += sock.recv(65536)
    return lines[0], headers, rest


class ServerTest(unittest.TestCase):
    server_args = ()
    server_env = None
    sizes = dict(n_positions=CONTEXT)

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(SERVE):
            raise unittest.SkipTest(f"{SERVE} not built")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = os.path.join(cls.tmp.name, "tiny")
        random_hf_model(**cls.sizes).save_pretrained(cls.dir)
        cls.server = ServerProcess(cls.dir, *cls.server_args, env=cls.server_env)

    @classmethod
    def tearDownClass(cls):
        rc = cls.server.stop()
        cls.tmp.cleanup()
        assert rc == 0, f"gpt2-serve exited {rc}"


PROMPTS = [[464], [464, 2068, 7586, 21831], [15496, 11, 616, 1438, 318, 1757, 290, 314, 588], [40, 716, 257]]


class ServeInt8(ServerTest):
    """gpt2-serve --quant int8: each prompt alone (batch 1, so the decode steps take the int8 kernel)
    gives gpt2-generate --quant int8's greedy ids for that prompt alone; test_int8.py holds those to
    transformers with the dequantized weights."""
    server_args = ("--quant", "int8", "--quant_group", "32")

    def test_greedy_equals_gpt2_generate_int8(self):
        self.assertIn("with int8 weights (a scale per 32 columns)", self.server.output())
        n = 16
        for p in PROMPTS:
            rc, out, err = generate(self.dir, "--quant", "int8", "--quant_group", "32", "--ids", "--temperature", "0",
                                    "--max_new_tokens", str(n), "--ignore_eot", "--device", "cpu", "--dtype", "fp32",
                                    "--prompt", " ".join(map(str, p)))
            self.assertEqual(rc, 0, err)
            want = ids_of(out)[0][len(p):]
            status, body = self.server.complete({"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                                                 "return_token_ids": True})
            self.assertEqual(status, 200, body)
            self.assertEqual(body["choices"][0]["token_ids"], want, f"prompt {p}")


class Serve(ServerTest):
    server_args = ("--max_batch", "8", "--max_queue", "64", "--read_timeout_s", "2", "--write_timeout_s", "5",
                   "--max_body_bytes", "65536")

    def test_greedy_alone_equals_gpt2_generate(self):
        n = 24
        expected = greedy_ids(self.dir, PROMPTS, n)
        for p, want in zip(PROMPTS, expected):
            status, body = self.server.complete({"model": "tiny", "prompt": p, "max_tokens": n, "temperature": 0,
                                                 "ignore_eos": True, "return_token_ids": True})
            self.assertEqual(status, 200, body)
            choice = body["choices"][0]
            self.assertEqual(choice["token_ids"], want, f"prompt {p}")
            self.assertEqual(choice["prompt_token_ids"], p)
            self.assertEqual(choice["finish_reason"], "length")
            self.assertEqual(body["usage"], {"prompt_tokens": len(p), "completion_tokens": n, "total_tokens": len(p) + n})
        # Several prompts in one request: one choice each, in order.
        status, body = self.server.complete({"prompt": PROMPTS, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                                             "return_token_ids": True})
        self.assertEqual(status, 200, body)
        self.assertEqual([c["index"] for c in body["choices"]], list(range(len(PROMPTS))))
        self.assertEqual([c["token_ids"] for c in body["choices"]], expected)

    def test_end_of_text_in_a_prompt_string_is_text(self):
        # As the README says: the string's characters, as tiktoken encodes them with the special
        # token allowed only as text; the special token itself is sent as an id.
        from test_tokenizer_tiktoken import load_local_tiktoken  # tiktoken on the repo's vocabulary files
        want = load_local_tiktoken().encode("A<|endoftext|>B", disallowed_special=())
        status, body = self.server.complete({"prompt": "A<|endoftext|>B", "max_tokens": 1, "return_token_ids": True})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["choices"][0]["prompt_token_ids"], want)
        self.assertNotIn(50256, want)
        status, body = self.server.complete({"prompt": [32, 50256, 33], "max_tokens": 1, "return_token_ids": True})
        self.assertEqual((status, body["choices"][0]["prompt_token_ids"]), (200, [32, 50256, 33]))

    def test_openai_client_text_equals_gpt2_generate(self):
        prompt, n = "The quick brown fox", 16
        rc, text, err = generate(self.dir, "--prompt", prompt, "--temperature", "0", "--max_new_tokens", str(n),
                                 "--ignore_eot", "--device", "cpu", "--dtype", "fp32")
        self.assertEqual(rc, 0, err)
        client = openai_client(self.server.port)
        self.assertEqual([m.id for m in client.models.list().data], ["tiny"])
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0,
                                      extra_body={"ignore_eos": True})
        self.assertEqual(prompt + r.choices[0].text + "\n", text)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, n)
        # Streaming through the client: the same text in pieces.
        pieces = [c.choices[0].text for c in client.completions.create(
            model="tiny", prompt=prompt, max_tokens=n, temperature=0, stream=True, extra_body={"ignore_eos": True})
            if c.choices]
        self.assertEqual(prompt + "".join(pieces) + "\n", text)

    def test_32_concurrent_streaming_clients_equal_gpt2_generate(self):
        n = 16
        prompts = [[(1000 + 37 * i + 11 * k) % 50000 for k in range(1 + i % 7)] for i in range(32)]
        expected = greedy_ids(self.dir, prompts, n)
        steps_before = self.server.metrics().get("gpt2_serve_decode_steps_total", 0)

        def one(i):
            client = openai_client(self.server.port)
            ids, text, reasons = [], "", []
            for c in client.completions.create(model="tiny", prompt=prompts[i], max_tokens=n, temperature=0, stream=True,
                                               extra_body={"ignore_eos": True, "return_token_ids": True}):
                ids += c.choices[0].model_extra["token_ids"]
                text += c.choices[0].text
                reasons.append(c.choices[0].finish_reason)
            return ids, text, reasons

        with ThreadPoolExecutor(32) as pool:
            results = list(pool.map(one, range(32)))
        for i, (ids, text, reasons) in enumerate(results):
            self.assertEqual(ids, expected[i], f"client {i}, prompt {prompts[i]}")
            self.assertEqual(reasons[-1], "length")
            self.assertTrue(all(r is None for r in reasons[:-1]))
        m = self.server.metrics()
        # 32 sequences of 16 tokens through 8 slots take at least 32 * 15 / 8 steps: batches ran full.
        self.assertGreaterEqual(m["gpt2_serve_decode_steps_total"] - steps_before, 32 * (n - 1) / 8)
        # The occupancy histogram: a request alone runs its steps at 1/8 (the 32 above may all have
        # run in full batches: arriving together, admitted 8 at a time, they finish together).
        partial = 'gpt2_serve_batch_occupancy_bucket{le="0.875"}'
        r = openai_client(self.server.port).completions.create(model="tiny", prompt=prompts[0], max_tokens=4,
                                                               temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].finish_reason, "length")
        after = self.server.metrics()
        self.assertGreaterEqual(after[partial] - m.get(partial, 0), 3)  # 4 tokens: a prefill and 3 steps
        self.assertLess(after[partial], after['gpt2_serve_batch_occupancy_bucket{le="+Inf"}'])

    def test_sse_framing_byte_for_byte(self):
        body = json.dumps({"prompt": PROMPTS[1], "max_tokens": 6, "temperature": 0, "stream": True, "ignore_eos": True,
                           "return_token_ids": True, "stream_options": {"include_usage": True}})
        req = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=30) as s:
            s.sendall(req)
            status, headers, raw = read_http_response(s)
            self.assertEqual(status, "HTTP/1.1 200 OK")
            self.assertEqual(headers["content-type"], "text/event-stream")
            self.assertEqual(headers["transfer-encoding"], "chunked")
            self.assertNotIn("content-length", headers)
            # Every HTTP chunk is exactly one event: `data: <compact JSON>\n\n`, then [DONE], then the end.
            events, pos = [], 0
            while True:
                m = re.compile(rb"([0-9a-f]+)\r\n").match(raw, pos)
                self.assertIsNotNone(m, raw[pos:pos + 80])
                size = int(m.group(1), 16)
                payload = raw[m.end():m.end() + size]
                self.assertEqual(raw[m.end() + size:m.end() + size + 2], b"\r\n")
                pos = m.end() + size + 2
                if size == 0:
                    break
                self.assertTrue(payload.startswith(b"data: ") and payload.endswith(b"\n\n"), payload)
                self.assertNotIn(b"\n", payload[:-2])
                events.append(payload[len(b"data: "):-2])
            self.assertEqual(pos, len(raw))
            self.assertEqual(events[-1], b"[DONE]")
            objs = [json.loads(e) for e in events[:-1]]
            for e, o in zip(events[:-1], objs):  # compact, keys sorted: what the server writes, exactly
                self.assertEqual(e, json.dumps(o, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode())
            tokens = [o for o in objs if o["choices"]]
            self.assertEqual(len(tokens), 6)
            for o in tokens:
                self.assertEqual(set(o), {"id", "object", "created", "model", "choices", "usage"})
                self.assertEqual((o["object"], o["model"], o["usage"]), ("text_completion", "tiny", None))
                self.assertEqual(len(o["choices"]), 1)
                self.assertEqual(len(o["choices"][0]["token_ids"]), 1)
            self.assertEqual([o["choices"][0]["finish_reason"] for o in tokens], [None] * 5 + ["length"])
            self.assertEqual(len({o["id"] for o in objs}), 1)
            self.assertEqual(objs[-1]["choices"], [])
            self.assertEqual(objs[-1]["usage"], {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10})
            # The connection stays open for the next request (keep-alive after a stream). Asked at
            # once: the server drops a connection idle for --read_timeout_s (2 s), and running
            # gpt2-generate below can take that long on a loaded machine.
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, raw = read_http_response(s)
            self.assertEqual((status, raw), ("HTTP/1.1 200 OK", b'{"status":"ok"}\n'))
        ids = [t for o in tokens for t in o["choices"][0]["token_ids"]]
        self.assertEqual(ids, greedy_ids(self.dir, [PROMPTS[1]], 6)[0])

    def test_expect_100_continue(self):
        body = json.dumps({"prompt": [464], "max_tokens": 2, "temperature": 0}).encode()
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body))
            self.assertEqual(s.recv(100), b"HTTP/1.1 100 Continue\r\n\r\n")  # before we send the body
            s.sendall(body)
            status, _, raw = read_http_response(s)
            self.assertEqual(status, "HTTP/1.1 200 OK")
            self.assertEqual(json.loads(raw)["usage"]["completion_tokens"], 2)

    def test_stop_strings_and_end_of_text(self):
        n = 24
        status, full = self.server.complete({"prompt": "The quick brown fox", "max_tokens": n, "temperature": 0,
                                             "ignore_eos": True, "return_token_ids": True})
        self.assertEqual(status, 200)
        text = full["choices"][0]["text"]
        stop = text[5:9]  # inside the text: the answer must end just before its first occurrence
        status, cut = self.server.complete({"prompt": "The quick brown fox", "max_tokens": n, "temperature": 0,
                                            "ignore_eos": True, "stop": [stop, "never-seen-stop"]})
        self.assertEqual(status, 200, cut)
        self.assertEqual(cut["choices"][0]["text"], text[:text.index(stop)])
        self.assertEqual(cut["choices"][0]["finish_reason"], "stop")
        # Streamed, the pieces add up to the same text: nothing past the stop string leaks out.
        pieces = [c.choices[0].text for c in openai_client(self.server.port).completions.create(
            model="tiny", prompt="The quick brown fox", max_tokens=n, temperature=0, stream=True, stop=stop,
            extra_body={"ignore_eos": True}) if c.choices]
        self.assertEqual("".join(pieces), text[:text.index(stop)])

    def test_sampling_depends_on_the_seed(self):
        body = {"prompt": [464, 2068], "max_tokens": 12, "temperature": 1.0, "top_k": 50, "top_p": 0.95,
                "ignore_eos": True, "return_token_ids": True}
        a = self.server.complete({**body, "seed": 1})[1]["choices"][0]["token_ids"]
        b = self.server.complete({**body, "seed": 1})[1]["choices"][0]["token_ids"]
        c = self.server.complete({**body, "seed": 2})[1]["choices"][0]["token_ids"]
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)
        # gpt2-generate seeds its one prompt's generator the same way: the same ids.
        rc, out, err = generate(self.dir, "--ids", "--prompt", "464 2068", "--max_new_tokens", "12", "--temperature", "1.0",
                                "--top_k", "50", "--top_p", "0.95", "--seed", "1", "--ignore_eot", "--device", "cpu",
                                "--dtype", "fp32")
        self.assertEqual(rc, 0, err)
        self.assertEqual(ids_of(out)[0][2:], a)

    def test_bad_requests_get_4xx_and_the_server_goes_on(self):
        ok = {"prompt": [464], "max_tokens": 4, "temperature": 0}
        long_prompt = [464] * CONTEXT
        cases = [  # (body, status, the field the error must name; None = the body as a whole)
            ("{not json", 400, None),
            ("[1, 2]", 400, None),
            ({"max_tokens": 4}, 400, "prompt"),
            ({"prompt": 5}, 400, "prompt"),
            ({"prompt": ""}, 400, "prompt"),
            ({"prompt": []}, 400, "prompt"),
            ({"prompt": [464, 50257]}, 400, "prompt"),
            ({"prompt": ["fine", 7]}, 400, "prompt"),
            ({**ok, "max_tokens": -1}, 400, "max_tokens"),
            ({**ok, "max_tokens": 0}, 400, "max_tokens"),
            ({**ok, "max_tokens": "ten"}, 400, "max_tokens"),
            ({**ok, "max_tokens": 10**12}, 400, "max_tokens"),
            ({**ok, "max_tokens": 1.5}, 400, "max_tokens"),
            ({**ok, "top_p": 0}, 400, "top_p"),
            ({**ok, "temperature": -1}, 400, "temperature"),
            ({**ok, "temperature": "hot"}, 400, "temperature"),
            ({**ok, "top_k": -2}, 400, "top_k"),
            ({**ok, "stream": "yes"}, 400, "stream"),
            ({**ok, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
            ({**ok, "stop": [""]}, 400, "stop"),
            ({**ok, "seed": "x"}, 400, "seed"),
            ({**ok, "n": 2}, 400, "n"),
            ({**ok, "logprobs": 3}, 400, "logprobs"),
            ({**ok, "stream_options": {"include_usage": True}}, 400, "stream_options"),
            ({"prompt": long_prompt, "max_tokens": 1}, 400, "prompt"),
            ({"prompt": long_prompt[:100], "max_tokens": 29}, 400, "max_tokens"),
            ({**ok, "model": "gpt-4"}, 404, "model"),
        ]
        for body, status, param in cases:
            got, _, data = self.server.request("POST", "/v1/completions", body)
            self.assertEqual(got, status, f"{body!r}: {data!r}")
            err = json.loads(data)["error"]
            self.assertEqual(err["param"], param, f"{body!r}: {err}")
            if param:
                self.assertIn(param, err["message"], body)
        self.assertEqual(self.server.request("GET", "/nowhere")[0], 404)
        self.assertEqual(self.server.request("GET", "/v1/completions")[0], 405)
        self.assertEqual(self.server.request("POST", "/health", "{}")[0], 405)
        # A malformed request line: 400, then the connection ends.
        self.assertTrue(raw_exchange(self.server.port, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400"))
        # 20 KiB of headers: 431.
        big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
        self.assertTrue(raw_exchange(self.server.port, big).startswith(b"HTTP/1.1 431"))
        # A 10 MB body (the limit here is 64 KiB): 413, or the connection dropped.
        try:
            status = self.server.request("POST", "/v1/completions", "x" * (10 << 20))[0]
        except (ConnectionError, http.client.HTTPException):
            status = "dropped"
        self.assertIn(status, (413, "dropped"))
        # A client that sends half its headers and stalls is dropped after --read_timeout_s (2 s).
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=10) as s:
            t0 = time.time()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-")
            self.assertEqual(s.recv(100), b"")
            self.assertLess(time.time() - t0, 6)
        # So is one that promises a body and sends half of it.
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
            self.assertEqual(s.recv(100), b"")
        # Through all of it the server kept serving.
        status, body = self.server.complete({**ok, "return_token_ids": True})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["choices"][0]["token_ids"], greedy_ids(self.dir, [[464]], 4)[0])
        m = self.server.metrics()
        self.assertGreaterEqual(m['gpt2_serve_http_responses_total{code="400"}'], 25)

    def test_bad_command_lines_exit_2_naming_the_option(self):
        def serve(*args):
            p = subprocess.run([SERVE, *args], capture_output=True, text=True, cwd=SRC, timeout=120)
            return p.returncode, p.stderr
        cases = [([self.dir, "--port", str(self.server.port)], "--port"),  # taken by the running server
                 ([self.dir, "--port", "0", "--host", "localhost:1"], "--host"),
                 ([self.dir, "--port", "70000"], "--port"),
                 ([self.dir, "--port", "0", "--max_batch", "0"], "--max_batch"),
                 ([self.dir, "--port", "0", "--cuda_graphs", "maybe"], "('maybe') for option '--cuda_graphs'"),
                 ([os.path.join(self.tmp.name, "missing")], "missing"),
                 ([], "no MODEL")]
        for args, needle in cases:
            rc, err = serve(*args)
            self.assertEqual(rc, 2, f"{args}: {err}")
            self.assertIn(needle, err, args)

    def test_startup_line_states_what_runs(self):
        # On a CPU the CUDA graphs and the fused decode step are off, and the settings line says so
        # after the note that the option was ignored (it said "cuda_graphs true").
        log = self.server.output()
        if "cpu" in re.search(r"gpt2-serve: .* as '.*", log)[0]:
            self.assertIn("--cuda_graphs ignored", log)
            self.assertIn(", cuda_graphs off,", log)
            self.assertIn(", fused decode step off (on CUDA with --max_batch 8 or less),", log)
        self.assertNotIn("cuda_graphs true", log)

    def test_health_models_metrics(self):
        status, headers, data = self.server.request("GET", "/health")
        self.assertEqual((status, json.loads(data)), (200, {"status": "ok"}))
        status, _, data = self.server.request("GET", "/v1/models")
        models = json.loads(data)
        self.assertEqual(models["data"][0]["id"], "tiny")
        self.assertEqual(models["data"][0]["max_model_len"], CONTEXT)
        self.server.complete({"prompt": [464], "max_tokens": 3})
        status, headers, data = self.server.request("GET", "/metrics")
        self.assertEqual(status, 200)
        self.assertTrue(headers["Content-Type"].startswith("text/plain; version=0.0.4"))
        text = data.decode()
        for name in ("gpt2_serve_http_responses_total", "gpt2_serve_generation_tokens_total", "gpt2_serve_queue_depth",
                     "gpt2_serve_batch_occupancy", "gpt2_serve_time_to_first_token_seconds",
                     "gpt2_serve_request_duration_seconds", "gpt2_serve_decode_step_seconds"):
            self.assertIn(f"# TYPE {name} ", text)
        for line in text.splitlines():  # the exposition format: comments, or `name{labels} value`
            self.assertRegex(line, r'^(# (HELP|TYPE) \w+ .+|\w+(\{\w+="[^"]*"\})? -?[0-9.e+]+)$')
        m = self.server.metrics()
        self.assertGreaterEqual(m["gpt2_serve_generation_tokens_total"], 3)
        self.assertEqual(m["gpt2_serve_max_batch"], 8)
        self.assertEqual(m['gpt2_serve_time_to_first_token_seconds_bucket{le="+Inf"}'],
                         m["gpt2_serve_time_to_first_token_seconds_count"])


class Guarded(ServerTest):
    """An API key from the environment, one slot and a queue of one; a model with a context of 1024,
    so that a long request runs for seconds (the time to queue another, or to leave mid-stream)."""
    server_args = ("--max_batch", "1", "--max_queue", "1", "--shutdown_timeout_s", "60", "--max_connections", "6")
    server_env = {"GPT2_SERVE_API_KEY": "sekrit"}
    sizes = dict(n_positions=1024, n_layer=4, n_embd=128)
    auth = {"Authorization": "Bearer sekrit"}

    def test_connections_past_the_limit_get_503(self):
        held = [socket.create_connection(("127.0.0.1", self.server.port), timeout=10) for _ in range(6)]
        try:
            # The server accepts the held ones in the background (metrics would need a 7th): on a
            # busy machine a probe may come before it has; then it is served (401: no key) and
            # closed, and the next probe is tried, until the limit refuses one.
            deadline = time.time() + 10
            while True:
                got = raw_exchange(self.server.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                if got == b"" or got.startswith(b"HTTP/1.1 503") or time.time() > deadline:
                    break
                time.sleep(0.1)
            self.assertTrue(got == b"" or got.startswith(b"HTTP/1.1 503"), got)
        finally:
            for s in held:
                s.close()
        deadline = time.time() + 10  # the held ones close; new connections are served again
        while time.time() < deadline:
            try:
                if self.server.request("GET", "/health", headers=self.auth)[0] == 200:
                    break
            except (ConnectionError, http.client.HTTPException):
                pass
            time.sleep(0.05)
        self.assertEqual(self.server.request("GET", "/health", headers=self.auth)[0], 200)

    def test_z_api_key_full_queue_and_sigterm_drain(self):  # last: it stops the server
        ok = {"prompt": [464], "max_tokens": 2}
        self.assertEqual(self.server.request("POST", "/v1/completions", ok)[0], 401)
        self.assertEqual(self.server.request("GET", "/health", headers={"Authorization": "Bearer wrong"})[0], 401)
        self.assertEqual(self.server.request("GET", "/metrics", headers={"Authorization": "sekrit"})[0], 401)
        self.assertEqual(self.server.request("GET", "/health", headers={"Authorization": "Bearersekrit"})[0], 401)
        # The scheme is case-insensitive and may be followed by several spaces (RFC 7235 section 2.1).
        for header in ("bearer sekrit", "BEARER sekrit", "Bearer   sekrit"):
            self.assertEqual(self.server.request("GET", "/health", headers={"Authorization": header})[0], 200, header)
        auth = self.auth
        self.assertEqual(self.server.request("POST", "/v1/completions", ok, headers=auth)[0], 200)
        import openai
        with self.assertRaises(openai.AuthenticationError):
            openai_client(self.server.port, "wrong").completions.create(model="tiny", prompt="Hi", max_tokens=2)
        r = openai_client(self.server.port, "sekrit").completions.create(model="tiny", prompt="Hi", max_tokens=2)
        self.assertEqual(r.usage.completion_tokens, 2)

        # One long stream holds the slot, one request waits: a third is refused with 503.
        n = 1023
        long = {"prompt": [464], "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
        streams = []
        def stream_all():
            conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
            conn.request("POST", "/v1/completions", json.dumps(long), headers=auth)
            r = conn.getresponse()
            streams.append((r.status, r.read()))
            conn.close()
        first = threading.Thread(target=stream_all)
        first.start()
        self.wait_for(lambda m: m["gpt2_serve_active_sequences"] == 1)
        second = threading.Thread(target=stream_all)
        second.start()
        self.wait_for(lambda m: m["gpt2_serve_queue_depth"] == 1)
        status, _, data = self.server.request("POST", "/v1/completions", ok, headers=auth)
        self.assertEqual(status, 503, data)
        self.assertIn("queue is full", json.loads(data)["error"]["message"])

        # SIGTERM now: both requests in flight are answered in full, then the server exits 0.
        self.server.proc.send_signal(signal.SIGTERM)
        first.join(120)
        second.join(120)
        self.assertEqual(self.server.proc.wait(timeout=60), 0)
        self.assertEqual(len(streams), 2)
        for status, raw in streams:
            self.assertEqual(status, 200)
            events = raw.decode().split("\n\n")
            self.assertEqual(events[-2:], ["data: [DONE]", ""])
            self.assertEqual(json.loads(events[-3][6:])["choices"][0]["finish_reason"], "length")
            self.assertEqual(len(events) - 2, n)  # one event per token
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", self.server.port), timeout=5)
        self.assertIn("stop signal", self.server.output())

    def metrics(self):
        status, _, data = self.server.request("GET", "/metrics", headers=self.auth)
        self.assertEqual(status, 200)
        return {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in data.decode().splitlines()
                if l and not l.startswith("#")}

    def wait_for(self, cond, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if cond(self.metrics()):
                return
            time.sleep(0.02)
        self.fail("condition not reached")

    def test_client_leaving_mid_stream_frees_its_slot(self):
        before = self.metrics().get("gpt2_serve_cancelled_total", 0)
        for close_how in ("after_first_event", "before_any"):
            body = json.dumps({"prompt": [464], "max_tokens": 1000, "temperature": 0, "stream": close_how != "before_any",
                               "ignore_eos": True})
            s = socket.create_connection(("127.0.0.1", self.server.port), timeout=30)
            s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nAuthorization: Bearer sekrit\r\n\r\n{body}").encode())
            if close_how == "after_first_event":
                self.assertIn(b"data: ", s.recv(4096) + s.recv(4096))
            s.close()
        deadline = time.time() + 20
        while time.time() < deadline:
            m = self.metrics()
            if m["gpt2_serve_active_sequences"] == 0 and m["gpt2_serve_cancelled_total"] >= before + 2:
                break
            time.sleep(0.05)
        self.assertEqual(m["gpt2_serve_active_sequences"], 0)
        self.assertGreaterEqual(m["gpt2_serve_cancelled_total"], before + 2)
        self.assertEqual(self.server.complete({"prompt": [464], "max_tokens": 2}, headers=self.auth)[0], 200)



class Load(ServerTest):
    # The other paths: attention over the longest row rounded up, prompts prefilled together.
    server_args = ("--max_batch", "16", "--max_queue", "128", "--attend_block", "64", "--prefill_batch", "8")

    def test_2000_requests_from_64_clients(self):
        total, clients = 2000, 64
        expected = greedy_ids(self.dir, [[464, 2068]], 4)[0]
        failures, answered = [], [0]
        lock = threading.Lock()

        def client(c):
            conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)  # keep-alive
            for k in range(c, total, clients):
                stream = k % 3 == 0
                body = {"prompt": [464, 2068], "max_tokens": 4, "temperature": 0, "ignore_eos": True,
                        "return_token_ids": True, "stream": stream}
                try:
                    conn.request("POST", "/v1/completions", json.dumps(body), headers={"Content-Type": "application/json"})
                    r = conn.getresponse()
                    data = r.read()
                    if stream:
                        ids = [t for e in data.decode().split("\n\n") if e.startswith("data: {")
                               for t in json.loads(e[6:])["choices"][0]["token_ids"]]
                    else:
                        ids = json.loads(data)["choices"][0]["token_ids"]
                    ok = r.status == 200 and ids == expected
                except Exception as e:  # noqa: BLE001 - every failure is reported below
                    ok, data = False, repr(e).encode()
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
                with lock:
                    answered[0] += 1
                    if not ok:
                        failures.append((k, data[:200]))
            conn.close()

        t0 = time.time()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(client, range(clients)))
        seconds = time.time() - t0
        m = self.server.metrics()
        self.assertLess(m["gpt2_serve_prefills_total"], total, "no prompts were prefilled together")
        print(f"[ measured ] {total} requests from {clients} clients in {seconds:.1f} s "
              f"({total / seconds:.0f} requests/s, {m['gpt2_serve_generation_tokens_total'] / seconds:.0f} tokens/s)")
        self.assertEqual(answered[0], total)
        self.assertEqual(failures, [])
        self.assertEqual(m['gpt2_serve_http_responses_total{code="200"}'], total)


if __name__ == "__main__":
    unittest.main(verbosity=2)
