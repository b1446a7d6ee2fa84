"""`data.mix`: the rows of several datasets, interleaved by weight through `datasets.interleave_datasets`.

    data:
      mix:
        - {dataset: openai/gsm8k, config: main, weight: 3, columns: {prompt: question}, answer_extractor: gsm8k}
        - {dataset: ./competition.jsonl, weight: 1, split: "train[:50%]", prompt_template: "{problem}",
           columns: {answer: solution}, answer_extractor: boxed}
      mix_stopping: first_exhausted     # or all_exhausted

Each source is read as `data.dataset` reads one (tinyrl.tasks.dataset.dataset_rows, its own columns, template,
answer extractor, split and held-out split; errors name `data.mix[i].<field>`), up to data.num_train rows each.
The training order is `datasets.interleave_datasets` over the sources' row indices: probabilities the weights over
their sum, seeded by data.seed, and its stopping strategy (first_exhausted: the mixture ends when a source runs out;
all_exhausted: when every source has been seen whole, the shorter ones drawn again), cut at data.num_train.
The held-out rows are each source's own, data.num_eval shared by weight, so the held-out accuracy covers every source.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

from tinyrl.datasets_source import require_datasets
from tinyrl.errors import ConfigError
from tinyrl.tasks.dataset import dataset_rows

log = logging.getLogger("tinyrl.data")


def source_view(cfg_data, src, num_eval: int):
    """One mix source as the data section `dataset_rows` reads: the source's own fields, the section's others."""
    return SimpleNamespace(dataset=src.dataset, config=src.config, split=src.split, eval_split=src.eval_split,
                           columns=src.columns, prompt_template=src.prompt_template,
                           answer_extractor=src.answer_extractor, prompt_column=cfg_data.prompt_column,
                           num_train=cfg_data.num_train, num_eval=num_eval, seed=cfg_data.seed,
                           eval_fraction=cfg_data.eval_fraction)


def eval_shares(num_eval: int, weights: list[float]) -> list[int]:
    """data.num_eval shared by weight (largest remainders), at least 1 a source when there are enough.

    >>> eval_shares(10, [3, 1]), eval_shares(2, [1, 1, 1]), eval_shares(0, [1, 2])
    ([8, 2], [1, 1, 0], [0, 0])
    """
    if num_eval == 0:
        return [0] * len(weights)
    total = sum(weights)
    exact = [num_eval * w / total for w in weights]
    out = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: exact[i] - out[i], reverse=True)[:num_eval - sum(out)]:
        out[i] += 1
    for i in range(len(out)):  # a source with no share gets one from the largest, while that keeps one
        if out[i] == 0 and max(out) > 1:
            out[out.index(max(out))] -= 1
            out[i] = 1
    return out


def interleaved_order(sizes: list[int], weights: list[float], seed: int, stopping: str, limit: int) -> list[tuple]:
    """(source, row) pairs in the mixture's order: `datasets.interleave_datasets` over each source's row indices,
    with probabilities weights / sum, `seed` and `stopping`, cut at `limit`."""
    datasets = require_datasets()
    parts = [datasets.Dataset.from_dict({"source": [k] * n, "row": list(range(n))}) for k, n in enumerate(sizes)]
    total = sum(weights)
    mixed = datasets.interleave_datasets(parts, probabilities=[w / total for w in weights], seed=seed,
                                         stopping_strategy=stopping)
    mixed = mixed.select(range(min(limit, len(mixed))))
    return list(zip(mixed["source"], mixed["row"]))


def mix_rows(cfg_data) -> tuple[list[dict], list[dict], object | None]:
    """(train rows, held-out rows, the verifier task or None) of `data.mix` (see the module docstring)."""
    sources, weights = cfg_data.mix, [s.weight for s in cfg_data.mix]
    trains, helds, tasks = [], [], []
    for i, (src, n_eval) in enumerate(zip(sources, eval_shares(cfg_data.num_eval, weights))):
        train, held, task = dataset_rows(source_view(cfg_data, src, n_eval), field=f"data.mix[{i}]")
        trains.append(train)
        helds.append(held)
        tasks.append(task)
    verified = [t is not None for t in tasks]
    if any(verified) and not all(verified):
        i = verified.index(False)
        raise ConfigError(f"data.mix[{i}].columns.answer: {sources[i].dataset!r} has no answer column, while "
                          f"data.mix[{verified.index(True)}] has: every source of a mix gives gold answers (verified), "
                          f"or none does (rewards from your functions); set data.mix[{i}].columns.answer")
    order = interleaved_order([len(t) for t in trains], weights, cfg_data.seed, cfg_data.mix_stopping,
                              cfg_data.num_train)
    train = [trains[k][j] for k, j in order]
    counts = [sum(1 for k, _ in order if k == i) for i in range(len(sources))]
    log.info("data.mix (%s, seed %d): %d training rows: %s; %d held out", cfg_data.mix_stopping, cfg_data.seed,
             len(train), ", ".join(f"{s.dataset} {c}" for s, c in zip(sources, counts)), sum(map(len, helds)))
    return train, [r for h in helds for r in h], tasks[0]
