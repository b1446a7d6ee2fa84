"""The UI end to end through its API, with gradio_client against a real `tinyrl ui` process:
start the default preset, watch metrics arrive, survive the UI being killed (a new UI re-attaches),
Stop -> a checkpoint, Resume -> the steps go on; bad input and path traversal refused."""

import json
import re
import time

import pytest

pytest.importorskip("gradio", reason="the UI needs the ui extra: pip install -e '.[ui]'")
from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402
from ui_helpers import QUICK, UIServer, kill_runs, wait_for  # noqa: E402

from tinyrl.apps import forms  # noqa: E402
from tinyrl.runs import read_jsonl  # noqa: E402


def start_args(name: str, free: str, steps: int = 400) -> list:
    """/start's inputs: preset, profile, the form fields (forms.KEYS order), run name, free overrides."""
    values = forms.form_values("tiny_grpo_cpu", None)
    values["train.steps"] = steps
    fields = [forms.NO_RECIPE if k == "algo.recipe" and values[k] is None else values[k] for k in forms.KEYS]
    return ["tiny_grpo_cpu", "", *fields, name, free]


@pytest.fixture
def ui(tmp_path):
    runs = tmp_path / "runs"
    servers = []

    def start():
        servers.append(UIServer(runs, tmp_path / "ui.log"))
        return servers[-1], Client(servers[-1].url, verbose=False)

    yield start
    for s in servers:
        s.close()
    kill_runs(runs)


def info(client, name):
    return client.predict(name, api_name="/run_info")


@pytest.mark.slow
def test_start_watch_reattach_stop_resume(ui, tmp_path):
    server, client = ui()
    runs = tmp_path / "runs"
    msg, _ = client.predict(*start_args("r1", QUICK), api_name="/start")
    assert "started **r1**" in msg and "tinyrl train tiny_grpo_cpu train.steps=400" in msg

    first = wait_for(lambda: (i := info(client, "r1"))["metric_rows"] >= 1 and i, "the first metrics row")
    assert first["status"] == "running" and first["steps"] == 400
    assert json.loads((runs / "r1" / "train.pid").read_text())["pid"] > 0  # moved from .ui/ into the folder
    assert (runs / "r1" / "train.log").stat().st_size > 0

    # The UI dies; training goes on (its output goes to a file, not to a pipe of the UI) ...
    server.kill()
    rows = len(read_jsonl(runs / "r1" / "metrics.jsonl"))
    wait_for(lambda: len(read_jsonl(runs / "r1" / "metrics.jsonl")) > rows, "steps after the UI was killed")
    # ... and a new UI finds it running
    server, client = ui()
    listed = {r["name"]: r for r in client.predict(api_name="/runs")}
    assert listed["r1"]["status"] == "running"

    assert "sent SIGTERM" in client.predict("r1", api_name="/stop")
    stopped = wait_for(lambda: (i := info(client, "r1"))["status"] == "interrupted" and i, "the run to stop")
    assert stopped["checkpoints"], stopped
    k = stopped["step"]
    assert 0 < k < 400 and stopped["checkpoints"][-1] == f"step-{k:06d}"
    with pytest.raises(AppError, match="is not running"):
        client.predict("r1", api_name="/stop")

    assert "resuming r1 from" in client.predict("r1", f"train.steps={k + 2}", api_name="/resume")
    done = wait_for(lambda: (i := info(client, "r1"))["status"] == "finished" and i, "the resumed run to finish")
    steps = [m["step"] for m in read_jsonl(runs / "r1" / "metrics.jsonl")]
    assert done["step"] == k + 2 and steps[-2:] == [k + 1, k + 2] and steps == sorted(set(steps))
    assert done["adapter"] and "resume at" in (runs / "r1" / "train.log").read_text()

    zip_path = client.predict("r1", api_name="/download")
    zip_path = zip_path["value"] if isinstance(zip_path, dict) else zip_path  # a gr.File update (it shows the file)
    import zipfile

    assert "adapter_config.json" in zipfile.ZipFile(zip_path).namelist()


@pytest.mark.slow
def test_bad_input_and_traversal_are_refused(ui, tmp_path):
    _, client = ui()
    shown, command = client.predict(*start_args("", "algo.scale=groups"), api_name="/validate")
    assert "algo.scale: expected one of 'group', 'batch', 'none', got 'groups'" in shown and command == ""
    shown, command = client.predict(*start_args("", "algo.beta=0.04"), api_name="/validate")
    assert shown.startswith("valid:") and command.endswith("algo.beta=0.04")
    verdict, table = client.predict(*start_args("", "algo.beta=0.04"), "4090", api_name="/memory")
    assert "budget  --gpu 4090" in verdict and "verdict: FITS" in verdict and "total at peak" in table
    verdict, table = client.predict(*start_args("", "algo.scale=groups"), "4090", api_name="/memory")
    assert "none until the form is valid" in verdict and table == ""
    with pytest.raises(AppError, match="algo.scale: expected one of"):
        client.predict(*start_args("x", "algo.scale=groups"), api_name="/start")
    with pytest.raises(AppError, match="log.run_dir: set by the UI"):
        client.predict(*start_args("x", "log.run_dir=/tmp"), api_name="/start")
    for bad in ("../outside", "..", "/etc", "a/../../b"):
        for api, extra in (("/stop", ()), ("/evaluate", ("latest", 0, [1], 0)), ("/download", ()), ("/run_info", ())):
            with pytest.raises(AppError, match="not a run name"):
                client.predict(bad, *extra, api_name=api)
        assert "not a run name" in client.predict(bad, "latest", api_name="/sample_prompt")[1]  # said on the page
        assert "not a run name" in client.predict(bad, "merged", "float32", "", "", False, "f16", api_name="/export")
        with pytest.raises(AppError, match="not a run name"):
            client.predict(*start_args(bad, QUICK), api_name="/start")
    time.sleep(1)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) in ([], [".ui"])  # nothing was started
    assert not list((tmp_path / "runs").glob(".ui/*"))


@pytest.mark.slow
def test_chat_streams_base_beside_adapter_and_exports_load_back(ui, tmp_path):
    """A trained run in the Chat endpoint: every yield one token further, base and adapter answering apart on
    held-out prompts with the verifier's verdicts; then its merged export loads back in transformers and
    answers as the adapter did, and its GGUF export is a GGUF file (when the CLI has --gguf)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tinyrl.apps import exports

    server, client = ui()
    runs = tmp_path / "runs"
    client.predict(*start_args("c1", QUICK, steps=12), api_name="/start")
    wait_for(lambda: info(client, "c1")["status"] == "finished", "c1 to finish", timeout=600)
    for _ in range(20):  # held-out prompts in order until base and adapter answer apart
        prompt, note = client.predict("c1", "latest", api_name="/sample_prompt")
        assert note.startswith("held-out prompt ")
        job = client.submit("c1", "latest", prompt, 0, None, api_name="/chat")
        base, tuned, base_verdict, tuned_verdict, _, _, status = job.result(timeout=300)
        grown = [o[1] for o in job.outputs() if isinstance(o[1], str) and o[1]]
        assert len(grown) >= 3 and all(tuned.startswith(g) for g in grown) and len(set(grown)) >= 2  # streamed
        assert "done; base ended by eos" in status
        if base != tuned:
            break
    else:
        pytest.fail("base and adapter gave the same answer on 20 held-out prompts")
    gold = re.search(r"gold answer: `(\d+)`", tuned_verdict).group(1)
    assert tuned_verdict.startswith("**✓ correct**" if tuned == gold else "**✗ wrong**")
    assert base_verdict.startswith("**✓ correct**" if base == gold else "**✗ wrong**")

    assert client.predict("c1", "merged", "float32", "", "", False, "f16", api_name="/export") == \
        "exporting c1 (merged model (base + adapter, one folder)) to c1/exports/merged-float32"
    done = wait_for(lambda: (s := exports.state(runs, "c1"))["state"] in ("done", "failed") and s, "the export")
    assert done["state"] == "done" and "merged into its weights" in done["card"], done
    out = runs / "c1" / "exports" / "merged-float32"
    model, tok = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    again = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=tok.eos_token_id)
    assert tok.decode(again[0, ids.shape[1]:], skip_special_tokens=True) == tuned  # the adapter's answer

    if exports.gguf_missing() is None:
        assert "to c1/exports/t.gguf" in client.predict("c1", "gguf", "float32", "t", "", False, "f32",
                                                        api_name="/export")
        done = wait_for(lambda: (s := exports.state(runs, "c1"))["state"] in ("done", "failed") and s, "the GGUF")
        assert done["state"] == "done", done
        assert (runs / "c1" / "exports" / "t.gguf").read_bytes()[:4] == b"GGUF"
