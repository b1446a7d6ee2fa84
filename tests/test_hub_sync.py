"""Checkpoints on the hub while training (`log.push_to_hub`, tinyrl/hub_sync.py), and `--resume hub:USER/NAME`.

The hub cannot be reached from here: as tests/test_export.py does, only `huggingface_hub.HfApi`'s network calls are
replaced (`create_repo`, `upload_folder`, `snapshot_download`), by a fake hub that keeps each repo's files in a
folder of the test (honouring upload_folder's delete_patterns and snapshot_download's allow_patterns). Everything
else (the staging, the card, the thread, the resume) is tinyrl's real code on real runs of the shipped tiny model.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import shutil
import threading
import time
from pathlib import Path

import pytest

import tinyrl
from tinyrl import hub_sync
from tinyrl.cli import main
from tinyrl.config import load_config
from tinyrl.errors import ConfigError, ResumeError
from tinyrl.runs import read_jsonl

REPO = "me/tiny-push"
TINY = {"train.steps": 3, "train.save_every": 1, "train.prompts_per_step": 2, "rollout.num_generations": 2,
        "train.micro_batch_size": 4, "rollout.max_new_tokens": 4, "train.eval_before_after": False,
        "data.num_train": 16, "data.num_eval": 4, "log.progress": False, "log.push_to_hub": REPO}


class FakeHub:
    """HfApi's network calls against folders: one per repo. `fail` / `hang` make upload_folder raise / block."""

    def __init__(self, root: Path):
        self.root, self.calls = root, []
        self.fail: list[BaseException] = []  # raised by the next uploads, in turn
        self.hang = None  # a threading.Event the next uploads wait for
        self.entered = threading.Event()

    def install(self, monkeypatch):
        from huggingface_hub import HfApi

        hub = self

        def create_repo(self, repo_id, **kw):
            hub.calls.append(("create_repo", repo_id, kw, self.token))
            (hub.root / repo_id).mkdir(parents=True, exist_ok=True)
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(self, *, repo_id, folder_path, delete_patterns=None, **kw):
            hub.entered.set()
            if hub.hang is not None:
                hub.hang.wait(300)
            if hub.fail:
                raise hub.fail.pop(0)
            folder, repo = Path(folder_path), hub.root / repo_id
            files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
            for old in [p for p in repo.rglob("*") if p.is_file()]:
                rel = old.relative_to(repo).as_posix()
                if any(fnmatch.fnmatch(rel, pat) for pat in delete_patterns or []) and rel not in files:
                    old.unlink()
            for rel in files:
                (repo / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(folder / rel, repo / rel)
            hub.calls.append(("upload_folder", repo_id, {**kw, "delete_patterns": delete_patterns}, files))
            return f"https://huggingface.co/{repo_id}/commit/{len(hub.calls)}"

        def snapshot_download(self, repo_id, *, local_dir=None, allow_patterns=None, revision=None, **kw):
            from huggingface_hub.errors import RepositoryNotFoundError

            repo = hub.root / repo_id
            if not repo.is_dir():
                raise RepositoryNotFoundError(f"404 {repo_id}", response=_response(404))
            hub.calls.append(("snapshot_download", repo_id, {"revision": revision, "allow_patterns": allow_patterns}))
            for f in repo.rglob("*"):
                rel = f.relative_to(repo).as_posix()
                if f.is_file() and any(fnmatch.fnmatch(rel, p) for p in allow_patterns or ["*"]):
                    (Path(local_dir) / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(f, Path(local_dir) / rel)
            return str(local_dir)

        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
        monkeypatch.setattr(HfApi, "snapshot_download", snapshot_download)
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        return self

    def files(self, repo=REPO) -> list[str]:
        return sorted(p.relative_to(self.root / repo).as_posix() for p in (self.root / repo).rglob("*") if p.is_file())

    def uploads(self) -> list:
        return [c for c in self.calls if c[0] == "upload_folder"]


def _response(status: int):
    from huggingface_hub.errors import HfHubHTTPError

    lib = __import__(HfHubHTTPError.__mro__[1].__module__)  # the hub client's HTTP library
    return lib.Response(status, request=lib.Request("POST", "https://hub.invalid/api"))


@pytest.fixture
def hub(tmp_path, monkeypatch):
    return FakeHub(tmp_path / "hub").install(monkeypatch)


def records(run_path: Path) -> list[dict]:
    return read_jsonl(run_path / hub_sync.RECORD)


def test_every_save_pushes_adapter_card_and_checkpoint_then_resume_from_the_hub(hub, tmp_path):
    run = tinyrl.train(**TINY, **{"log.run_dir": str(tmp_path / "runs"), "log.hub_strategy": "checkpoint",
                                  "log.hub_private": True})
    assert [m["step"] for m in run.metrics] == [1, 2, 3]
    creates = [c for c in hub.calls if c[0] == "create_repo"]
    assert creates == [("create_repo", REPO, {"private": True, "exist_ok": True, "repo_type": "model"},
                        "hf_test_token")]  # once, private
    got = records(run.path)
    assert got[-1]["step"] == 3 and all(r["ok"] for r in got) and {r["step"] for r in got} <= {1, 2, 3}
    assert hub.files() == ["README.md", "adapter_config.json", "adapter_model.safetensors",
                           "last-checkpoint/checkpoints/step-000003/adapter/README.md",  # the checkpoint as written
                           "last-checkpoint/checkpoints/step-000003/adapter/adapter_config.json",
                           "last-checkpoint/checkpoints/step-000003/adapter/adapter_model.safetensors",
                           "last-checkpoint/checkpoints/step-000003/trainer_state.pt",
                           "last-checkpoint/config.yaml", "last-checkpoint/metrics.jsonl"]  # one checkpoint, the newest
    ckpt = run.path / "checkpoints" / "step-000003" / "adapter" / "adapter_model.safetensors"
    assert (hub.root / REPO / "adapter_model.safetensors").read_bytes() == ckpt.read_bytes()
    from huggingface_hub import ModelCard

    card = ModelCard.load(hub.root / REPO / "README.md")
    assert card.data.library_name == "peft" and "| steps | 3 |" in card.text and card.data.model_name == REPO
    assert not list(run.path.glob(".hub-push-*"))  # staging folders are gone

    # another machine: the pushed checkpoint continues in a new run folder, which pushes on to the same repo
    resumed = tinyrl.train(resume=f"hub:{REPO}", **{"train.steps": 5, "log.run_dir": str(tmp_path / "elsewhere")})
    assert resumed.path.parent == tmp_path / "elsewhere" and resumed.path.name == "tiny-push"
    assert [m["step"] for m in resumed.metrics] == [1, 2, 3, 4, 5]  # metrics.jsonl came along, then 4 and 5
    assert json.loads((resumed.path / "hub.json").read_text())["checkpoint"] == "step-000003"
    resumes = read_jsonl(resumed.path / "resumes.jsonl")
    assert resumes[-1]["step"] == 3 and resumes[-1]["checkpoint"] == "step-000003"
    assert records(resumed.path)[-1]["step"] == 5 and "step-000005" in " ".join(hub.files())


def test_end_strategy_pushes_once_at_the_end_without_a_checkpoint(hub, tmp_path):
    run = tinyrl.train(**TINY, **{"log.run_dir": str(tmp_path / "runs"), "log.hub_strategy": "end"})
    assert [r["step"] for r in records(run.path)] == [3] and len(hub.uploads()) == 1
    assert hub.files() == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    assert main(["train", "--resume", f"hub:{REPO}", f"log.run_dir={tmp_path / 'x'}"]) == 2  # nothing to resume
    assert not (tmp_path / "x").exists()


def test_a_failing_push_warns_once_and_never_stops_the_run(hub, tmp_path, monkeypatch, caplog):
    from huggingface_hub.errors import HfHubHTTPError

    real_stage, staged = hub_sync.stage, []

    def stage_failing_once(*a, **kw):  # the first save cannot even stage its files (a full disk, say)
        staged.append(1)
        if len(staged) == 1:
            raise OSError(28, "No space left on device")
        return real_stage(*a, **kw)

    monkeypatch.setattr(hub_sync, "stage", stage_failing_once)
    hub.fail = [HfHubHTTPError("503 Service Unavailable", response=_response(503))]  # the second save's upload
    with caplog.at_level(logging.INFO, logger="tinyrl.hub"):
        run = tinyrl.train(**{**TINY, "log.run_dir": str(tmp_path / "runs"), "train.steps": 4})
    summary = json.loads((run.path / "summary.json").read_text())
    assert summary["error"] is None and summary["steps"] == 4 and (run.path / "adapter").is_dir()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("could not prepare the push of step 1" in w for w in warnings) == 1
    assert sum("pushing step 2 to me/tiny-push failed (HfHubHTTPError: 503" in w for w in warnings) == 1
    assert len([w for w in warnings if "push" in w]) == 2  # each said once, nothing else
    got = records(run.path)
    assert got[0]["step"] == 2 and not got[0]["ok"] and got[-1] == {**got[-1], "step": 4, "ok": True}
    assert "after 1 failed push(es)" in caplog.text  # the retry at the next save went up


def test_a_hanging_push_does_not_stall_the_run(hub, tmp_path, caplog):
    hub.hang = threading.Event()
    t0 = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="tinyrl.hub"):
            run = tinyrl.train(**TINY, **{"log.run_dir": str(tmp_path / "runs"), "log.hub_timeout_s": 1})
        took = time.monotonic() - t0
        assert hub.entered.is_set() and not hub.uploads()  # the first push is stuck inside upload_folder...
        assert [m["step"] for m in run.metrics] == [1, 2, 3]  # ...and every step ran, the run ended
        assert json.loads((run.path / "summary.json").read_text())["error"] is None
        assert "has not finished after 1s (log.hub_timeout_s)" in caplog.text and took < 280  # far below the hang
    finally:
        hub.hang.set()  # the stuck push returns; the newest save, waiting behind it, goes up
    deadline = time.monotonic() + 120
    while not (records(run.path) and records(run.path)[-1]["step"] == 3) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [r["step"] for r in records(run.path)] == [1, 3]  # step 2's save was replaced by step 3's while it waited


def test_no_login_is_an_error_at_start_not_at_the_first_save(hub, tmp_path, monkeypatch):
    import huggingface_hub.constants

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(ConfigError, match=r"log.push_to_hub: pushing to me/tiny-push needs a Hugging Face login: run "
                                          r"`hf auth login`"):
        tinyrl.train(**TINY, **{"log.run_dir": str(tmp_path / "runs")})
    assert not (tmp_path / "runs").exists() and hub.calls == []
    assert load_config(None, {"log.push_to_hub": REPO})[1].log.push_to_hub == REPO  # a config alone needs no login


@pytest.mark.parametrize("over, words", [
    ({"log.push_to_hub": ""}, r"log.push_to_hub: a hub repo id is USER/NAME"),
    ({"log.push_to_hub": "noslash"}, r"log.push_to_hub: a hub repo id"),
    ({"log.push_to_hub": "a/b/c"}, r"log.push_to_hub: a hub repo id"),
    ({"log.push_to_hub": "../x"}, r"log.push_to_hub: a hub repo id"),
    ({"log.push_to_hub": "me/.."}, r"log.push_to_hub: a hub repo id"),
    ({"log.push_to_hub": "me/x; rm -rf /"}, r"log.push_to_hub: a hub repo id"),
    ({"log.push_to_hub": "me/" + "x" * 200}, r"log.push_to_hub: a hub repo id"),
    ({"log.push_to_hub": 5}, r"log.push_to_hub: expected str or null"),
    ({"log.hub_strategy": "all_checkpoints"}, r"log.hub_strategy: expected one of 'end', 'every_save', 'checkpoint'"),
    ({"log.hub_strategy": ""}, r"log.hub_strategy: expected one of"),
    ({"log.hub_private": "yes"}, r"log.hub_private: expected bool"),
    ({"log.hub_timeout_s": -1}, r"log.hub_timeout_s: must be in \[0, 86400\]"),
    ({"log.hub_timeout_s": 1e9}, r"log.hub_timeout_s: must be in \[0, 86400\]"),
    ({"log.hub_timeout_s": float("nan")}, r"log.hub_timeout_s: must be a finite number"),
    ({"log.hub_timeout_s": "soon"}, r"log.hub_timeout_s: expected float"),
    ({"log.push_to_hub": REPO, "stages": ["sft"]}, r"log.push_to_hub: pushes the GRPO trainer's checkpoints"),
])
def test_bad_push_settings_fail_at_resolve_naming_the_field(over, words):
    with pytest.raises(ConfigError, match=words):
        load_config(None, over)


@pytest.mark.parametrize("spec, words", [
    ("hub:", r"--resume: hub:USER/NAME\[@REVISION\] names a hub repo"),
    ("hub:noslash", r"--resume: hub:USER/NAME"),
    ("hub:../x", r"--resume: hub:USER/NAME"),
    ("hub:me/..", r"--resume: .*without '\.\.'"),
    ("hub:me/x@../../etc", r"--resume: .*a revision of letters"),
    ("hub:me/x@a b", r"--resume: .*a revision of letters"),
    ("hub:me/x@" + "r" * 200, r"--resume: .*a revision of letters"),
    ("hub:me/x\x00", r"--resume: hub:USER/NAME"),
])
def test_bad_hub_resume_specs(spec, words, hub):
    with pytest.raises(ConfigError, match=words):
        hub_sync.resume_source(spec)
    assert hub.calls == []


def test_resume_from_a_repo_that_is_not_there(hub, tmp_path, capsys):
    with pytest.raises(ResumeError, match=r"--resume hub:me/none: RepositoryNotFoundError: no such repo"):
        hub_sync.resume_source("hub:me/none", {"log.run_dir": str(tmp_path / "runs")})
    assert main(["train", "--resume", "hub:me/none"]) == 2 and "no such repo" in capsys.readouterr().err
    assert hub_sync.resume_source(str(tmp_path)) == str(tmp_path)  # a local folder is left to --resume as it is
    with pytest.raises(ConfigError, match="log.run_dir: a folder path"):
        hub_sync.resume_source("hub:me/none", {"log.run_dir": 5})
