"""HTTP to vLLM's OpenAI-compatible servers, on the standard library: the health check, the adapter calls and
completion requests (streamed), with retries and back-off, balanced over several servers.

What a failure does (rollout.server_timeout_s, rollout.server_retry_s):

- no server answers when the engine starts: `wait_ready` retries for server_retry_s, then `RolloutServerError`
  names the URL, what failed and how to start one (before the first step);
- a request that cannot connect, times out, or gets a 5xx (a server restarting, overloaded) is sent again after
  0.25 s, 0.5 s, 1 s, ... (at most 8 s apart) until server_retry_s have passed since it first failed, then
  `RolloutServerError` stops the run inside the collection, before the update: nothing is half-trained, the last
  checkpoint is whole;
- a 404 naming the adapter (a server that restarted forgot the runtime-loaded adapter versions) re-loads the
  version the request names (`on_missing`), then the request is sent again;
- a 4xx other than that is a bug or a misconfigured server: no retry, the server's message in the error.

The wire format (vLLM 0.32's `/v1/completions`: `prompt` as token ids, `return_tokens_as_token_ids`, `logprobs`)
is read and written in tinyrl/rollout/vllm_server.py; this module moves JSON.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Callable, Iterator
from urllib.parse import urlsplit

from tinyrl.errors import PeerLostError

BACKOFF = (0.25, 8.0)  # first wait, longest wait (doubling)


class RolloutServerError(PeerLostError):
    """A rollout server that cannot be reached, or that answers with an error (names the URL and the fix). The
    server is a process of the run on other devices: losing it is losing a peer (the CLI prints one paragraph)."""


class HTTPError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status, self.body = status, body


class Cancelled(Exception):
    """The caller aborted a request (a paused row)."""


RETRYABLE = (ConnectionError, TimeoutError, socket.timeout, http.client.HTTPException, OSError)


class Server:
    """One server: its base URL, its requests in flight (for balancing)."""

    def __init__(self, url: str, timeout_s: float):
        parts = urlsplit(url)
        self.url, self.timeout_s = url, timeout_s
        self.https, self.host, self.prefix = parts.scheme == "https", parts.hostname, parts.path
        self.port = parts.port or (443 if self.https else 80)
        self.inflight = 0

    def connect(self, timeout: float | None = None) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout or self.timeout_s)

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> str:
        """One request; its body text. HTTPError for a status >= 400; OSError / HTTPException as raised."""
        conn = self.connect(timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, self.prefix + path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            text = resp.read().decode("utf-8", "replace")
            if resp.status >= 400:
                raise HTTPError(resp.status, text)
            return text
        finally:
            conn.close()

    def stream(self, path: str, body: dict, cancel: threading.Event, hold: Callable) -> Iterator[dict]:
        """POST a streamed request; yield each server-sent event's JSON until `[DONE]`. `hold(conn)` receives the
        connection, so an abort can close it (vLLM aborts a request whose client went away)."""
        conn = self.connect()
        hold(conn)
        try:
            conn.request("POST", self.prefix + path, body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
            resp = conn.getresponse()
            if resp.status >= 400:
                raise HTTPError(resp.status, resp.read().decode("utf-8", "replace"))
            while not cancel.is_set():
                line = resp.readline()
                if not line:
                    raise ConnectionError("the server closed the stream before [DONE]")
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                yield json.loads(data)
            raise Cancelled()
        except (OSError, http.client.HTTPException):
            if cancel.is_set():
                raise Cancelled() from None
            raise
        finally:
            conn.close()


class ServerPool:
    """The servers one engine balances its requests over (each to the one with the fewest in flight)."""

    def __init__(self, urls: list[str], timeout_s: float = 600.0, retry_s: float = 120.0):
        if not urls:
            raise RolloutServerError("rollout.server_url: no server to send rollouts to")
        self.servers = [Server(u, timeout_s) for u in urls]
        self.retry_s = retry_s
        self.lock = threading.Lock()
        self.sleep = time.sleep  # (tests shorten the waits)

    def pick(self) -> Server:
        with self.lock:
            s = min(self.servers, key=lambda x: x.inflight)
            s.inflight += 1
            return s

    def done(self, server: Server) -> None:
        with self.lock:
            server.inflight -= 1

    def retrying(self, what: str, server: Server, fn: Callable[[], object],
                 on_missing: Callable[[Server], None] | None = None):
        """`fn()`, sent again with back-off while it fails in a way a restart explains (see the module docstring)."""
        first_fail, wait = None, BACKOFF[0]
        while True:
            try:
                return fn()
            except Cancelled:
                raise
            except HTTPError as e:
                if e.status == 404 and on_missing is not None and "does not exist" in e.body:
                    error = e  # the server forgot the adapter (a restart): load it again, then retry
                    try:
                        on_missing(server)
                    except (HTTPError, *RETRYABLE) as again:
                        error = again
                elif e.status < 500:
                    raise RolloutServerError(f"{what} at {server.url} was refused: {e}") from None
                else:
                    error = e
            except socket.gaierror as e:  # a host name that does not resolve: no restart explains it
                raise RolloutServerError(f"{what}: {server.url}: the host does not resolve ({e}); fix "
                                         f"rollout.server_url") from None
            except RETRYABLE as e:
                error = e
            now = time.monotonic()
            first_fail = now if first_fail is None else first_fail
            if now - first_fail + wait > self.retry_s:
                raise RolloutServerError(
                    f"{what} at {server.url} failed for {now - first_fail:.0f} s (rollout.server_retry_s = "
                    f"{self.retry_s:g}): {type(error).__name__}: {error}. Is the server up (`tinyrl serve PRESET`, "
                    f"or `vllm serve BASE --enable-lora` with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)? The run stopped "
                    f"before training on this step; its last checkpoint is whole: `tinyrl train --resume RUN_DIR`.") from None
            self.sleep(wait)
            wait = min(2 * wait, BACKOFF[1])

    def wait_ready(self) -> list[dict]:
        """Every server's `/v1/models` answer, once its `/health` says it is up (retried for server_retry_s)."""
        out = []
        for s in self.servers:
            self.retrying("the health check (GET /health)", s, lambda s=s: s.request("GET", "/health", timeout=10))
            out.append(json.loads(self.retrying("GET /v1/models", s, lambda s=s: s.request("GET", "/v1/models", timeout=10))))
        return out

    def on_all(self, what: str, path: str, body: dict, ok_status: tuple[int, ...] = ()) -> None:
        """POST `body` to every server (an adapter load or unload), retried; a status in `ok_status` counts as done."""
        for s in self.servers:
            def call(s=s):
                try:
                    return s.request("POST", path, body, timeout=s.timeout_s)
                except HTTPError as e:
                    if e.status in ok_status:
                        return e.body
                    raise
            self.retrying(what, s, call)
