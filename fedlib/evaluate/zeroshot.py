"""Zero-shot accuracy through EleutherAI's lm-evaluation-harness, online or offline.

The seven tasks of the FedPrLLM / FedSpaLLM / Wanda / SparseGPT tables are scored
with lm-eval's own machinery (``HFLM`` + ``simple_evaluate``) on a model that is
already pruned in memory; nothing is written to disk.

* **Online** (``data_dir=None``): lm-eval's stock tasks (``boolq``, ``rte``, ...)
  are loaded from the Hugging Face hub as usual.
* **Offline** (``data_dir`` given): the same tasks are defined on the local files
  ``<data_dir>/zeroshot/<task>.jsonl`` under the names ``fedlib_<task>``.  The
  definitions below copy the stock ones field by field -- prompt (``doc_to_text``),
  target, choices, ``process_docs``, ``output_type`` and metrics -- and reuse
  lm-eval's own helper functions (HellaSwag, WinoGrande) by import, so the
  requests sent to the model are identical to the stock tasks'.  The only
  difference is where the rows come from, plus one schema adapter: the local
  BoolQ file is ``google/boolq`` (``answer``: bool), while lm-eval's ``boolq``
  reads ``super_glue/boolq`` (``label``: 0/1); :func:`boolq_process_docs` adds
  ``label = int(answer)``.  ``tests/test_zeroshot.py`` checks the equivalence
  against the stock YAMLs of the installed lm-eval.

Splits scored (as in the stock tasks): BoolQ, RTE, HellaSwag, WinoGrande
validation; ARC-Easy, ARC-Challenge, OpenBookQA test.

Public API: :data:`ZEROSHOT_TASKS`, :func:`evaluate_zeroshot`,
:func:`run_harness` (raw lm-eval output), :func:`summarize`, :func:`sample_lines`
(``--log-samples``), :func:`table_metric`, :func:`mean_standard_error`,
:func:`paired_difference`, :func:`local_task_config`,
:func:`task_file`, :func:`load_local_jsonl`, :data:`STOCK_TASK_YAML`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

ZEROSHOT_TASKS: tuple[str, ...] = (
    "boolq",
    "rte",
    "hellaswag",
    "winogrande",
    "arc_easy",
    "arc_challenge",
    "openbookqa",
)

#: Prefix of the offline task names (stock names would make lm-eval go to the hub).
LOCAL_PREFIX = "fedlib_"

#: The stock lm-eval task definition each offline task mirrors
#: (relative to the installed ``lm_eval/tasks`` directory).
STOCK_TASK_YAML: dict[str, str] = {
    "boolq": "super_glue/boolq/default.yaml",
    "rte": "glue/rte/default.yaml",
    "hellaswag": "hellaswag/hellaswag.yaml",
    "winogrande": "winogrande/default.yaml",
    "arc_easy": "arc/arc_easy.yaml",
    "arc_challenge": "arc/arc_challenge.yaml",
    "openbookqa": "openbookqa/openbookqa.yaml",
}

# Which split of the stock task is scored, i.e. which split the local file holds.
_SPLIT = {
    "boolq": "validation",
    "rte": "validation",
    "hellaswag": "validation",
    "winogrande": "validation",
    "arc_easy": "test",
    "arc_challenge": "test",
    "openbookqa": "test",
}

_ACC = {"metric": "acc", "aggregation": "mean", "higher_is_better": True}
_ACC_NORM = {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}

# The metrics each stock task defines (its metric_list): acc_norm (log-likelihood per byte of
# the choice's characters) only where the answer choices differ in length: HellaSwag, ARC, OpenBookQA.
_METRICS: dict[str, list[dict[str, Any]]] = {
    task: [_ACC, _ACC_NORM] if task in ("hellaswag", "arc_easy", "arc_challenge", "openbookqa") else [_ACC]
    for task in ZEROSHOT_TASKS
}


def table_metric(task: str) -> str:
    """The metric the tables show for ``task``: ``acc_norm`` where lm-eval defines it, else ``acc``."""
    return _METRICS[task][-1]["metric"]


def boolq_process_docs(dataset):
    """Map the local ``google/boolq`` rows to the ``super_glue/boolq`` schema.

    Adds ``label = int(answer)`` (False -> 0 = "no", True -> 1 = "yes"), which is
    what the stock task's ``doc_to_target: label`` reads.  Rows that already have
    a ``label`` (super_glue schema) are left as they are.
    """
    if "label" in dataset.column_names:
        return dataset
    return dataset.map(lambda doc: {"label": int(doc["answer"])})


class _SameSplitCache:
    """Wrap a ``process_docs`` so that repeated calls on the same split run it once.

    lm-eval calls ``process_docs`` on the scored split up to five times per run
    (``eval_docs`` is a property); for HellaSwag on an in-memory dataset that is
    ~1 s each.  Results are keyed by the dataset's fingerprint (datasets are
    immutable; every transform gives a new fingerprint).  ``__wrapped__`` is the
    original function.
    """

    def __init__(self, fn, maxsize: int = 2):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._maxsize = maxsize
        self._cache: dict[str, Any] = {}

    def __call__(self, dataset):
        key = getattr(dataset, "_fingerprint", None)
        if key is None:
            return self._fn(dataset)
        if key not in self._cache:
            if len(self._cache) >= self._maxsize:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = self._fn(dataset)
        return self._cache[key]


def load_local_jsonl(data_files: dict[str, str], **_ignored):
    """``custom_dataset`` loader of the offline tasks: ``{split: path}`` -> in-memory DatasetDict.

    Rows are kept in file order.  In memory on purpose: through the ``json`` builder
    every evaluation would write Arrow caches under ``~/.cache/huggingface`` (and
    HellaSwag's ``process_docs`` map a new ~19 MB cache file per call).  lm-eval
    passes the task metadata as extra keyword arguments; they are ignored.
    """
    import json

    import datasets

    out = {}
    for split, path in data_files.items():
        with open(path, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        if not rows:
            raise ValueError(f"local zero-shot file {path} has no rows")
        out[split] = datasets.Dataset.from_list(rows)
    return datasets.DatasetDict(out)


def _task_body(task: str) -> dict[str, Any]:
    """Prompt/target/choice/metric fields of a task, copied from the stock YAML."""
    # Imported lazily: lm_eval is heavy and only needed when evaluating.
    from lm_eval.tasks.hellaswag import utils as hellaswag_utils
    from lm_eval.tasks.winogrande import preprocess_winogrande as winogrande_utils

    arc = {
        "output_type": "multiple_choice",
        "doc_to_text": "Question: {{question}}\nAnswer:",
        "doc_to_target": "{{choices.label.index(answerKey)}}",
        "doc_to_choice": "{{choices.text}}",
        "metric_list": _METRICS["arc_easy"],
        "metadata": {"version": 1.0},
    }
    bodies: dict[str, dict[str, Any]] = {
        # super_glue/boolq/default.yaml
        "boolq": {
            "output_type": "multiple_choice",
            "process_docs": _SameSplitCache(boolq_process_docs),
            "doc_to_text": "{{passage}}\nQuestion: {{question}}?\nAnswer:",
            "doc_to_target": "label",
            "doc_to_choice": ["no", "yes"],
            "metric_list": _METRICS["boolq"],
            "metadata": {"version": 2.0},
        },
        # glue/rte/default.yaml
        "rte": {
            "output_type": "multiple_choice",
            "doc_to_text": "{{sentence1}}\nQuestion: {{sentence2}} True or False?\nAnswer:",
            "doc_to_target": "label",
            "doc_to_choice": ["True", "False"],
            "metric_list": _METRICS["rte"],
            "metadata": {"version": 1.0},
        },
        # hellaswag/hellaswag.yaml
        "hellaswag": {
            "output_type": "multiple_choice",
            "process_docs": _SameSplitCache(hellaswag_utils.process_docs),
            "doc_to_text": "{{query}}",
            "doc_to_target": "{{label}}",
            "doc_to_choice": "choices",
            "metric_list": _METRICS["hellaswag"],
            "metadata": {"version": 1.0},
        },
        # winogrande/default.yaml (partial evaluation: the choices are contexts)
        "winogrande": {
            "output_type": "multiple_choice",
            "doc_to_text": winogrande_utils.doc_to_text,
            "doc_to_target": winogrande_utils.doc_to_target,
            "doc_to_choice": winogrande_utils.doc_to_choice,
            "metric_list": _METRICS["winogrande"],
            "metadata": {"version": 1.0},
        },
        # arc/arc_easy.yaml, arc/arc_challenge.yaml (include: arc_easy.yaml)
        "arc_easy": dict(arc),
        "arc_challenge": dict(arc),
        # openbookqa/openbookqa.yaml
        "openbookqa": {
            "output_type": "multiple_choice",
            "doc_to_text": "question_stem",
            "doc_to_target": "{{choices.label.index(answerKey.lstrip())}}",
            "doc_to_choice": "{{choices.text}}",
            "metric_list": _METRICS["openbookqa"],
            "metadata": {"version": 1.0},
        },
    }
    return bodies[task]


def _check_tasks(tasks: Iterable[str]) -> list[str]:
    if isinstance(tasks, str):
        tasks = [tasks]
    tasks = list(tasks)
    if not tasks:
        raise ValueError("no zero-shot task given; choose from " + ", ".join(ZEROSHOT_TASKS))
    unknown = [t for t in tasks if t not in ZEROSHOT_TASKS]
    if unknown:
        raise ValueError(
            f"unknown zero-shot task(s) {unknown}; choose from {', '.join(ZEROSHOT_TASKS)}"
        )
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"duplicate zero-shot task in {tasks}")
    return tasks


def task_file(data_dir: str | Path, task: str) -> Path:
    """Absolute path of the local file of ``task``: ``<data_dir>/zeroshot/<task>.jsonl``.

    Raises ``FileNotFoundError`` naming the task and the path when it is missing.
    """
    _check_tasks([task])
    path = (Path(data_dir).expanduser() / "zeroshot" / f"{task}.jsonl").resolve()
    if not path.is_file():
        raise FileNotFoundError(
            f"zero-shot task '{task}': local data file not found: {path} "
            f"(expected the {_SPLIT[task]} split of lm-eval's '{task}' task as JSONL, "
            f"see {Path(data_dir).expanduser().resolve() / 'README.md'}; "
            f"or pass data_dir=None to use the Hugging Face hub)"
        )
    return path


def local_task_config(task: str, data_dir: str | Path) -> dict[str, Any]:
    """lm-eval task config (a dict for ``TaskManager.load``) of ``task`` on local data.

    The task is named ``fedlib_<task>``; its rows come from :func:`task_file` (an
    absolute path, so the working directory does not matter), read into memory by
    :func:`load_local_jsonl` (lm-eval's ``custom_dataset`` hook; no hub, no cache).
    """
    path = task_file(data_dir, task)
    split = _SPLIT[task]
    cfg: dict[str, Any] = {
        "task": LOCAL_PREFIX + task,
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {split: str(path)}},
        "custom_dataset": load_local_jsonl,
        # zero-shot only: no training split is shipped; the scored split is the
        # stock task's (validation for boolq/rte/hellaswag/winogrande, test for
        # ARC and OpenBookQA).
        "training_split": None,
        "validation_split": split if split == "validation" else None,
        "test_split": split if split == "test" else None,
        "num_fewshot": 0,
    }
    cfg.update(_task_body(task))
    return cfg


@contextlib.contextmanager
def _caller_state_kept(model):
    """Undo the side effects of HFLM / simple_evaluate on the caller's process.

    HFLM calls ``model.eval()`` (and ``tie_weights()``), and simple_evaluate seeds the
    global python / numpy / torch generators; give the caller its mode and random
    streams back (scoring log-likelihoods uses no randomness).
    """
    import random

    import numpy as np
    import torch

    was_training = getattr(model, "training", False)
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        if was_training:
            model.train()


class _DropCustomDatasetHint(logging.Filter):
    """lm-eval logs a CLI hint ("Custom kwargs can be passed to `--metadata`...") as a
    warning for every task with a ``custom_dataset``; it does not apply here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed to `--metadata`" not in record.getMessage()


@contextlib.contextmanager
def _quiet_custom_dataset_hint():
    logger = logging.getLogger("lm_eval.api.task")
    flt = _DropCustomDatasetHint()
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


def _float_or_nan(value) -> float:
    if value is None or isinstance(value, str):  # lm-eval reports "N/A" for n < 2
        return math.nan
    return float(value)


def harness_specs(
    tasks: Iterable[str], data_dir: str | Path | None
) -> tuple[list[str | dict[str, Any]], dict[str, str], bool]:
    """What to hand lm-eval: (task specs, {task: harness task name}, include_defaults).

    Offline the specs are the self-contained :func:`local_task_config` dicts (a missing
    file fails here, before any model work), and the ``TaskManager`` need not index
    lm-eval's ~10k stock YAMLs (that takes ~10 s); online they are the stock names.
    """
    tasks = _check_tasks(tasks)
    if data_dir is not None:
        specs: list[str | dict[str, Any]] = [local_task_config(t, data_dir) for t in tasks]
        return specs, {t: LOCAL_PREFIX + t for t in tasks}, False
    return list(tasks), {t: t for t in tasks}, True


def run_harness(
    model,
    tokenizer,
    tasks: Iterable[str] = ZEROSHOT_TASKS,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    batch_size: int = 1,
    seed: int = 0,
    log_samples: bool = False,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Run ``lm_eval.simple_evaluate``; return its raw output and {task: harness task name}.

    Lower-level than :func:`evaluate_zeroshot` (which summarises this output); with
    ``log_samples=True`` the raw output holds the per-document log-likelihoods
    under ``["samples"][harness_name]``.
    """
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    if limit is not None:
        limit = int(limit)
        if limit < 1:
            raise ValueError(f"limit must be a positive number of documents, got {limit}")
    specs, names, include_defaults = harness_specs(tasks, data_dir)
    task_manager = TaskManager(include_defaults=include_defaults)

    with _caller_state_kept(model), _quiet_custom_dataset_hint():
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=int(batch_size))
        raw = lm_eval.simple_evaluate(
            model=lm,
            tasks=specs,
            num_fewshot=0,
            limit=limit,
            task_manager=task_manager,
            log_samples=log_samples,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
            bootstrap_iters=100000,  # acc/acc_norm are means: closed-form stderr
        )
    if raw is None:  # only non-zero ranks of a distributed launch get None
        raise RuntimeError("lm_eval.simple_evaluate returned no results (not rank 0?)")
    return raw, names


def summarize(raw: dict[str, Any], names: dict[str, str]) -> dict[str, dict[str, Any]]:
    """{task: scores} from :func:`run_harness`'s output (run with ``log_samples=True``).

    Per task: ``acc``, ``acc_stderr``, ``acc_norm``, ``acc_norm_stderr`` (``None`` where the
    task defines no ``acc_norm``; a standard error is ``nan`` when undefined, n < 2), ``n``,
    and the per-document record the paired comparisons need: ``doc_ids`` (in order),
    ``correct`` ({metric: [0/1 per document]}) and ``choices`` (answer choices per document,
    so 1/choices is the document's chance level).
    """
    out: dict[str, dict[str, Any]] = {}
    for task, name in names.items():
        res = raw["results"][name]
        has_norm = "acc_norm,none" in res
        samples = sorted(raw["samples"][name], key=lambda r: r["doc_id"])
        metrics = ["acc", "acc_norm"] if has_norm else ["acc"]
        out[task] = {
            "acc": float(res["acc,none"]),
            "acc_stderr": _float_or_nan(res.get("acc_stderr,none")),
            "acc_norm": float(res["acc_norm,none"]) if has_norm else None,
            "acc_norm_stderr": _float_or_nan(res.get("acc_norm_stderr,none")) if has_norm else None,
            "n": int(raw["n-samples"][name]["effective"]),
            "doc_ids": [int(r["doc_id"]) for r in samples],
            "correct": {m: [int(r[m]) for r in samples] for m in metrics},
            "choices": [len(r["arguments"]) for r in samples],
        }
    return out


def sample_lines(raw: dict[str, Any], names: dict[str, str]) -> str:
    """lm-eval's per-document records of every task as JSONL (``{"task": ..., **record}`` a line).

    Sanitized as lm-eval's own ``--log_samples`` writer does (arguments as ``gen_args_i`` /
    ``arg_j``, responses as plain lists, target as a string), so the lines read like the
    harness's ``samples_<task>_*.jsonl`` files."""
    import json

    from lm_eval.utils import handle_non_serializable, sanitize_list

    lines = []
    for task, name in names.items():
        for record in sorted(raw["samples"][name], key=lambda r: r["doc_id"]):
            record = dict(record)
            record["arguments"] = {f"gen_args_{i}": {f"arg_{j}": part for j, part in enumerate(arg)}
                                   for i, arg in enumerate(record["arguments"])}
            record["resps"] = sanitize_list(record["resps"])
            record["filtered_resps"] = sanitize_list(record["filtered_resps"])
            record["target"] = str(record["target"])
            lines.append(json.dumps({"task": task, **record}, default=handle_non_serializable, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def evaluate_zeroshot(
    model,
    tokenizer,
    tasks: Iterable[str] = ZEROSHOT_TASKS,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    batch_size: int = 1,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Zero-shot accuracy of an in-memory causal LM on lm-eval tasks.

    Args:
        model: a ``transformers`` causal LM (already pruned in memory by the caller).
        tokenizer: its tokenizer.
        tasks: names from :data:`ZEROSHOT_TASKS`.
        data_dir: the data mirror (holding ``zeroshot/<task>.jsonl``) for offline
            use; ``None`` loads lm-eval's stock tasks from the Hugging Face hub.
        limit: score only the first ``limit`` documents of each task (``None``: all).
        batch_size: HFLM batch size.
        seed: seeds python / numpy / torch / few-shot sampling in lm-eval.

    Returns:
        :func:`summarize`'s ``{task: scores}`` with the plain task names as keys (in the
        order given).
    """
    raw, names = run_harness(
        model, tokenizer, tasks, data_dir=data_dir, limit=limit,
        batch_size=batch_size, seed=seed, log_samples=True,
    )
    return summarize(raw, names)


# ------------------------------------------------------------- statistics over documents

#: Two-sided 95 % quantile of the standard normal (scipy.stats.norm.ppf(0.975)).
Z95 = 1.959963984540054


def _variance(values: Sequence[float]) -> float:
    """Sample variance (n - 1), as lm-eval's stderr of a mean uses."""
    n = len(values)
    if n < 2:
        return math.nan
    mean = sum(values) / n
    return sum((v - mean) ** 2 for v in values) / (n - 1)


def mean_standard_error(correct: Sequence[Sequence[int]]) -> float:
    """Standard error of the unweighted mean over tasks of per-task accuracies.

    ``correct``: one 0/1 list per task. Tasks are independent samples, so
    SE = sqrt(sum_t s_t^2 / n_t) / T with s_t^2 the task's sample variance (lm-eval's
    per-task stderr is sqrt(s_t^2 / n_t))."""
    return math.sqrt(sum(_variance(c) / len(c) for c in correct)) / len(correct)


def paired_difference(variant: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> dict[str, float]:
    """Difference of the task-mean accuracy, variant - reference, on the same documents,
    with its 95 % paired normal interval.

    Per task t the per-document differences d_ti = variant_ti - reference_ti have mean D_t
    and sample variance s_t^2; the mean over T tasks differs by (1/T) sum_t D_t with standard
    error sqrt(sum_t s_t^2 / n_t) / T; the interval is +- :data:`Z95` standard errors.
    (Pairing removes the between-document variance both models share.)"""
    if len(variant) != len(reference):
        raise ValueError(f"{len(variant)} tasks against {len(reference)}")
    diffs = []
    for v, r in zip(variant, reference):
        if len(v) != len(r):
            raise ValueError(f"{len(v)} documents against {len(r)}: not the same documents")
        diffs.append([a - b for a, b in zip(v, r)])
    delta = sum(sum(d) / len(d) for d in diffs) / len(diffs)
    se = mean_standard_error(diffs)
    return {"delta": delta, "se": se, "low": delta - Z95 * se, "high": delta + Z95 * se}
