"""A stand-in for SGLang's HTTP server, for tests only: no GPU server can run in CI.

It speaks the parts of SGLang's API our smoke and throughput clients (and the deploy
playbook) use: /health and /health_generate (503 while "warming up"), /v1/models,
/v1/chat/completions (plain and streamed, with usage and sglext.spec_tokens_details),
the native /generate stream (cumulative text + meta_info), and /server_info
(/get_server_info on older releases) with the average acceptance length.

Tokens come out at `tokens_per_s` per request: the first at `ttft_s`, then one verify
step of `accept_length` tokens every accept_length / tokens_per_s seconds, so the
throughput tests can check the computed TPOT, decode rate and acceptance exactly.
Faults are switched on per test (Behaviour). Run as a program (`main`), it takes SGLang's
launch_server arguments and stands in for the GPU server on the deployment test hosts; there
it reports the SGLang version installed beside it and the patch record, so a test can see
which release answers on the port. test_standin_protocol.py validates its
answers with the `openai` client and SGLang's own protocol models from the release
wheel, so it cannot drift from the real API.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Behaviour:
    model: str = "glm-5"
    version: str = "0.5.23"
    warmup_s: float = 0.0  # /health_generate answers 503 for this long after start
    never_healthy: bool = False
    ttft_s: float = 0.02
    tokens_per_s: float = 400.0
    accept_length: int = 4
    report_spec_details: bool = True  # per-request sglext.spec_tokens_details
    server_info_path: str = "/server_info"  # older releases: /get_server_info
    empty_completion: bool = False
    wrong_usage: bool = False
    stream_fault: str | None = None  # "no_done" | "bad_json"
    # Every request (health included) answered wrong: "http_500" (uvicorn's plain 500), "html" (200 with a web page,
    # as a proxy or another service on the port sends), "hang" (accepted, never answered) or "hang_generate"
    # (only /generate hangs); a hung request is let go when the server stops.
    fault: str | None = None
    default_completion_tokens: int = 12  # without ignore_eos
    api_key: str | None = None  # as SGLang's --api-key: Bearer token on all but /health*, /ready*, /metrics*
    extra_info: dict = field(default_factory=dict)  # more /server_info fields (the service mode's args)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A client that closes a kept-alive connection with the stream's last chunk unread (the streaming clients stop
        at [DONE]) resets it; that is not the stand-in's fault, and its traceback would bury the test's output."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            super().handle_error(request, client_address)


class StandInServer:
    """Run with `with StandInServer(Behaviour(...)) as url:` on 127.0.0.1, an ephemeral port."""

    def __init__(self, behaviour: Behaviour | None = None, port: int = 0, host: str = "127.0.0.1"):
        self.behaviour = behaviour or Behaviour()
        self.started = time.monotonic()
        server = self

        class Handler(_Handler):
            stand_in = server

        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, in the order they came
        self.request_came = threading.Event()  # set by each request
        self.released = threading.Event()  # lets hung requests go (set on stop)
        self.httpd = _Server((host, port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.started = time.monotonic()
        self.thread.start()
        return self.url

    def __exit__(self, *exc) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _words(n: int) -> list[str]:
    return [f"w{i} " for i in range(n)]


class _Handler(BaseHTTPRequestHandler):
    stand_in: StandInServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    @property
    def b(self) -> Behaviour:
        return self.stand_in.behaviour

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _empty(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _sse_start(self) -> None:
        # Chunked, one event a chunk, as uvicorn sends SGLang's StreamingResponse.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _event(self, payload: dict | str) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        data = f"data: {text}\n\n".encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _sse_end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _faulted(self, method: str) -> bool:
        """Record the request; answer it as the switched-on fault says (True), or leave it to the route (False)."""
        self.stand_in.requests.append((method, self.path))
        self.stand_in.request_came.set()
        fault = self.b.fault
        if fault == "hang" or (fault == "hang_generate" and self.path == "/generate"):
            self.stand_in.released.wait()
            self.close_connection = True
            return True
        if fault == "http_500":
            data = b"Internal Server Error"
            self.send_response(500)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
        elif fault == "html":
            data = b"<!DOCTYPE html><html><head><title>Welcome to nginx!</title></head><body>It works</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
        else:
            return False
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        return True

    def _refused(self) -> bool:
        """SGLang's api-key rule (srt/utils/auth.py): 401 unless the Bearer token matches."""
        key = self.b.api_key
        if not key or self.path.startswith(("/health", "/ready", "/metrics")):
            return False
        if self.headers.get("Authorization") == f"Bearer {key}":
            return False
        self._json(401, {"error": "Unauthorized"})
        return True

    # -- GET ---------------------------------------------------------------------------------
    def do_GET(self) -> None:
        b = self.b
        if self._faulted("GET") or self._refused():
            return
        if self.path in ("/health", "/health_generate"):
            warming = time.monotonic() - self.stand_in.started < b.warmup_s
            return self._empty(503 if (b.never_healthy or warming) else 200)  # SGLang: no body either way
        if self.path == "/v1/models":
            return self._json(200, {"object": "list", "data": [
                {"id": b.model, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                 "root": b.model, "parent": None, "max_model_len": 202752}]})
        if self.path == b.server_info_path:
            state = {"avg_spec_accept_length": float(b.accept_length), "last_gen_throughput": b.tokens_per_s,
                     "memory_usage": {"weight": 1.0, "kvcache": 1.0, "token_capacity": 1 << 20, "graph": 0.1}}
            return self._json(200, {"version": b.version, "model_path": f"/models/{b.model}",
                                    "served_model_name": b.model, "speculative_algorithm": "DDTREE",
                                    "speculative_ddtree_budget": 8, "page_size": 1, "attention_backend": "triton",
                                    "kv_cache_dtype": "bfloat16", "internal_states": [state], **b.extra_info})
        self._json(404, {"error": {"message": f"no route {self.path}"}})

    # -- POST --------------------------------------------------------------------------------
    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self._faulted("POST") or self._refused():
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self._json(400, {"error": {"message": "body is not JSON"}})
        if self.path == "/v1/chat/completions":
            return self._chat(body)
        if self.path == "/generate":
            return self._generate(body)
        self._json(404, {"error": {"message": f"no route {self.path}"}})

    def _schedule(self, n: int) -> list[int]:
        """Token counts per emission: 1 (prefill), then verify steps of accept_length."""
        if n <= 0:
            return []
        steps = [1]
        rest = n - 1
        while rest > 0:
            steps.append(min(self.b.accept_length, rest))
            rest -= steps[-1]
        return steps

    def _emit(self, n: int):
        """Yield token-count groups at the configured pace.

        Each group has a deadline counted from the request's start, so time spent writing
        chunks (or a late wake-up on a busy machine) is caught up on the next sleep instead
        of adding to every later step: the rates the tests check stay exact on average.
        """
        due = time.monotonic() + self.b.ttft_s
        for i, group in enumerate(self._schedule(n)):
            if i:
                due += group / self.b.tokens_per_s
            time.sleep(max(0.0, due - time.monotonic()))
            yield group

    def _spec_details(self, n: int) -> dict:
        verify = max(1, math.ceil((n - 1) / self.b.accept_length))
        proposed = verify * (self.b.accept_length - 1)
        return {"spec_accept_rate": 0.9, "spec_accept_length": n / verify, "spec_verify_ct": verify,
                "spec_num_correct_drafts": n - verify, "spec_num_proposed_drafts": proposed,
                "spec_accepted_drafts": n - verify, "spec_proposed_drafts": proposed,
                "spec_correct_drafts_histogram": [verify], "spec_accept_histogram": [verify]}

    def _chat(self, body: dict) -> None:
        b = self.b
        max_tokens = int(body.get("max_tokens") or 16)
        n = max_tokens if body.get("ignore_eos") else min(max_tokens, b.default_completion_tokens)
        if b.empty_completion:
            n = 0
        prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", [])) + 8
        total = prompt + n + (1 if b.wrong_usage else 0)
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": total,
                 "prompt_tokens_details": None, "reasoning_tokens": 0}
        rid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        created = int(time.time())
        finish = "length" if n == max_tokens else "stop"
        sglext = {"spec_tokens_details": self._spec_details(n)} if (
            b.report_spec_details and body.get("return_spec_tokens_details") and n) else None
        if not body.get("stream"):
            text = "".join(_words(sum(self._emit(n))))
            message = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
            answer = {"id": rid, "object": "chat.completion", "created": created, "model": b.model,
                      "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                                   "matched_stop": None}], "usage": usage, "metadata": {"weight_version": "default"}}
            if sglext:
                answer["sglext"] = sglext
            return self._json(200, answer)
        self._sse_start()

        def chunk(delta: dict, finish_reason: str | None = None) -> dict:
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": b.model,
                    "choices": [{"index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
                                 "finish_reason": finish_reason, "matched_stop": None}]}

        self._event(chunk({"role": "assistant", "content": ""}))  # SGLang opens with the role alone
        sent = 0
        for i, group in enumerate(self._emit(n)):
            if b.stream_fault == "bad_json" and i == 2:
                self._event("{this is not json")
            self._event(chunk({"content": "".join(_words(sent + group)[sent:])}))
            sent += group
        self._event(chunk({}, finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({"id": rid, "object": "chat.completion.chunk", "created": created, "model": b.model,
                         "choices": [], "usage": usage})
        if b.stream_fault != "no_done":
            self._event("[DONE]")
        self._sse_end()

    def _generate(self, body: dict) -> None:
        b = self.b
        params = body.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens") or 16)
        n = max_new if params.get("ignore_eos") else min(max_new, b.default_completion_tokens)
        prompt = len(body.get("input_ids") or []) or len(str(body.get("text", "")).split())
        rid = uuid.uuid4().hex
        base = {"id": rid, "prompt_tokens": prompt, "weight_version": "default", "num_retractions": 0,
                "reasoning_tokens": 0, "cached_tokens": 0, "cached_tokens_details": None, "dp_rank": None}
        ids = [100 + i for i in range(n)]
        if not body.get("stream"):
            text = "".join(_words(sum(self._emit(n))))
            return self._json(200, {"text": text, "output_ids": ids, "meta_info": base | {
                "completion_tokens": n, "finish_reason": {"type": "length", "length": n}, **self._spec_details(n)}})
        self._sse_start()
        sent, verify, t0 = 0, 0, time.time()
        for i, group in enumerate(self._emit(n)):
            if b.stream_fault == "bad_json" and i == 2:
                self._event("{this is not json")
            sent += group
            verify += 1 if i else 0
            meta = base | {"completion_tokens": sent, "spec_verify_ct": verify,
                           "finish_reason": {"type": "length", "length": n} if sent == n else None}
            if i == 0:
                meta["response_sent_to_client_ts"] = time.time()
            if sent == n:  # SGLang closes a request with its speculative statistics
                meta |= {"e2e_latency": time.time() - t0, **self._spec_details(n)}
            self._event({"text": "".join(_words(sent)), "output_ids": ids[:sent], "meta_info": meta})
        if b.stream_fault != "no_done":
            self._event("[DONE]")
        self._sse_end()


# -- service mode: the deployment test hosts run this in place of `python -m sglang.launch_server` --

def _installed_sglang() -> tuple[str, dict]:
    """Version of the SGLang installed beside us and its patch record (what the deploy applied)."""
    from importlib import metadata

    version = metadata.version("sglang")
    files = metadata.files("sglang") or []
    init = next((f for f in files if str(f).replace("\\", "/") == "sglang/__init__.py"), None)
    record = {}
    if init is not None:
        path = Path(str(init.locate())).parent / ".ddtree-patches.json"
        if path.exists():
            record = json.loads(path.read_text())
    return version, record


def _write_verify_stats(env, model_path: str = "") -> None:
    """Stand in for ddtree_kernels' verify counts (ddtree_kernels/sglang/verify_stats.py, same layout;
    tests/kernels/test_verify_stats.py holds the two together): what the real server's processes
    write once TARGET_VERIFY ran. STANDIN_VERIFY=declined:REASON makes every call a fallback. A checkpoint
    whose config.json sets index_topk (a DSA model, which the launch check let through only with patch 0007)
    is counted as the DSA tree verify counts it."""
    folder = env.get("DDTREE_VERIFY_STATS_DIR")
    if not folder or env.get("DDTREE_VERIFY_KERNEL", "ddtree") != "ddtree":
        return
    mode = env.get("STANDIN_VERIFY", "served")
    reason = mode.split(":", 1)[1] if mode.startswith("declined:") else None
    config = Path(model_path or ".") / "config.json"
    dsa = config.is_file() and "index_topk" in json.loads(config.read_text())
    shape = [8, 576, 512, "bfloat16", "bfloat16", "dsa" if dsa else True]
    data = {"pid": os.getpid(), "served": 0 if reason else 78, "served_dsa": 78 if dsa and not reason else 0,
            "declined": {reason: 78} if reason else {},
            "shapes": [{"outcome": "declined" if reason else "served", "reason": reason, "shape": shape}],
            "updated": time.time()}
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"verify-{os.getpid()}.json").write_text(json.dumps(data))


def main(argv: list[str] | None = None) -> None:
    """Serve like `sglang.launch_server`; faults come from STANDIN_* environment variables."""
    ap = argparse.ArgumentParser(description="stand-in SGLang server (tests only)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--served-model-name")
    ap.add_argument("--api-key")
    args, rest = ap.parse_known_args(argv)
    version, record = _installed_sglang()
    env = os.environ
    behaviour = Behaviour(
        model=args.served_model_name or args.model_path,
        version=version,
        warmup_s=float(env.get("STANDIN_WARMUP_S", "1")),
        never_healthy=env.get("STANDIN_NEVER_HEALTHY") == "1",
        accept_length=int(env.get("STANDIN_ACCEPT_LENGTH", "4")),
        api_key=args.api_key,
        extra_info={"server_args": rest, "ddtree_patches": record,
                    "verify_kernel": env.get("DDTREE_VERIFY_KERNEL", "")},
    )
    _write_verify_stats(env, args.model_path)
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # before the server threads start, so they inherit it
    server = StandInServer(behaviour, port=args.port, host=args.host)
    print(f"stand-in SGLang {version} on {server.url} (args {' '.join(rest)})", flush=True)
    with server:
        signal.sigwait(stop)
    print("stand-in SGLang: stopped on signal", flush=True)


if __name__ == "__main__":
    main()
