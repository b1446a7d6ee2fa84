"""`rollout.server_url`: the addresses of the OpenAI-compatible rollout servers (rollout.engine: vllm_server), checked
when the config resolves. Torch-free; the engine (tinyrl.rollout.vllm_server) uses the same normal form.

A server is `http(s)://HOST[:PORT][/PREFIX]`: the base under which `/v1/completions`, `/v1/load_lora_adapter` and
`/health` live. A trailing `/` or `/v1` is dropped (both are common ways to write the same server). Refused: other
schemes, no host, a bad port, credentials (`user:pass@`: they would be logged), a query or fragment, whitespace
and control characters.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from tinyrl.config.coerce import check

MAX_SERVERS = 256  # rollout servers one run balances over
MAX_URL = 2048


def normalize_server_url(text: str) -> str:
    """The URL in normal form, or ValueError saying what is wrong with it.

    >>> normalize_server_url("http://127.0.0.1:8000/v1/")
    'http://127.0.0.1:8000'
    >>> normalize_server_url("https://rollouts.example/team-a")
    'https://rollouts.example/team-a'
    >>> normalize_server_url("localhost:8000")
    Traceback (most recent call last):
    ...
    ValueError: not an http(s) URL (write it as http://HOST:PORT)
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("empty")
    if len(text) > MAX_URL:
        raise ValueError(f"longer than {MAX_URL} characters")
    if re.search(r"[\s\x00-\x1f\x7f]", text):
        raise ValueError("holds whitespace or a control character")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("not an http(s) URL (write it as http://HOST:PORT)")
    if "@" in parts.netloc:
        raise ValueError("holds credentials (user:pass@); put the server behind a local address instead")
    if not parts.hostname:
        raise ValueError("has no host")
    try:
        parts.port  # noqa: B018  (urlsplit checks the port when it is read)
    except ValueError as e:
        raise ValueError(f"bad port ({e})") from None
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        raise ValueError("holds a query or a fragment (? or #)")
    path = parts.path.rstrip("/")
    path = path[: -len("/v1")] if path.endswith("/v1") else path
    return f"{parts.scheme}://{parts.netloc}{path}"


def check_server_fields(r, p: str) -> None:
    """RolloutConfig's server fields (`r`, at path `p`): the URLs in normal form (in place), the numbers in range."""
    urls = r.server_url
    check(len(urls) <= MAX_SERVERS, f"{p}.server_url", f"at most {MAX_SERVERS} servers, got {len(urls)}")
    for i, url in enumerate(urls):
        try:
            urls[i] = normalize_server_url(url)
        except ValueError as e:
            check(False, f"{p}.server_url[{i}]", f"{e}: {url[:80]!r}")
    check(len(set(urls)) == len(urls), f"{p}.server_url", "names a server twice")
    check(r.engine != "vllm_server" or bool(urls), f"{p}.server_url",
          "rollout.engine vllm_server needs the server's address, e.g. http://127.0.0.1:8000 (start one with "
          "`tinyrl serve PRESET`)")
    check(0 < r.server_timeout_s, f"{p}.server_timeout_s", f"must be > 0, got {r.server_timeout_s}")
    check(r.server_retry_s >= 0, f"{p}.server_retry_s", f"must be >= 0 (0: no retry), got {r.server_retry_s}")
    d = r.server_adapter_dir
    check(d is None or (bool(d.strip()) and "\n" not in d), f"{p}.server_adapter_dir", "must be a folder path or null")
