"""Held-out evaluation: greedy pass@1 of a task's verifier, plus what else the task and the
rollouts can say (the task's own per-sample scores, e.g. EM and F1; tool use of agent runs), and,
with `samples` > 0, pass@k and maj@k of N sampled completions per prompt (`evaluate_sampled`; the
estimators: tinyrl/passk.py).

Sampled evaluation draws with the engine's seeded sampling on a stream of its own: held-out prompt
i (its position in the held-out rows) samples from stream `EVAL_STREAM + i`, so its samples are the
same in any batch split or process, the same before and after training (common random numbers:
the change is the model's, not the draw's), and never the training prompts' streams.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from tinyrl.errors import ConfigError
from tinyrl.passk import Vote, default_k, maj_at_k, majority_vote, mean_pass_at_k, votes_of
from tinyrl.rollout.base import SamplingParams
from tinyrl.runs import atomic_write_text, finite_json

log = logging.getLogger("tinyrl")
EVAL_STREAM = 1 << 40  # first sample stream of held-out evaluation (training streams count prompts from 0)


@dataclass
class SampledEval:
    """pass@k and maj@k over the held-out prompts, from `samples` completions of each."""

    samples: int  # N: completions per prompt
    temperature: float
    k: list[int]
    pass_at_k: dict[int, float]  # k -> unbiased pass@k (Chen et al. 2021), mean over prompts
    maj_at_k: dict[int, float]  # k -> majority-vote accuracy, mean over prompts ({} when left out)
    maj_note: str | None = None  # why maj@k is left out, when it is
    problems: list[dict] = field(default_factory=list)  # per prompt: correct samples, the votes

    def lines(self) -> list[str]:
        out = [f"sampled: {self.samples} per prompt at temperature {self.temperature:g}"]
        for k in self.k:
            maj = f"   maj@{k}: {100 * self.maj_at_k[k]:5.1f}%" if k in self.maj_at_k else ""
            out.append(f"  pass@{k}: {100 * self.pass_at_k[k]:5.1f}%{maj}")
        if self.maj_note:
            out.append(f"  maj@k left out: {self.maj_note}")
        return out

    def to_dict(self, problems: bool = True) -> dict:
        """JSON-ready; `problems=False` keeps of each prompt only its count of correct samples."""
        out = {"samples": self.samples, "temperature": self.temperature, "k": list(self.k),
               "pass@k": {str(k): v for k, v in self.pass_at_k.items()},
               "maj@k": {str(k): v for k, v in self.maj_at_k.items()} if not self.maj_note else None,
               "maj_note": self.maj_note}
        if problems:
            out["problems"] = self.problems
        else:
            out["correct"] = [p["correct"] for p in self.problems]
        return out


@dataclass
class EvalReport:
    accuracy: float  # greedy pass@1 (the task's is_correct)
    n: int  # held-out rows scored
    scores: dict[str, float] = field(default_factory=dict)  # means of the task's `scores` (e.g. em, f1)
    agent: dict[str, float] = field(default_factory=dict)  # multi-turn only: tool calls, turns, errors
    sampled: SampledEval | None = None  # pass@k / maj@k, when samples were asked for
    path: Path | None = None  # the eval-<time>.json it was written to, if it was

    def lines(self) -> list[str]:
        out = [f"held-out accuracy (greedy pass@1): {100 * self.accuracy:.1f}%", f"  prompts: {self.n}"]
        out += [f"  {k}: {v:.3f}" for k, v in self.scores.items()]
        out += [f"  {k}: {v:.3f}" for k, v in self.agent.items()]
        return out + (self.sampled.lines() if self.sampled else [])

    def to_dict(self) -> dict:
        return {"greedy_pass@1": self.accuracy, "prompts": self.n, "scores": self.scores, "agent": self.agent,
                **({"sampled": self.sampled.to_dict()} if self.sampled else {})}


def evaluate_rows(engine, rows: list[dict], task, params: SamplingParams, batch_size: int = 64) -> EvalReport:
    """Greedy completions of `rows`, scored by the task's verifier (and its extra scores)."""
    if not rows:
        return EvalReport(float("nan"), 0)
    greedy = replace(params, temperature=1.0, top_p=1.0)
    correct, sums, calls, turns, errors = 0, {}, 0, 0, 0
    for i in range(0, len(rows), batch_size):
        chunk = rows[i: i + batch_size]
        out = engine.generate([r["rendered"] for r in chunk], n=1, params=greedy, columns=chunk, greedy=True)
        for c, r in zip(out.completions, chunk):
            correct += bool(task.is_correct(c, r))
            for k, v in (task.scores(c, r) if task.scores else {}).items():
                sums[k] = sums.get(k, 0.0) + float(v)
        for t in out.trajectories or []:
            calls, turns, errors = calls + t["tool_calls"], turns + t["turns"], errors + t["tool_errors"]
    n = len(rows)
    agent = {} if out.trajectories is None else {"tool_calls_per_question": calls / n, "turns_per_question": turns / n}
    if calls:  # no call made: the error rate was not measured (left out, not 0)
        agent["tool_error_rate"] = errors / calls
    return EvalReport(correct / n, n, {k: v / n for k, v in sums.items()}, agent)


def accuracy(engine, rows: list[dict], task, params: SamplingParams, batch_size: int = 64) -> float:
    """Fraction of `rows` whose greedy completion the task's verifier accepts."""
    return evaluate_rows(engine, rows, task, params, batch_size).accuracy


MAX_SAMPLES = 1024  # completions per prompt of a sampled evaluation (train.eval_samples has the same bound)


def check_k(samples: int, k: list[int] | None, where: str = "--samples") -> list[int]:
    """The k to report, sorted (default: 1, 2, 4, ... up to `samples`); a k above `samples` is a
    ConfigError naming `where` (the field or flag that sets the samples)."""
    if isinstance(samples, bool) or not isinstance(samples, int):
        raise ConfigError(f"{where}: a whole number of completions per prompt, got {samples!r:.40}")
    if samples < 1:
        raise ConfigError(f"{where}: k and temperature are for pass@k / maj@k, which need {where} N >= 1 "
                          f"completions per prompt, got {samples}")
    if samples > MAX_SAMPLES:
        raise ConfigError(f"{where}: at most {MAX_SAMPLES} completions per prompt, got {samples}")
    if k is not None and (not isinstance(k, (list, tuple)) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in k)):
        raise ConfigError(f"k: a list of whole numbers (the k of pass@k / maj@k), got {k!r:.60}")
    ks = sorted(set(k)) if k else default_k(samples)
    if ks[0] < 1:
        raise ConfigError(f"k: every k of pass@k / maj@k must be >= 1, got {ks[0]}")
    if ks[-1] > samples:
        raise ConfigError(f"{where}={samples}: k={ks[-1]} needs at least {ks[-1]} samples per prompt "
                          f"(k <= samples); raise {where} or lower k")
    return ks


def sample_problems(engine, rows: list[dict], task, params: SamplingParams, samples: int, first: int = 0,
                    batch_size: int = 64) -> list[dict]:
    """Per row: its `samples` completions scored ("correct": how many the verifier accepts) and, where
    the task has `answer_of`, their votes ("votes": [answer, count, correct] each; "abstain": none
    given). Row i samples from stream EVAL_STREAM + first + i (`first`: its position in all rows)."""
    out = []
    per_call = max(1, batch_size // samples)  # prompts per engine call: about batch_size completions
    for i in range(0, len(rows), per_call):
        chunk = rows[i: i + per_call]
        drawn = engine.generate([r["rendered"] for r in chunk], n=samples, columns=chunk,
                                params=replace(params, stream=EVAL_STREAM + first + i))
        for j, r in enumerate(chunk):
            comps = drawn.completions[j * samples:(j + 1) * samples]  # prompt-major rows
            ok = [bool(task.is_correct(c, r)) for c in comps]
            problem = {"prompt": r["prompt"], "correct": sum(ok)}
            if task.answer_of is not None:
                answers = [task.answer_of(c, r) for c in comps]
                votes, abstain = votes_of(answers, ok)
                problem.update(vote=majority_vote(answers), votes=[[v.answer, v.count, v.correct] for v in votes],
                               abstain=abstain)
            out.append(problem)
    return out


def summarize(problems: list[dict], samples: int, ks: list[int], temperature: float, task) -> SampledEval:
    """pass@k and maj@k (each the mean over problems) of `sample_problems`' records."""
    pass_k = {k: mean_pass_at_k([(samples, p["correct"]) for p in problems], k) for k in ks}
    if task.answer_of is None:
        note = f"task {task.name!r} has no answer_of (no final answer to vote on)"
        return SampledEval(samples, temperature, ks, pass_k, {}, note, problems)
    maj = {}
    for k in ks:
        per = [maj_at_k([Vote(*v) for v in p["votes"]], p["abstain"], k) for p in problems]
        maj[k] = sum(per) / len(per) if per else math.nan
    return SampledEval(samples, temperature, ks, pass_k, maj, None, problems)


def evaluate_sampled(engine, rows: list[dict], task, params: SamplingParams, samples: int, k: list[int] | None = None,
                     temperature: float | None = None, dist=None, where: str = "--samples") -> SampledEval:
    """pass@k and maj@k of `samples` completions of each row at `temperature` (default: params').

    With `dist` (tinyrl.distributed.Dist), each process samples its share of the rows and all get
    the whole result (the same as one process's)."""
    ks = check_k(samples, k, where)
    temperature = params.temperature if temperature is None else temperature
    if not temperature > 0:
        raise ConfigError(f"temperature: sampled evaluation needs a temperature > 0, got {temperature}")
    params = replace(params, temperature=temperature)
    share = dist.share(len(rows)) if dist is not None else slice(0, len(rows))
    mine = sample_problems(engine, rows[share], task, params, samples, first=share.start or 0)
    problems = [p for part in dist.all_gather_object(mine) for p in part] if dist is not None else mine
    return summarize(problems, samples, ks, temperature, task)


def run_sampled(engine, rows: list[dict], task, params: SamplingParams, train, dist, when: str) -> dict:
    """The trainer's sampled evaluation `when` ("before" / "after") training, by `train` (TrainConfig:
    eval_samples, eval_k, eval_temperature): {when: its summary dict}, or {} when eval_samples is 0."""
    if not train.eval_samples:
        return {}
    got = evaluate_sampled(engine, rows, task, params, train.eval_samples, train.eval_k, train.eval_temperature,
                           dist, where="train.eval_samples")
    log.info("held-out sampled evaluation %s training: %s", when, " ".join(x.strip() for x in got.lines()))
    return {when: got.to_dict(problems=False)}


def run_folder_of(adapter) -> Path:
    """The folder an evaluation of `adapter` is written to: the run folder that holds it (a run folder
    given, or the parent of its adapter/), else the adapter folder itself."""
    p = Path(adapter).expanduser()
    if p.name == "adapter" and (p.parent / "config.yaml").is_file():
        return p.parent
    return p


def write_eval(report: EvalReport, folder) -> Path:
    """`report` as eval-<YYYYmmdd-HHMMSS>.json in `folder` (a new name; never overwrites another)."""
    folder = Path(folder)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, i = folder / f"eval-{stamp}.json", 1
    while path.exists():
        path, i = folder / f"eval-{stamp}-{i}.json", i + 1
    atomic_write_text(path, json.dumps(finite_json(report.to_dict()), indent=2))
    return path
