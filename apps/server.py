"""`tinyrl ui`: check how the app would be exposed, then build and launch it.

Binds 127.0.0.1 by default. A host other than loopback, or a public `--share` link, exposes a
page that starts processes on this machine: both refuse to start without `--auth USER:PASS`.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from pathlib import Path

LOOPBACK_NAMES = ("localhost",)


class ExposureError(ValueError):
    """The UI would be reachable by others without a password."""


def is_loopback(host: str) -> bool:
    """
    >>> [is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "192.168.1.5", "example.org")]
    [True, True, True, False, False, False]
    """
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_auth(auth: str | None) -> tuple[str, str] | None:
    if auth is None:
        return None
    user, sep, password = auth.partition(":")
    if not sep or not user or not password:
        raise ExposureError("--auth: expected USER:PASS with both parts non-empty")
    return user, password


def check_exposure(host: str, share: bool, auth: str | None) -> tuple[str, str] | None:
    """The (user, password) to require, or ExposureError when the page would be open to others."""
    creds = parse_auth(auth)
    if creds is None and (share or not is_loopback(host)):
        where = "a public share link (--share)" if share else f"host {host!r}, which is not loopback"
        raise ExposureError(f"refusing to serve the UI on {where} without a password: it starts processes "
                            f"on this machine. Add --auth USER:PASS, or bind --host 127.0.0.1")
    return creds


class MissingExtraError(ImportError):
    """gradio (the `ui` extra) is not installed."""


def import_gradio():
    try:
        import gradio
    except ImportError as e:
        raise MissingExtraError(f"the tinyrl UI needs gradio, which is not installed ({e}). "
                          f"Install the extra: pip install 'tinyrl-rlvr[ui]'") from None
    return gradio


def serve(host: str = "127.0.0.1", port: int | None = None, runs_dir: str = "runs", share: bool = False,
          auth: str | None = None, block: bool = True):
    """Launch the app; returns the gradio Blocks (with `block=False` the server runs in a thread)."""
    creds = check_exposure(host, share, auth)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline machines: no phone-home
    import_gradio()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # gradio's own startup checks, not news
    from tinyrl.apps.ui import build_app, launch_kwargs

    demo = build_app(Path(runs_dir))
    demo.launch(server_name=host, server_port=port, share=share, auth=creds, prevent_thread_lock=not block,
                **launch_kwargs())
    return demo
