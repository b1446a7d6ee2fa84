"""pass@k and maj@k of n sampled completions per problem: the estimators, pure Python.

- `pass_at_k(n, c, k)`: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
  Models Trained on Code"): the chance that at least one of k samples drawn without replacement
  from the n is correct, 1 - C(n-c, k) / C(n, k), computed in the numerically stable product form
  1 - prod_{i=n-c+1}^{n} (1 - k/i).
- `maj_at_k(votes, abstain, k)`: majority voting (self-consistency, Wang et al. 2022) scored the
  same way: the exact mean, over all C(n, k) subsets of k of the n samples, of whether the subset's
  majority answer is correct. A tie between the top answers counts (correct ones among them) /
  (number tied): the expectation of a uniformly random tie-break, so the figure itself is
  deterministic. Samples without an extractable answer abstain (they never win a vote). No
  bootstrap and no Monte Carlo: the count of winning subsets is summed exactly with generating
  polynomials, so maj@k at k = n is the vote over all n samples and k = 1 equals pass@1.
- `majority_vote(answers)`: the vote of one concrete list of answers (the most frequent; a tie goes
  to the answer seen first), e.g. the answer a problem's n samples agree on.

A problem's answers are `Vote`s: a distinct (task-normalised) answer, how many samples gave it, and
whether it is correct. Everything here is exact integer arithmetic until the final division.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Vote:
    answer: str
    count: int  # samples that gave this answer
    correct: bool  # the task's verifier accepts it


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with c correct samples among n (Chen et al. 2021).

    >>> [round(pass_at_k(5, 2, k), 10) for k in (1, 2, 3, 4)]  # 1 - C(3,k)/C(5,k)
    [0.4, 0.7, 0.9, 1.0]
    >>> pass_at_k(5, 0, 3), pass_at_k(5, 5, 1)
    (0.0, 1.0)
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: correct samples c={c} must be in 0..n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k={k} must be in 1..n={n} (k samples out of the n drawn)")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: list[tuple[int, int]], k: int) -> float:
    """pass@k averaged over problems, each given as (n, c)."""
    if not counts:
        return float("nan")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def majority_vote(answers: list[str | None]) -> str | None:
    """The most frequent answer (None: no answer, never voted for); a tie goes to the answer seen first.

    >>> majority_vote(["3", "4", "4", None, None, None]), majority_vote(["7", "5", "5", "7"])
    ('4', '7')
    >>> majority_vote([None, None]) is None
    True
    """
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == top)


def votes_of(answers: list[str | None], correct: list[bool]) -> tuple[list[Vote], int]:
    """(one Vote per distinct answer in order of first appearance, abstentions) of one problem's samples.

    An answer counts as correct when the verifier accepted any sample that gave it (samples with the
    same normalised answer share a verdict, unless a check of one of them failed or timed out).

    >>> votes_of(["4", None, "4", "5"], [True, False, True, False])
    ([Vote(answer='4', count=2, correct=True), Vote(answer='5', count=1, correct=False)], 1)
    """
    count: dict[str, int] = {}
    ok: dict[str, bool] = {}
    for a, c in zip(answers, correct, strict=True):
        if a is not None:
            count[a] = count.get(a, 0) + 1
            ok[a] = ok.get(a, False) or bool(c)
    return [Vote(a, count[a], ok[a]) for a in count], sum(a is None for a in answers)


def _mul(p: list[list[int]], q: list[list[int]], max_x: int) -> list[list[int]]:
    """Product of two polynomials in x and y (p[i][j]: coefficient of x^i y^j), x-degree cut at max_x."""
    out = [[0] * (len(p[0]) + len(q[0]) - 1) for _ in range(min(len(p) + len(q) - 1, max_x + 1))]
    for i, row in enumerate(p):
        for j, a in enumerate(row):
            if a:
                for i2 in range(min(len(q), max_x + 1 - i)):
                    for j2, b in enumerate(q[i2]):
                        if b:
                            out[i + i2][j + j2] += a * b
    return out


def _wins(votes: list[Vote], abstain: int, k: int, g: int) -> float:
    """Sum over the k-subsets where answer g has the most votes of 1/(answers tied with it): the
    subsets' share of g's wins, times C(n, k)."""
    total = 0.0
    for t in range(1, min(votes[g].count, k) + 1):  # g gets t votes in the subset
        # others: fewer than t votes (x^j), or exactly t (x^t y: a tie); abstentions: any number
        poly = [[math.comb(abstain, j)] for j in range(min(abstain, k - t) + 1)]
        for h, v in enumerate(votes):
            if h != g:
                other = [[math.comb(v.count, j), 0] for j in range(min(v.count, t - 1) + 1)]
                if v.count >= t:
                    other.append([0, math.comb(v.count, t)])
                poly = _mul(poly, other, k - t)
        if k - t < len(poly):  # subsets whose other k - t samples fall as this term says
            total += math.comb(votes[g].count, t) * sum(w / (r + 1) for r, w in enumerate(poly[k - t]))
    return total


def maj_at_k(votes: list[Vote], abstain: int, k: int) -> float:
    """Majority-vote accuracy of k samples out of one problem's n, exactly averaged over all k-subsets.

    >>> maj_at_k([Vote("4", 3, True), Vote("5", 2, False)], 0, 5)  # the vote of all 5: "4" wins
    1.0
    >>> maj_at_k([Vote("4", 1, True), Vote("5", 1, False)], 0, 2)  # a 1-1 tie: half credit
    0.5
    >>> maj_at_k([Vote("4", 2, True)], 3, 1)  # k = 1: pass@1 (abstentions are wrong)
    0.4
    """
    n = sum(v.count for v in votes) + abstain
    if not 1 <= k <= n:
        raise ValueError(f"maj_at_k: k={k} must be in 1..n={n} (k samples out of the n drawn)")
    wins = sum(_wins(votes, abstain, k, g) for g, v in enumerate(votes) if v.correct)
    return wins / math.comb(n, k)


def default_k(samples: int) -> list[int]:
    """The k reported when none is asked for: 1, 2, 4, ... up to `samples`, and `samples` itself.

    >>> default_k(8), default_k(10), default_k(1)
    ([1, 2, 4, 8], [1, 2, 4, 8, 10], [1])
    """
    if samples < 1:
        raise ValueError(f"default_k: samples must be >= 1, got {samples}")
    ks = [1 << i for i in range(samples.bit_length()) if 1 << i <= samples]
    return ks if ks[-1] == samples else ks + [samples]
