"""pass@k and maj@k: the estimators against their combinatorial definitions (hand cases and an
enumeration of every k-subset), the tasks' answers to vote on, and real evaluations of the shipped
tiny-arith model through the engine, the Python API, the trainer (train.eval_samples) and the CLI."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import re
import subprocess
import sys
from fractions import Fraction
from types import SimpleNamespace

import pytest

from tinyrl.errors import ConfigError
from tinyrl.passk import Vote, default_k, maj_at_k, majority_vote, mean_pass_at_k, pass_at_k, votes_of

# --------------------------------------------------------------------------- pass@k


def comb_pass_at_k(n: int, c: int, k: int) -> float:
    """The definition: 1 - C(n-c, k) / C(n, k) (math.comb is 0 when k > n - c)."""
    return 1 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_pass_at_k_n5_c2_equals_the_combinatorial_formula(k):
    by_hand = {1: 1 - 3 / 5, 2: 1 - 3 / 10, 3: 1 - 1 / 10, 4: 1.0, 5: 1.0}  # C(3,k)/C(5,k) written out
    assert pass_at_k(5, 2, k) == pytest.approx(by_hand[k], abs=1e-12)
    assert pass_at_k(5, 2, k) == pytest.approx(comb_pass_at_k(5, 2, k), abs=1e-12)


def test_pass_at_k_on_a_grid_and_its_edges():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(comb_pass_at_k(n, c, k), abs=1e-12), (n, c, k)
    assert pass_at_k(10, 0, 10) == 0.0 and pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the fraction correct


def test_pass_at_k_is_stable_where_the_binomials_are_huge():
    n, c, k = 2000, 5, 1000  # C(2000, 1000) ~ 1e600 overflows a float
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9)


def test_pass_at_k_rejects_k_above_n_and_impossible_counts():
    with pytest.raises(ValueError, match="k=6"):
        pass_at_k(5, 2, 6)
    with pytest.raises(ValueError, match="c=7"):
        pass_at_k(5, 7, 1)


def test_mean_pass_at_k_averages_problems():
    assert mean_pass_at_k([(5, 2), (5, 0), (5, 5)], 2) == pytest.approx((0.7 + 0.0 + 1.0) / 3)


# --------------------------------------------------------------------------- maj@k


def brute_maj_at_k(votes: list[Vote], abstain: int, k: int) -> float:
    """Every k-subset of the samples voted on, a tie scored (correct among the tied) / (tied)."""
    samples = [v for v in votes for _ in range(v.count)] + [None] * abstain
    total, subsets = 0.0, 0
    for sub in itertools.combinations(range(len(samples)), k):
        subsets += 1
        counts: dict[str, int] = {}
        for i in sub:
            if samples[i] is not None:
                counts[samples[i].answer] = counts.get(samples[i].answer, 0) + 1
        if counts:
            top = max(counts.values())
            tied = [v for v in votes if counts.get(v.answer) == top]
            total += sum(v.correct for v in tied) / len(tied)
    return total / subsets


def test_maj_at_k_hand_cases():
    a, b = Vote("4", 2, True), Vote("5", 1, False)
    # n=3: k=1 -> 2/3; k=2: {4,4} right, {4,5} twice a tie (1/2 each) -> (1 + 1/2 + 1/2) / 3; k=3: "4" wins
    assert [maj_at_k([a, b], 0, k) for k in (1, 2, 3)] == pytest.approx([2 / 3, 2 / 3, 1.0])
    # one right "4", two wrong "5", one sample with no answer; k=3 of the C(4,3)=4 subsets:
    # {4,5,5} -> 0, {4,5,-} twice -> a tie, 1/2 each, {5,5,-} -> 0: (1/2 + 1/2) / 4
    assert maj_at_k([Vote("4", 1, True), Vote("5", 2, False)], 1, 3) == pytest.approx(0.25)
    # the majority is wrong although pass@k is 1: voting is not pass@k
    assert maj_at_k([Vote("4", 1, True), Vote("5", 4, False)], 0, 5) == 0.0 and pass_at_k(5, 1, 5) == 1.0
    # two correct answers (e.g. two spellings) tied at the top: the vote is right either way
    assert maj_at_k([Vote("a", 1, True), Vote("b", 1, True), Vote("c", 1, False)], 0, 3) == pytest.approx(2 / 3)
    assert maj_at_k([], 4, 2) == 0.0  # nobody answered
    with pytest.raises(ValueError, match="k=4"):
        maj_at_k([a, b], 0, 4)


def test_maj_at_k_equals_the_enumeration_of_every_subset():
    rng = random.Random(0)
    for _ in range(150):
        votes = [Vote(str(i), rng.randint(1, 4), rng.random() < 0.4) for i in range(rng.randint(1, 4))]
        abstain = rng.randint(0, 3)
        n = sum(v.count for v in votes) + abstain
        for k in range(1, n + 1):
            assert maj_at_k(votes, abstain, k) == pytest.approx(brute_maj_at_k(votes, abstain, k), abs=1e-12)


def test_maj_at_1_is_pass_at_1_and_maj_at_2_equals_it_when_every_sample_answers():
    """With a fair tie-break, a pair of answering samples votes right exactly as often as one sample
    (p^2 + 2p(1-p)/2 = p); a pair with one abstention is that one sample's answer, so it does better."""
    votes = [Vote("1", 3, True), Vote("2", 2, False), Vote("3", 1, False)]
    assert maj_at_k(votes, 0, 1) == pytest.approx(pass_at_k(6, 3, 1))
    assert maj_at_k(votes, 0, 2) == pytest.approx(maj_at_k(votes, 0, 1))
    assert maj_at_k(votes, 2, 1) == pytest.approx(pass_at_k(8, 3, 1))
    assert maj_at_k(votes, 2, 2) > maj_at_k(votes, 2, 1) + 0.05


def test_majority_vote_breaks_ties_by_first_appearance_and_ignores_no_answer():
    assert majority_vote(["3", None, "4", "4", None, None]) == "4"
    assert majority_vote(["7", "5", "5", "7"]) == "7" and majority_vote(["5", "7", "7", "5"]) == "5"
    assert majority_vote([None, None]) is None and majority_vote([]) is None


def test_votes_of_groups_answers_in_order():
    votes, abstain = votes_of(["b", None, "a", "b", "a", "b"], [False, False, True, False, True, False])
    assert votes == [Vote("b", 3, False), Vote("a", 2, True)] and abstain == 1


def test_default_k():
    assert default_k(1) == [1] and default_k(16) == [1, 2, 4, 8, 16] and default_k(12) == [1, 2, 4, 8, 12]


# --------------------------------------------------------------------------- the tasks' answers


def test_arithmetic_answer_of_agrees_with_is_correct():
    from tinyrl.tasks import get_task

    task, row = get_task("arithmetic"), {"answer": "85"}
    for c in ("85", "85\n", " 85", "085", "8 5", "75", "85\n\n", ""):
        assert (task.answer_of(c, row) == "85") == task.is_correct(c, row), c
    assert task.answer_of("85\n", row) == task.answer_of("85", row) and task.answer_of("", row) is None


def test_gsm8k_answer_of_votes_by_value():
    from tinyrl.tasks import get_task

    task = get_task("gsm8k")
    row = {"question": "How many?", "answer": "3 + 15 = 18\n#### 18", "gold": "18"}
    same = ["so \\boxed{18}", "#### 18.0", "The answer is 18.", "<answer>18</answer>"]
    assert {task.answer_of(c, row) for c in same} == {"18"}
    assert task.is_correct("so \\boxed{18}", row) and not task.is_correct("\\boxed{17}", row)
    assert task.answer_of("\\boxed{17}", row) == "17"
    assert task.answer_of("I think 18", row) is None  # strict: no marked answer, no vote (and not correct)
    assert task.answer_of("\\boxed{3} or \\boxed{4}", row) is None


def test_search_qa_answer_of_is_the_normalised_em_answer():
    from tinyrl.tasks import get_task

    task, row = get_task("search_qa"), {"golden_answers": ["Kelmora"]}
    a, b = "<answer> The Kelmora. </answer>", "<search>x</search><answer>kelmora</answer>"
    assert task.answer_of(a, row) == task.answer_of(b, row) == "kelmora"
    assert task.is_correct(a, row) and task.is_correct(b, row)
    assert task.answer_of("no tag", row) is None and get_task("gaia").answer_of is None


# --------------------------------------------------------------------------- a real tiny model


@pytest.fixture(scope="module")
def arith():
    """The shipped tiny-arith model behind the HF engine, 8 held-out sums, as tinyrl.evaluate sets it up."""
    from tinyrl.config import resolve
    from tinyrl.data import load_rows
    from tinyrl.methods.common import render_rows, sampling_params
    from tinyrl.model import load_policy
    from tinyrl.rollout.engines import make_engine, prompt_renderer

    cfg = resolve("tiny_grpo_cpu", overrides={"data.num_eval": 8}, decide_auto=False).cfg
    model, tok = load_policy(cfg.model, cfg.lora)
    _, rows, task = load_rows(cfg.data)
    engine = make_engine("hf", model, tok, cfg, seed=0, task=task)
    render_rows(rows, prompt_renderer(cfg, tok, task, engine))
    return SimpleNamespace(engine=engine, rows=rows, task=task, params=sampling_params(cfg, task))


def test_real_run_pass_at_k_is_the_formula_on_its_own_counts(arith):
    from tinyrl.evaluation import evaluate_sampled

    got = evaluate_sampled(arith.engine, arith.rows, arith.task, arith.params, samples=8, k=[1, 2, 4])
    counts = [p["correct"] for p in got.problems]
    assert len(counts) == 8 and any(0 < c < 8 for c in counts)  # not degenerate: k matters
    for k in (1, 2, 4):
        assert got.pass_at_k[k] == pytest.approx(sum(comb_pass_at_k(8, c, k) for c in counts) / 8, abs=1e-12)
    assert got.pass_at_k[1] == pytest.approx(sum(counts) / 64)
    assert got.pass_at_k[1] <= got.pass_at_k[2] <= got.pass_at_k[4]
    assert got.pass_at_k[1] < got.pass_at_k[4]
    for p in got.problems:  # the votes account for every sample, and the right answer's votes are the correct ones
        assert sum(v[1] for v in p["votes"]) + p["abstain"] == 8
        assert sum(v[1] for v in p["votes"] if v[2]) == p["correct"]
    assert got.maj_at_k[1] == pytest.approx(got.pass_at_k[1])  # one sample's vote is that sample
    for k in (2, 4):
        per = [maj_at_k([Vote(*v) for v in p["votes"]], p["abstain"], k) for p in got.problems]
        assert got.maj_at_k[k] == pytest.approx(sum(per) / 8)
    assert "  pass@4: " in "\n".join(got.lines())


def test_sampling_is_seeded_per_prompt_whatever_the_batching(arith):
    from tinyrl.evaluation import sample_problems

    hot, rows = dataclasses.replace(arith.params, temperature=1.0), arith.rows[:4]
    whole = sample_problems(arith.engine, rows, arith.task, hot, 8)  # the 4 prompts in one call
    pairs = sample_problems(arith.engine, rows, arith.task, hot, 8, batch_size=16)  # two per call
    tail = sample_problems(arith.engine, rows[2:], arith.task, hot, 8, first=2)  # a rank's share
    assert whole == pairs and whole[2:] == tail
    other = sample_problems(arith.engine, rows[2:], arith.task, hot, 8, first=0)  # other streams
    assert [p["votes"] for p in other] != [p["votes"] for p in tail]


def test_a_task_without_answer_of_reports_pass_at_k_and_says_why_maj_is_left_out(arith):
    from tinyrl.evaluation import evaluate_sampled

    plain = dataclasses.replace(arith.task, name="no-votes", answer_of=None)
    with_votes = evaluate_sampled(arith.engine, arith.rows, arith.task, arith.params, 4, [1, 4])
    got = evaluate_sampled(arith.engine, arith.rows, plain, arith.params, 4, [1, 4])
    assert got.pass_at_k == with_votes.pass_at_k and got.maj_at_k == {}
    assert "no-votes" in got.maj_note and "answer_of" in got.maj_note
    assert any(line.startswith("  maj@k left out") for line in got.lines())
    assert got.to_dict()["maj@k"] is None


def test_k_above_samples_names_the_samples_setting(arith):
    from tinyrl.evaluation import evaluate_sampled

    with pytest.raises(ConfigError, match=r"--samples=4: k=8"):
        evaluate_sampled(arith.engine, arith.rows, arith.task, arith.params, 4, [1, 8])
    with pytest.raises(ConfigError, match="temperature"):
        evaluate_sampled(arith.engine, arith.rows, arith.task, arith.params, 4, [1], temperature=0.0)


# --------------------------------------------------------------------------- API, trainer, CLI


def test_config_checks_the_eval_fields():
    from tinyrl.config import resolve

    def bad(**over):
        with pytest.raises(ConfigError) as e:
            resolve("tiny_grpo_cpu", overrides=over, decide_auto=False)
        return str(e.value)

    assert "train.eval_k" in bad(**{"train.eval_samples": 4, "train.eval_k": [1, 8]})
    assert "train.eval_samples" in bad(**{"train.eval_samples": -1})
    assert "train.eval_temperature" in bad(**{"train.eval_temperature": 0.0})
    assert "train.eval_before_after" in bad(**{"train.eval_samples": 4, "train.eval_before_after": False})
    assert "train.eval_k" in bad(**{"train.eval_k": 4})  # a list is expected
    cfg = resolve("tiny_grpo_cpu", overrides={"train.eval_samples": 8}, decide_auto=False).cfg
    assert cfg.train.eval_k == [] and cfg.train.eval_temperature is None  # defaults: 1 2 4 8, rollout's


def test_bad_eval_flags_fail_before_the_model_loads(capsys):
    from tinyrl import cli

    assert cli.main(["eval", "tiny_grpo_cpu", "--samples", "4", "--k", "1", "8"]) == 2
    err = capsys.readouterr().err
    assert "--samples=4" in err and "k=8" in err and "Traceback" not in err
    assert cli.main(["eval", "tiny_grpo_cpu", "--k", "2"]) == 2
    assert "--samples" in capsys.readouterr().err
    import tinyrl

    with pytest.raises(ConfigError, match="samples=2: k=4"):
        tinyrl.evaluate("tiny_grpo_cpu", samples=2, k=[4])


@pytest.mark.slow
def test_trainer_api_and_cli_report_the_same_pass_at_k(tmp_path):
    import tinyrl

    run = tinyrl.train("tiny_grpo_cpu", **{
        "log.run_dir": str(tmp_path), "log.name": "r", "log.progress": False, "train.steps": 1,
        "train.prompts_per_step": 2, "rollout.num_generations": 4, "train.micro_batch_size": 8,
        "data.num_eval": 4, "train.eval_samples": 4, "train.eval_k": [1, 2, 4]})
    sampled = json.loads((run.path / "summary.json").read_text())["details"]["eval_sampled"]
    for when in ("before", "after"):
        e = sampled[when]
        assert e["samples"] == 4 and len(e["correct"]) == 4
        for k in (1, 2, 4):  # the trainer's figure is the formula on its own per-prompt counts
            assert e["pass@k"][str(k)] == pytest.approx(sum(comb_pass_at_k(4, c, k) for c in e["correct"]) / 4)
    report = (run.path / "report.txt").read_text()
    assert "held-out pass@k / maj@k (4 samples per prompt" in report and "  after   pass@1 " in report

    # the API on the saved adapter: the same prompts draw the same samples from the same weights
    res = tinyrl.evaluate("tiny_grpo_cpu", adapter=run.path, samples=4, k=[1, 2, 4], **{"data.num_eval": 4})
    assert {str(k): v for k, v in res.sampled.pass_at_k.items()} == pytest.approx(sampled["after"]["pass@k"])
    assert res.path.parent == run.path and res.path.name.startswith("eval-")
    written = json.loads(res.path.read_text())
    assert written["sampled"]["pass@k"] == pytest.approx(sampled["after"]["pass@k"])
    assert [p["correct"] for p in written["sampled"]["problems"]] == sampled["after"]["correct"]

    out = subprocess.run([sys.executable, "-m", "tinyrl.cli", "eval", "tiny_grpo_cpu", "--adapter", str(run.path),
                          "--samples", "4", "--k", "1", "2", "4", "data.num_eval=4"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    shown = dict(re.findall(r"pass@(\d+):\s+([\d.]+)%", out.stdout))
    assert set(shown) == {"1", "2", "4"}
    for k, v in shown.items():
        assert float(v) == pytest.approx(100 * sampled["after"]["pass@k"][k], abs=0.051)
    assert "maj@4:" in out.stdout and "sampled: 4 per prompt at temperature 1" in out.stdout
    assert len(list(run.path.glob("eval-*.json"))) == 2  # the API's and the CLI's, neither overwritten
