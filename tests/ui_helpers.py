"""A real `tinyrl ui` server for the UI tests: launched as its own process on a free port, like a
user would, and the training processes it starts, cleaned up afterwards by their pid files."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tinyrl.apps import procs, runs_view

# The default preset trimmed to a long run whose steps are quick (the test stops it): no
# held-out evaluation, progress bar off so the log stays readable.
QUICK = "train.eval_before_after=false log.progress=false"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class UIServer:
    """`tinyrl ui --runs-dir <name>` started in the runs directory's parent, as a user starts it in a project
    folder (so the page names the runs directory as typed, and no temporary path shows in screenshots)."""

    def __init__(self, runs_dir: Path, log: Path, env: dict | None = None):
        self.runs_dir, self.port = Path(runs_dir), free_port()
        self.log = Path(log)
        self.url = f"http://127.0.0.1:{self.port}/"
        self.out = open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "tinyrl.cli", "ui", "--port", str(self.port),
                                      "--runs-dir", self.runs_dir.name], stdout=self.out, stderr=subprocess.STDOUT,
                                     cwd=self.runs_dir.parent,
                                     env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})})
        self._wait_up(Path(log))

    def _wait_up(self, log: Path, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tinyrl ui exited {self.proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"tinyrl ui did not answer within {timeout} s:\n{log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the UI (a crash: nothing of it runs any more)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.out.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.out.close()


def kill_runs(runs_dir: Path) -> None:
    """Stop every training / eval process a test's UI started (they outlive the UI by design)."""
    runs_dir = Path(runs_dir)
    pid_files = list(runs_dir.glob("*/*.pid")) + list((runs_dir / runs_view.UI_DIR).glob("*.pid"))
    for f in pid_files:
        info = procs.read_pidfile(f)
        if procs.alive(info):
            os.killpg(info["pid"], signal.SIGKILL)


def wait_for(fn, what: str, timeout: float = 300, every: float = 1.0, shown=None):
    """Poll fn() until it returns something truthy; that value, or AssertionError naming `what` and what was
    last seen (fn's last value, or `shown()` where fn answers only yes or no)."""
    deadline, last = time.time() + timeout, None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last seen: {shown() if shown else last!r}")


def no_hub_login(tmp: Path) -> dict:
    """Environment of a UI with no Hugging Face login (an empty HF_HOME, no HF_TOKEN): `--push` must say so."""
    os.environ.pop("HF_TOKEN", None)  # (the UI inherits this process' environment)
    return {"HF_HOME": str(tmp / "hf-home")}


# --------------------------------------------------------------------------- a page, as a user drives it


def choose(page, elem_id: str, option: str) -> None:
    """Pick `option` in a gradio dropdown the way a user does: open it, click the entry."""
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=option, exact=True).click()


def launch(page, name: str, steps: int, overrides: str) -> None:
    """Fill steps, run name and overrides on the Launch tab, wait for the form to validate, Start."""
    page.get_by_role("tab", name="Launch").click()
    page.locator("#f-steps input").fill(str(steps))
    page.locator("#run-name input, #run-name textarea").first.fill(name)
    page.locator("#overrides textarea").fill(overrides)
    page.locator("#validation").get_by_text(f"valid: {steps} steps").wait_for(timeout=60_000)
    page.locator("#start-btn").click()
    page.locator("#start-msg").get_by_text(f"started {name}").wait_for(state="attached", timeout=60_000)


def screenshot(page, tmp_path: Path, name: str, env: str) -> Path:
    """A full-page screenshot in tmp_path, also copied to $env when that is set (the README's pictures)."""
    import shutil

    shot = tmp_path / name
    page.mouse.move(1, 1)  # no button left under the pointer (hover colours)
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get(env):
        shutil.copy(shot, os.environ[env])
    return shot
