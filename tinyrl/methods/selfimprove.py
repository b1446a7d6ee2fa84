"""ReST-EM and STaR: sample, keep what the verifier accepts, fine-tune the base on it; repeat.

ReST-EM (Singh et al. 2023, arXiv 2312.06585) is expectation-maximisation over the policy's
own samples. For iteration k = 1..K (`selfimprove.iterations`):

    E-step  sample N completions (`samples_per_prompt`) for `prompts_per_iter` train prompts
            from the latest iterate (the base at k = 1), through the run's rollout engine;
            keep those whose reward (the run's `reward.functions`) >= `min_reward`, at most
            `max_per_prompt` per prompt (distinct completions first);
    M-step  fine-tune the *base* (never the previous iterate: that is what stops the drift
            the paper warns about) on the kept rows, with the `sft` section's switches
            (tinyrl/sft.py, TRL's SFTTrainer);
    eval    held-out greedy pass@1 of the new iterate.

STaR (Zelikman et al. 2022, arXiv 2203.14465) is the same loop (STaR also restarts from the
base every iteration) plus rationalisation: each prompt none of whose N samples was correct
is sampled again (`hint_samples` times) with a hint that gives the answer away, and the
correct completions are kept *as answers to the original prompt*: the training row never
holds the hinted prompt, and a completion that repeats the hint's text is dropped.

A hint is a per-task hook: `HINTS[task name](row) -> Hint | None` (None: no hint for this
row). The arithmetic task's hint, and why it is not "the answer shown in the prompt": the
tiny model only ever saw `a+b=answer</s>`; prompts that show it the answer (`37+48=85</s>37+48=`,
`37+48=85\\n37+48=`, `85=37+48=`) make it reproduce the answer 0-3.5% of the time, measured
on 200 carrying train sums (it cannot copy from its context). What it can use is an easier
problem with the same answer: `37+48=` -> `42+43=`, a sum that needs no carry, which it
solves 100% of the time (the same 200 sums). So the hint restates the problem without the
carry; the model's completion ("85") is kept for `37+48=`. Sums of 100 or more have no
carry-free restatement with two 2-digit operands, so they get no hint (the hook returns
None) and STaR rationalises only the failed sums below 100.

Every metric lands in metrics.jsonl, one row per iteration with `step` = `iteration` (row 0
is the base, before any sampling): `eval_acc` (held-out greedy pass@1), `kept_frac` (kept /
sampled), `samples_used` (completions sampled so far, hinted ones included: the budget GRPO
is compared at), `reward_mean` of the iteration's samples, and the rest below.

Run folder (resume continues from the last completed phase of the last iteration):

    config.yaml, metrics.jsonl, samples.jsonl (a few per iteration), summary.json, adapter/
    iterations/001/samples.jsonl   every sampled completion: reward, kept, hinted  (E-step done)
    iterations/001/sft/            metrics.jsonl, checkpoints/, adapter/          (M-step done)
    iterations/001/stats.json      the iteration's metrics row                    (eval done)

Sampling is seeded by (train.seed, iteration) and the prompts by the iteration number, the
M-step by train.seed, and the eval is greedy, so a resumed run ends with the same numbers.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tinyrl import distributed
from tinyrl.data import PromptSource
from tinyrl.methods.common import (
    HeldOut,
    Summary,
    error_text,
    load_model,
    read_summary,
    reward_set,
    sampling_params,
    task_rows,
    write_summary,
)
from tinyrl.methods.sft_data import cap_per_prompt
from tinyrl.methods.sft_trl import FitResult, fit, require_trl, save_adapter
from tinyrl.model import load_tokenizer, resolve_model
from tinyrl.rewards.core import score_rollouts
from tinyrl.rollout.engines import make_engine, prompt_renderer
from tinyrl.runs import Run, RunDir, atomic_write_text, read_jsonl
from tinyrl.stop import StopSignals

log = logging.getLogger("tinyrl.selfimprove")


# --------------------------------------------------------------------------- hints


@dataclass
class Hint:
    prompt: str  # the hinted prompt (raw task text; rendered like any prompt)
    text: str  # what the hint reveals: a kept completion must not contain it


def arithmetic_hint(row: dict) -> Hint | None:
    """The same answer as a sum without a carry, with operands of the same length; None if none exists.

    >>> arithmetic_hint({"prompt": "37+48=", "answer": "85", "a": 37, "b": 48}).prompt
    '42+43='
    >>> arithmetic_hint({"prompt": "19+19=", "answer": "38", "a": 19, "b": 19}).prompt
    '14+24='
    >>> arithmetic_hint({"prompt": "57+68=", "answer": "125", "a": 57, "b": 68}) is None
    True
    """
    digits = len(str(row["a"]))
    answer = str(row["answer"])
    if len(answer) != digits or int(answer[0]) < 2:  # both leading digits must be >= 1
        return None
    x = "".join(str(int(d) // 2) for d in answer)
    y = "".join(str(int(d) - int(d) // 2) for d in answer)
    return Hint(f"{x}+{y}=", f"{x}+{y}")


# task name -> hint hook; a task without one gets no rationalisation (STaR runs as ReST-EM)
HINTS: dict[str, Callable[[dict], Hint | None]] = {"arithmetic": arithmetic_hint}


# --------------------------------------------------------------------------- the loop


class SelfImprove:
    """ReST-EM (`rationalize=False`) or STaR (`rationalize=True`) in one run folder."""

    def __init__(self, cfg, run: RunDir, rationalize: bool):
        self.cfg, self.run, self.rationalize = cfg, run, rationalize
        self.dist = distributed.setup(cfg.dist.timeout_s)  # one process (config resolution refuses more)
        self.method = "star" if rationalize else "rest_em"
        self.tokenizer = load_tokenizer(resolve_model(cfg.model.name, cfg.model.gguf_file))
        self.train_rows, _, self.task = task_rows(cfg, self.tokenizer)  # rendered as the run's engine sees them
        self.render = prompt_renderer(cfg, self.tokenizer, self.task)  # hinted prompts too
        self.rewards = reward_set(cfg, self.task)
        self.sampling = sampling_params(cfg, self.task)
        self.hint = HINTS.get(cfg.data.task) if rationalize else None
        if rationalize and self.hint is None:
            log.warning("star: task %r has no hint hook (selfimprove.HINTS): no rationalisation, STaR runs as "
                        "ReST-EM", cfg.data.task)
        self._policy: tuple[str, object] | None = None  # (adapter key, model) loaded last
        self._held_out: HeldOut | None = None

    def folder(self, k: int) -> Path:
        return self.run.path / "iterations" / f"{k:03d}"

    # ------------------------------------------------------------------ driver

    def train(self) -> Summary:
        """Run or continue all iterations; returns what summary.json holds."""
        base = self.folder(0) / "stats.json"
        if not base.exists():
            base.parent.mkdir(parents=True, exist_ok=True)
            acc = self.evaluate(None)
            atomic_write_text(base, json.dumps({"step": 0, "iteration": 0, "samples_used": 0,
                                                **({"eval_acc": acc} if acc is not None else {})}))
        for k in range(1, self.cfg.selfimprove.iterations + 1):
            if (self.folder(k) / "stats.json").exists():
                continue
            if not self.iteration(k):
                return self.write_logs(interrupted=True)
            self.write_logs(interrupted=False)
        self.finish()
        return self.write_logs(interrupted=False)

    def iteration(self, k: int) -> bool:
        """E-step, M-step, eval of iteration k, each skipped when done; False when the M-step was interrupted."""
        folder, prev = self.folder(k), self.adapter_of(k - 1)
        t0 = time.perf_counter()
        if not (folder / "samples.jsonl").exists():
            records = self.sample(k, prev)
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_text(folder / "samples.jsonl", "".join(json.dumps(r) + "\n" for r in records))
        records = read_jsonl(folder / "samples.jsonl")
        t1 = time.perf_counter()
        fit = None
        if not (folder / "sft" / "adapter" / "adapter_config.json").is_file():
            fit = self.m_step(folder / "sft", [r for r in records if r["kept"]])
            if fit.interrupted:
                return False
        t2 = time.perf_counter()
        acc = self.evaluate(str(folder / "sft" / "adapter"))
        stats = self.stats(k, records, acc, fit, (t1 - t0, t2 - t1, time.perf_counter() - t2))
        atomic_write_text(folder / "stats.json", json.dumps(stats))
        log.info("%s iteration %d: kept %d/%d, held-out %s", self.method, k, stats["kept"], stats["samples"], acc)
        return True

    # ------------------------------------------------------------------ phases

    def sample(self, k: int, adapter: str | None) -> list[dict]:
        """The E-step: N samples per prompt from the latest iterate; STaR adds hinted samples for failures."""
        si = self.cfg.selfimprove
        prompts = PromptSource(self.train_rows, self.cfg.data.seed)
        prompts.position = (k - 1) * si.prompts_per_iter  # iteration k's prompts, whatever ran before
        rows = prompts.next_batch(si.prompts_per_iter)
        engine = make_engine(self.cfg.rollout.engine, self.policy(adapter), self.tokenizer, self.cfg,
                             seed=self.cfg.train.seed * 10_007 + k, task=self.task)
        try:
            records = self._generate(engine, rows, [r["rendered"] for r in rows], si.samples_per_prompt, k, None)
            if self.hint is not None and si.hint_samples > 0:
                solved = {r["rendered"] for r in records if r["kept"]}
                failed = [(r, h) for r in rows if r["rendered"] not in solved and (h := self.hint(r)) is not None]
                if failed:
                    records += self._generate(engine, [r for r, _ in failed], [self.render(h.prompt) for _, h in failed],
                                              si.hint_samples, k, [h for _, h in failed])
        finally:
            engine.release()
        keep = {id(r) for r in cap_per_prompt([r for r in records if r["kept"]], si.max_per_prompt)}
        for r in records:
            r["kept"] = id(r) in keep
        return records

    def _generate(self, engine, rows, inputs, n, k, hints) -> list[dict]:
        """Sample n completions of each input text (chunks of train.prompts_per_step prompts) and score
        them against `rows` (the original prompts: a hinted input is scored as its original)."""
        out, step = [], self.cfg.train.prompts_per_step
        for i in range(0, len(rows), step):
            chunk, texts = rows[i: i + step], inputs[i: i + step]
            batch = engine.generate(texts, n=n, params=self.sampling, columns=chunk)
            batch.prompts = [r["rendered"] for r in chunk for _ in range(n)]  # the reward sees the original
            batch, _ = score_rollouts(batch, self.rewards)
            for j, (completion, reward) in enumerate(zip(batch.completions, batch.rewards.tolist())):
                row, hint = chunk[j // n], hints[i + j // n] if hints else None
                reward = None if math.isnan(reward) else reward
                ok = reward is not None and reward >= self.cfg.selfimprove.min_reward
                if hint is not None and hint.text in completion:
                    ok = False  # the completion repeats the hint: it would teach the hint, not the task
                out.append({"iteration": k, "prompt": row["prompt"], "rendered": row["rendered"],
                            "completion": completion, "reward": reward, "kept": ok, "hinted": hint is not None,
                            **({"hint": hint.prompt} if hint is not None else {})})
        return out

    def m_step(self, folder: Path, kept: list[dict]):
        """Fine-tune the base on the kept rows (prompt = the original, rendered; never the hint)."""
        self._policy = None  # free the sampling model before loading a fresh base
        model, tok = load_model(self.cfg, self.dist)  # the same LoRA init every iteration: the base
        rows = [{"rendered": r["rendered"], "completion": r["completion"]} for r in kept]
        if not rows:
            log.warning("%s: no completion was kept in %s; this iterate is the base", self.method, folder.parent.name)
            folder.mkdir(parents=True, exist_ok=True)
            save_adapter(model, folder / "adapter")
            return FitResult(folder / "adapter", 0, None, False)
        return fit(self.cfg, model, tok, rows, folder)

    def evaluate(self, adapter: str | None) -> float | None:
        if self._held_out is None:
            self._held_out = HeldOut(self.cfg, self.tokenizer)
        return self._held_out(self.policy(adapter))

    def policy(self, adapter: str | None):
        """The base (+ model.adapter) or an iterate's adapter on it; the last one is kept loaded."""
        key = adapter or "base"
        if self._policy is None or self._policy[0] != key:
            self._policy = None
            self._policy = (key, load_model(self.cfg, self.dist, adapter)[0])
        return self._policy[1]

    def adapter_of(self, k: int) -> str | None:
        return None if k == 0 else str(self.folder(k) / "sft" / "adapter")

    # ------------------------------------------------------------------ logs

    def stats(self, k: int, records: list[dict], acc, fit, times) -> dict:
        prev = json.loads((self.folder(k - 1) / "stats.json").read_text())
        direct = [r for r in records if not r["hinted"]]
        kept = [r for r in records if r["kept"]]
        rewards = [r["reward"] for r in direct if r["reward"] is not None]
        if fit is None:  # the M-step finished in an earlier process: read what it logged
            rows = read_jsonl(self.folder(k) / "sft" / "metrics.jsonl")
            fit_steps = rows[-1]["step"] if rows else 0
        else:
            fit_steps = fit.steps
        out = {
            "step": k, "iteration": k,
            **({"eval_acc": acc} if acc is not None else {}),
            "kept_frac": len(kept) / max(len(records), 1),
            "samples_used": prev["samples_used"] + len(records),
            "samples": len(records), "kept": len(kept),
            "prompts": len({r["rendered"] for r in direct}),
            "solved_frac": len({r["rendered"] for r in kept}) / max(len({r["rendered"] for r in direct}), 1),
            **({"reward_mean": sum(rewards) / len(rewards)} if rewards else {}),
            "sft_steps": fit_steps,
            "time_sample": times[0], "time_sft": times[1], "time_eval": times[2],
        }
        if self.rationalize:
            hinted = [r for r in records if r["hinted"]]
            out.update(hinted_prompts=len({r["rendered"] for r in hinted}), hint_samples=len(hinted),
                       rationalized=sum(r["kept"] for r in hinted))
        return out

    def write_logs(self, interrupted: bool) -> Summary:
        """metrics.jsonl, samples.jsonl and summary.json, rebuilt from the iteration folders."""
        rows, samples = [], []
        k_max = self.cfg.selfimprove.iterations
        for k in range(0, k_max + 1):
            path = self.folder(k) / "stats.json"
            if not path.exists():
                break
            rows.append(json.loads(path.read_text()))
            if k > 0:
                recs = read_jsonl(self.folder(k) / "samples.jsonl")[: self.cfg.log.samples_per_step]
                samples += [{"step": k, "prompt": r["rendered"], "completion": r["completion"], "reward": r["reward"],
                             "kept": r["kept"]} for r in recs]
        atomic_write_text(self.run.path / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        atomic_write_text(self.run.path / "samples.jsonl", "".join(json.dumps(r) + "\n" for r in samples))
        done = len(rows) - 1  # -1: stopped before the base was evaluated
        summary = Summary(self.method, max(done, 0), rows[0].get("eval_acc") if rows else None,
                          rows[-1].get("eval_acc") if done == k_max and not interrupted else None, interrupted,
                          reward_failures=dict(self.rewards.total_failures),
                          details={"iterations": max(done, 0), "samples_used": rows[-1]["samples_used"] if rows else 0})
        write_summary(self.run, summary)
        return summary

    def finish(self) -> Path:
        """adapter/: the last iterate's adapter, as every run folder has."""
        final = self.run.path / "adapter"
        shutil.rmtree(final, ignore_errors=True)
        shutil.copytree(self.adapter_of(self.cfg.selfimprove.iterations), final)
        return final


def run(cfg, run_dir: RunDir, rationalize: bool) -> Run:
    """The rest_em / star method in `run_dir` (continuing it). A signal stops it at once, resumably: every
    phase it finished is on disk, and the phase it was in starts again."""
    require_trl()
    loop = SelfImprove(cfg, run_dir, rationalize)
    try:
        with StopSignals():
            summary = loop.train()
    except KeyboardInterrupt:
        summary = loop.write_logs(interrupted=True)
        log.warning("%s interrupted; continue with `tinyrl train --resume %s`", loop.method, run_dir.path)
    except BaseException as e:
        write_summary(run_dir, Summary(**{**read_summary(run_dir), "method": loop.method, "error": error_text(e)}))
        raise
    adapter = run_dir.path / "adapter" if not summary.interrupted else None
    return Run(run_dir.path, run_dir.metrics(), summary.eval_before, summary.eval_after, adapter,
               interrupted=summary.interrupted)


def run_rest_em(cfg, run_dir: RunDir, resume: bool = False) -> Run:
    return run(cfg, run_dir, rationalize=False)


def run_star(cfg, run_dir: RunDir, resume: bool = False) -> Run:
    return run(cfg, run_dir, rationalize=True)
