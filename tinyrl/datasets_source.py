"""Load the splits of a dataset from anywhere through `datasets`: a hub id or a local file or folder.

`data.dataset` (and the gsm8k task's `data.task_args.dataset`) names one of

- a local file: `.jsonl` / `.json`, `.parquet`, `.csv` (one split, `train`);
- a local folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`;
- any other local folder `datasets.load_dataset` reads (data files, a `data/` folder, a README
  with `configs:`, a folder `hf download <id> --repo-type dataset --local-dir <folder>` filled);
- a hub id (`openai/gsm8k`), with `data.config` its configuration. With `HF_HUB_OFFLINE=1` it
  loads from the local caches: the `datasets` cache of an earlier run, else the hub cache that
  `hf download <id> --repo-type dataset` fills.

`data.split` / `data.eval_split` name a split or `datasets`' slices of splits (`train[:10%]`, `train[10:20]`,
`train[:50%]+test[:10]`): `select_split` applies them with `datasets.ReadInstruction`.

Every failure is a ConfigError that names the field (`data.dataset`, `data.config`, `data.split`)
and what exists instead. `datasets` is optional: `pip install 'tinyrl-rlvr[data]'`.
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from typing import Any

from tinyrl.errors import ConfigError

# file suffix -> the `datasets` builder that reads it
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk writes at a folder's top
MISSING = "data.dataset needs the `datasets` library: pip install 'tinyrl-rlvr[data]'"


class MissingDatasetsError(ConfigError, ImportError):
    """`datasets` is not installed: an ImportError, and a ConfigError (the CLI's one clear paragraph)."""


def require_datasets():
    """The `datasets` module, or a MissingDatasetsError naming the extra to install."""
    try:
        return importlib.import_module("datasets")
    except ImportError as e:
        raise MissingDatasetsError(MISSING) from e


def looks_local(source: str) -> bool:
    """Whether `source` names a local file or folder rather than a hub id (`owner/name`).

    >>> [looks_local(s) for s in ("openai/gsm8k", "./d", "/tmp/x", "~/d", "d.jsonl", "a/b/c")]
    [False, True, True, True, True, True]
    """
    return (Path(source).expanduser().exists() or source.startswith((".", "/", "~"))
            or Path(source).suffix.lower() in FILE_BUILDERS or source.count("/") > 1)


def hub_command(source: str) -> str:
    """The command that puts a hub dataset in the local cache (huggingface_hub's `hf` CLI)."""
    return f"hf download {source} --repo-type dataset"


def load_splits(source: str, config: str | None, splits: list[str] | None, field: str = "data") -> dict[str, Any]:
    """{split: datasets.Dataset} for each of `splits` of `source` (None: every split it has). `field` prefixes
    the config fields an error names (`data` -> `data.dataset`, `data.config`, `data.split`)."""
    datasets = require_datasets()
    loaded = _load(datasets, source, config, field)
    if not isinstance(loaded, dict):  # save_to_disk of a single Dataset: one split
        loaded = {"train": loaded}
    if splits is None:
        return dict(loaded)
    return {spec: select_split(datasets, loaded, spec, name, source)
            for spec, name in zip(splits, _split_fields(field, len(splits)))}


def select_split(datasets, loaded: dict, spec: str, field: str, source: str):
    """The rows `spec` names of the `loaded` splits: a split (`train`) or `datasets`' slices of splits
    (`train[:10%]`, `train[10:20]`, `train[:50%]+test[:10]`), read by `datasets.ReadInstruction` itself.
    ConfigError naming `field` for an unknown split, a bad slice, or a slice that selects no row here."""
    if spec in loaded:
        return loaded[spec]
    try:
        parts = datasets.ReadInstruction.from_spec(spec).to_absolute({k: len(v) for k, v in loaded.items()})
    except (ValueError, AssertionError, KeyError) as e:
        unknown = "Unknown split" in str(e)
        raise ConfigError(f"{field}: {source!r} has no split named in {spec!r}; its splits: {sorted(loaded)}" if unknown
                          else f"{field}: {spec!r} is not a slice of {source!r}'s splits ({e})") from None
    picked = []
    for a in parts:
        n = len(loaded[a.splitname])
        if a.to <= a.from_:
            raise ConfigError(f"{field}: {spec!r} selects no rows of split {a.splitname!r} ({n} rows: "
                              f"from {a.from_} to {a.to})")
        picked.append(loaded[a.splitname].select(range(a.from_, a.to)))
    if len(picked) == 1:
        return picked[0]
    try:
        return datasets.concatenate_datasets(picked)
    except ValueError as e:  # splits whose columns or types differ
        raise ConfigError(f"{field}: {spec!r} joins splits of {source!r} whose columns differ ({e})") from None


def _split_fields(field: str, n: int) -> list[str]:
    return [f"{field}.split", f"{field}.eval_split"][:n]


def _load(datasets, source: str, config: str | None, field: str):
    path = Path(source).expanduser()
    if looks_local(source):
        if not path.exists():
            raise ConfigError(f"{field}.dataset: file or folder not found: {source} (a hub id is 'owner/name')")
        if not (path.is_file() or path.is_dir()):
            raise ConfigError(f"{field}.dataset: {source} is not a regular file or folder (a pipe, a device or a "
                              f"socket would be read forever)")
        if path.is_file() and path.stat().st_size == 0:
            raise ConfigError(f"{field}.dataset: {source} is empty (0 bytes): no rows to read")
        if path.is_file():
            builder = FILE_BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise ConfigError(f"{field}.dataset: {source}: a file must be one of {sorted(FILE_BUILDERS)}, "
                                  f"got {path.suffix or 'no suffix'!r} (or give a folder or a hub id)")
            if config is not None:
                raise ConfigError(f"{field}.config: a single file has no configurations; set it to null "
                                  f"(got {config!r})")
            return _call(datasets.load_dataset, field, source, builder, data_files=str(path))
        if any((path / m).is_file() for m in SAVED_MARKERS):
            return _call(datasets.load_from_disk, field, source, str(path))
        return _call(datasets.load_dataset, field, source, str(path), config)
    try:
        with _hub_offline_as_now(datasets):
            return _call(datasets.load_dataset, field, source, source, config)
    except ConnectionError as e:  # offline or unreachable: the snapshot `hf download` left in the hub cache
        snapshot = _cached_snapshot(source)
        if snapshot is None:
            raise ConfigError(f"{field}.dataset: cannot load {source!r} from the hub ({e}) and it is not in the "
                              f"local cache. Download it once with `{hub_command(source)}` (then "
                              f"HF_HUB_OFFLINE=1 runs read the cache), or give a local file or folder") from None
        return _call(datasets.load_dataset, field, source, snapshot, config)


@contextlib.contextmanager
def _hub_offline_as_now(datasets):
    """`datasets` offline exactly when huggingface_hub is now. Each reads HF_HUB_OFFLINE once, at import;
    a caller that turns huggingface_hub offline for a while (the planner: plans never download) turns
    `datasets` offline with it, instead of letting it retry an unreachable hub."""
    from huggingface_hub import constants

    old = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = bool(old or constants.HF_HUB_OFFLINE)  # HF_DATASETS_OFFLINE=1 stays
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = old


def _cached_snapshot(source: str) -> str | None:
    from huggingface_hub import snapshot_download  # a dependency of `datasets`

    try:
        return snapshot_download(source, repo_type="dataset", local_files_only=True)
    except Exception:  # noqa: BLE001 - LocalEntryNotFoundError and its kin: nothing cached
        return None


def _call(fn, field: str, source: str, *args, **kwargs):
    """`fn(*args, **kwargs)`, its errors turned into ConfigErrors naming the field at fault."""
    datasets = require_datasets()
    try:
        return fn(*args, **kwargs)
    except ConnectionError:
        raise
    except ValueError as e:
        msg = str(e)
        if "BuilderConfig" in msg or "Config name is missing" in msg:
            raise ConfigError(f"{field}.config: {source!r}: {msg}") from None
        raise ConfigError(f"{field}.dataset: cannot load {source!r}: {msg}") from None
    except (FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as e:
        raise ConfigError(f"{field}.dataset: cannot load {source!r}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a malformed file: name it instead of a deep parser traceback
        if type(e).__module__.startswith(("datasets", "pyarrow", "json")):
            raise ConfigError(f"{field}.dataset: cannot read {source!r}: {type(e).__name__}: {e}") from None
        raise


def take_rows(ds, indices: list[int]) -> list[dict]:
    """Rows `indices` of a `datasets.Dataset` as plain dicts."""
    return ds.select(indices).to_list() if indices else []
