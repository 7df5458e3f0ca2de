"""HTTP client for a live SGLang endpoint: JSON calls and server-sent-event streams.

Every failure (refused connection, timeout, HTTP error, a stream that is not valid SSE JSON
or ends without [DONE]) raises EndpointError naming the endpoint and the request, so the
smoke and throughput commands print one line instead of a traceback.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import requests


class EndpointError(RuntimeError):
    """A request to the endpoint failed; the message says which request and why."""


class EndpointUnreachable(EndpointError):
    """Nothing answered the request in HTTP: the connection was refused or dropped, or the port speaks something
    else (then the message says so)."""


class EndpointTimeout(EndpointError):
    """The request was sent and nothing came back within the timeout."""


def _unreachable(where: str, exc: Exception) -> EndpointUnreachable:
    if "BadStatusLine" in repr(exc):
        return EndpointUnreachable(f"{where}: the port answered, but not in HTTP (is this the SGLang endpoint?)")
    return EndpointUnreachable(f"{where}: connection refused or dropped ({type(exc).__name__})")


def excerpt(resp: requests.Response, limit: int = 200) -> str:
    """The start of an answer's body on one line, or "(empty body)"; an HTML page is named as one."""
    text = " ".join(resp.text[:limit].split())
    if not text:
        return "(empty body)"
    html = "text/html" in resp.headers.get("Content-Type", "") or text.lower().startswith(("<!doctype", "<html"))
    return f"(an HTML page, not SGLang's JSON) {text}" if html else text


@dataclass
class Endpoint:
    url: str  # e.g. http://127.0.0.1:30000
    api_key: str | None = None
    timeout: float = 120.0

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self.session = requests.Session()
        if self.api_key:
            self.session.headers["Authorization"] = f"Bearer {self.api_key}"

    def _request(self, method: str, path: str, timeout: float | None = None, **kwargs) -> requests.Response:
        where = f"{method} {self.url}{path}"
        timeout = timeout or self.timeout
        try:
            resp = self.session.request(method, self.url + path, timeout=timeout, **kwargs)
        except requests.ConnectionError as exc:
            raise _unreachable(where, exc) from None
        except requests.Timeout:
            raise EndpointTimeout(f"{where}: no answer within {timeout:.0f} s") from None
        if resp.status_code >= 400:
            raise EndpointError(f"{where}: HTTP {resp.status_code} {excerpt(resp)}")
        return resp

    def status(self, path: str, timeout: float | None = None) -> int:
        """HTTP status of GET path (connection problems raise EndpointError)."""
        return self.probe(path, timeout)[0]

    def probe(self, path: str, timeout: float | None = None) -> tuple[int, str]:
        """(HTTP status, an excerpt of the body) of GET path (connection problems raise EndpointError)."""
        where = f"GET {self.url}{path}"
        try:
            resp = self.session.get(self.url + path, timeout=timeout or self.timeout)
        except requests.ConnectionError as exc:
            raise _unreachable(where, exc) from None
        except requests.Timeout:
            raise EndpointTimeout(f"{where}: no answer within {timeout or self.timeout:.0f} s") from None
        return resp.status_code, excerpt(resp)

    def get_json(self, path: str, timeout: float | None = None) -> dict:
        resp = self._request("GET", path, timeout=timeout)
        try:
            return resp.json()
        except ValueError:
            raise EndpointError(f"GET {self.url}{path}: answer is not JSON: {resp.text[:120]!r}") from None

    def post_json(self, path: str, body: dict) -> dict:
        resp = self._request("POST", path, json=body)
        try:
            return resp.json()
        except ValueError:
            raise EndpointError(f"POST {self.url}{path}: answer is not JSON: {resp.text[:120]!r}") from None

    def stream(self, path: str, body: dict, timeout: float | None = None) -> Iterator[tuple[float, dict]]:
        """(arrival time, parsed event) for each `data:` event of an SSE answer, up to [DONE]; `timeout` (default
        the endpoint's) bounds the wait for the answer and for each read after it."""
        where = f"POST {self.url}{path} (stream)"
        resp = self._request("POST", path, timeout=timeout, json=body, stream=True)
        done = False
        try:
            # chunk_size=None: hand over each event as it arrives; the default 512-byte reads
            # would hold early events back and skew TTFT and TPOT.
            for raw in resp.iter_lines(chunk_size=None, decode_unicode=True):
                if not raw or raw.startswith(":"):
                    continue
                if not raw.startswith("data:"):
                    raise EndpointError(f"{where}: not a server-sent event: {raw[:80]!r}")
                data = raw[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    event = json.loads(data)
                except ValueError:
                    raise EndpointError(f"{where}: event is not JSON: {data[:80]!r}") from None
                if "error" in event and not event.get("choices"):
                    raise EndpointError(f"{where}: server error in stream: {str(event['error'])[:160]}")
                yield time.perf_counter(), event
        except requests.RequestException as exc:
            raise EndpointError(f"{where}: stream broke off ({type(exc).__name__})") from None
        finally:
            resp.close()
        if not done:
            raise EndpointError(f"{where}: stream ended without [DONE]")
