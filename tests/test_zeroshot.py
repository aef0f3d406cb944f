"""Zero-shot evaluation through lm-evaluation-harness, offline on the local task files.

(a) A tiny random Llama with the real SmolLM2 tokenizer runs through the real harness;
    its accuracies (and per-choice log-likelihoods) are checked against a direct
    forward pass written here, independently of lm-eval.
(b) The offline task definitions produce the same requests (context, continuation),
    gold answers, output type and metrics as lm-eval's stock YAMLs applied to the
    same local rows.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import inspect
import json
import math
from pathlib import Path

import pytest
import torch

from fedlib.evaluate.zeroshot import (
    LOCAL_PREFIX,
    STOCK_TASK_YAML,
    ZEROSHOT_TASKS,
    evaluate_zeroshot,
    harness_specs,
    local_task_config,
    mean_standard_error,
    paired_difference,
    run_harness,
    sample_lines,
    table_metric,
    task_file,
)

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
LIMIT = 4


def _rows(task, n=None):
    rows = []
    with open(DATA_DIR / "zeroshot" / f"{task}.jsonl", encoding="utf-8") as fh:
        for line in fh:
            rows.append(json.loads(line))
            if n is not None and len(rows) == n:
                break
    return rows


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tokenizer(smollm_tokenizer):  # conftest: the real SmolLM2 tokenizer, loaded once per session
    return smollm_tokenizer


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,  # no truncation of long BoolQ passages
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg).eval()


# ------------------------------------------------- (a) harness vs direct forward pass


def _expected_requests(task, row):
    """(contexts, continuations, gold, choice strings) written from the papers' prompts."""
    from lm_eval.tasks.hellaswag.utils import preprocess  # the stock HellaSwag cleaner

    if task == "boolq":
        ctx = f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:"
        choices, gold = ["no", "yes"], int(row["answer"])
    elif task == "rte":
        ctx = f"{row['sentence1']}\nQuestion: {row['sentence2']} True or False?\nAnswer:"
        choices, gold = ["True", "False"], row["label"]
    elif task == "hellaswag":
        ctx = preprocess(row["activity_label"] + ": " + row["ctx_a"] + " " + row["ctx_b"].capitalize())
        choices, gold = [preprocess(e) for e in row["endings"]], int(row["label"])
    elif task == "winogrande":  # partial scoring: the options go into the context
        i = row["sentence"].index("_")
        ctxs = [row["sentence"][:i] + row["option1"], row["sentence"][:i] + row["option2"]]
        cont = " " + row["sentence"][i + 1 :].strip()
        return ctxs, [cont, cont], int(row["answer"]) - 1, [cont, cont]
    elif task in ("arc_easy", "arc_challenge"):
        ctx = f"Question: {row['question']}\nAnswer:"
        choices = row["choices"]["text"]
        gold = row["choices"]["label"].index(row["answerKey"])
    elif task == "openbookqa":
        ctx = row["question_stem"]
        choices = row["choices"]["text"]
        gold = row["choices"]["label"].index(row["answerKey"].strip())
    else:
        raise AssertionError(task)
    return [ctx] * len(choices), [" " + c for c in choices], gold, choices


@torch.no_grad()
def _loglik(model, tok, ctx, cont):
    """log P(cont | ctx), tokenising like a causal LM scorer: encode ctx+cont, split at ctx."""
    whole = tok.encode(ctx + cont)
    ctx_ids = tok.encode(ctx)
    assert whole[: len(ctx_ids)] == ctx_ids
    cont_ids = whole[len(ctx_ids) :]
    ids = torch.tensor([ctx_ids + cont_ids])
    logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    pos = torch.arange(len(ctx_ids) - 1, len(ctx_ids) + len(cont_ids) - 1)
    return float(logprobs[pos, torch.tensor(cont_ids)].sum())


@pytest.fixture(scope="module")
def direct_scores(tiny_model, tokenizer):
    """{task: [(lls, gold, choices), ...]} for the first LIMIT rows, by direct forward passes."""
    out = {}
    for task in ZEROSHOT_TASKS:
        out[task] = []
        for row in _rows(task, LIMIT):
            ctxs, conts, gold, choices = _expected_requests(task, row)
            lls = [_loglik(tiny_model, tokenizer, c, x) for c, x in zip(ctxs, conts)]
            out[task].append((lls, gold, choices))
    return out


def _argmax(xs):
    return max(range(len(xs)), key=lambda i: xs[i])


@pytest.fixture(scope="module")
def summary(tiny_model, tokenizer):
    return evaluate_zeroshot(
        tiny_model, tokenizer, ZEROSHOT_TASKS, DATA_DIR, limit=LIMIT, batch_size=1, seed=0
    )


def test_result_shape(summary):
    assert list(summary) == list(ZEROSHOT_TASKS)
    for task, res in summary.items():
        assert set(res) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "n", "doc_ids", "correct", "choices"}
        assert res["n"] == LIMIT and res["doc_ids"] == list(range(LIMIT))
        assert set(res["correct"]) == ({"acc"} if res["acc_norm"] is None else {"acc", "acc_norm"})
        assert all(sum(res["correct"][m]) / LIMIT == pytest.approx(res[m]) for m in res["correct"])
        assert table_metric(task) == ("acc" if res["acc_norm"] is None else "acc_norm")
        assert 0.0 <= res["acc"] <= 1.0 and isinstance(res["acc_stderr"], float)
        if task in ("boolq", "rte", "winogrande"):  # the stock tasks report acc only
            assert res["acc_norm"] is None and res["acc_norm_stderr"] is None
        else:
            assert 0.0 <= res["acc_norm"] <= 1.0 and isinstance(res["acc_norm_stderr"], float)


def test_harness_accuracy_matches_direct_forward(summary, direct_scores):
    for task in ZEROSHOT_TASKS:
        docs = direct_scores[task]
        correct = [int(_argmax(lls) == gold) for lls, gold, _ in docs]
        assert summary[task]["acc"] == pytest.approx(sum(correct) / len(docs)), task
        assert summary[task]["correct"]["acc"] == correct, task  # per document, in document order
        assert summary[task]["choices"] == [len(ch) for _, _, ch in docs], task
        if summary[task]["acc_norm"] is not None:
            # acc_norm: log-likelihood per character of the choice string
            norm = [[ll / len(c) for ll, c in zip(lls, ch)] for lls, _, ch in docs]
            correct_norm = [int(_argmax(n) == g) for n, (_, g, _) in zip(norm, docs)]
            assert summary[task]["acc_norm"] == pytest.approx(sum(correct_norm) / len(docs)), task
            assert summary[task]["correct"]["acc_norm"] == correct_norm, task


def test_harness_loglikelihoods_match_direct_forward(tiny_model, tokenizer, direct_scores):
    # batch_size=4 here (the summary used 1): padding must not change the scores.
    raw, names = run_harness(
        tiny_model, tokenizer, ZEROSHOT_TASKS, DATA_DIR, limit=LIMIT, batch_size=4, log_samples=True
    )
    for task in ZEROSHOT_TASKS:
        samples = sorted(raw["samples"][names[task]], key=lambda s: s["doc_id"])
        assert [s["doc_id"] for s in samples] == list(range(LIMIT))
        for s, (lls, gold, _) in zip(samples, direct_scores[task]):
            harness_lls = [float(r[0]) for r in s["filtered_resps"]]
            assert harness_lls == pytest.approx(lls, abs=2e-3), (task, s["doc_id"])
            assert s["acc"] == float(_argmax(lls) == gold), (task, s["doc_id"])
    # --log-samples: lm-eval's records, one JSON line per document, sanitized as lm-eval writes them
    lines = [json.loads(line) for line in sample_lines(raw, names).splitlines()]
    assert [(r["task"], r["doc_id"]) for r in lines] == [(t, i) for t in ZEROSHOT_TASKS for i in range(LIMIT)]
    for r in lines:
        lls, gold, choices = direct_scores[r["task"]][r["doc_id"]]
        assert len(r["arguments"]) == len(choices) and set(r["arguments"]["gen_args_0"]) == {"arg_0", "arg_1"}
        assert [float(x[0]) for x in r["filtered_resps"]] == pytest.approx(lls, abs=2e-3)
        assert r["acc"] == float(_argmax(lls) == gold)
        # the gold choice's index; WinoGrande's target is the shared continuation (partial evaluation)
        if r["task"] == "winogrande":  # partial evaluation: the target is the continuation every choice shares
            assert r["target"].strip() == r["arguments"]["gen_args_0"]["arg_1"].strip() != ""
        else:  # the gold choice's index
            assert r["target"] == str(gold)
        assert ("acc_norm" in r) == (table_metric(r["task"]) == "acc_norm")


def test_deterministic_and_leaves_caller_state(tiny_model, tokenizer, summary):
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    tiny_model.train()
    try:
        again = evaluate_zeroshot(
            tiny_model, tokenizer, ["rte", "winogrande"], DATA_DIR, limit=LIMIT, seed=7
        )
        assert tiny_model.training  # HFLM calls .eval(); the caller's mode comes back
    finally:
        tiny_model.eval()
    # simple_evaluate seeds the global generators; the caller's stream is untouched
    assert torch.equal(torch.rand(3), expected_draw)
    for task in ("rte", "winogrande"):
        for key, value in again[task].items():
            ref = summary[task][key]
            assert value == ref or (math.isnan(value) and math.isnan(ref)), (task, key)


# ----------------------------------------------------------------- errors and paths


def test_missing_task_file_names_task_and_path(tmp_path):
    (tmp_path / "zeroshot").mkdir()
    with pytest.raises(FileNotFoundError) as err:
        local_task_config("hellaswag", tmp_path)
    msg = str(err.value)
    assert "hellaswag" in msg and str(tmp_path / "zeroshot" / "hellaswag.jsonl") in msg
    with pytest.raises(FileNotFoundError, match="boolq"):
        evaluate_zeroshot(None, None, ["boolq"], tmp_path)  # fails before touching the model


def test_online_uses_stock_task_names():
    specs, names, include_defaults = harness_specs(["boolq", "arc_challenge"], None)
    assert specs == ["boolq", "arc_challenge"] and include_defaults
    assert names == {"boolq": "boolq", "arc_challenge": "arc_challenge"}
    specs, names, include_defaults = harness_specs(["boolq"], DATA_DIR)
    assert names == {"boolq": "fedlib_boolq"} and not include_defaults
    assert specs[0]["task"] == "fedlib_boolq"


def test_unknown_task_rejected():
    with pytest.raises(ValueError, match="piqa"):
        evaluate_zeroshot(None, None, ["piqa"], DATA_DIR)


def test_task_file_is_absolute_whatever_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(DATA_DIR.parent)
    path = task_file("data", "rte")
    assert path.is_absolute() and path == (DATA_DIR / "zeroshot" / "rte.jsonl").resolve()
    cfg = local_task_config("rte", "data")
    assert cfg["task"] == LOCAL_PREFIX + "rte"
    assert cfg["dataset_kwargs"]["data_files"] == {"validation": str(path)}


# ------------------------------------------- (b) same definitions as the stock tasks

# Keys of the stock YAMLs, and how the offline definitions treat them.  A stock key
# outside this set (say a new `description` or `target_delimiter`) fails the test.
_DATA_KEYS = {"task", "tag", "dataset_path", "dataset_name", "training_split",
              "validation_split", "test_split"}
_IGNORED_KEYS = {"should_decontaminate", "doc_to_decontamination_query"}
_COMPARED_KEYS = {"output_type", "doc_to_text", "doc_to_target", "doc_to_choice",
                  "process_docs", "metric_list", "metadata"}


def _stock_yaml(task):
    import lm_eval.tasks
    from lm_eval.tasks._yaml_loader import load_yaml

    path = Path(lm_eval.tasks.__file__).parent / STOCK_TASK_YAML[task]
    return load_yaml(path, resolve_func=True)


def _sample_indices(task):
    n = sum(1 for _ in open(DATA_DIR / "zeroshot" / f"{task}.jsonl", encoding="utf-8"))
    idx = {0, 1, 2, n // 2, n - 1}
    if task.startswith("arc"):  # include rows with numeric ("1".."4") answer labels
        rows = _rows(task)
        idx |= {i for i, r in enumerate(rows) if r["answerKey"].isdigit()}
        idx = set(sorted(idx)[:8])
    return sorted(idx)


def _requests_and_gold(task_obj, doc):
    ctx = task_obj.fewshot_context(doc, 0)
    reqs = task_obj.construct_requests(doc=doc, ctx=ctx, metadata=("t", 0, 1))
    args = [r.arguments for r in reqs]
    # the gold index, as the harness scores it: the one-hot choice that gets acc = 1
    golds = []
    for j in range(len(args)):
        res = [(0.0 if k == j else -1.0, False) for k in range(len(args))]
        if task_obj.process_results(doc, res)["acc"] == 1.0:
            golds.append(j)
    return args, golds


@pytest.mark.parametrize("task", ZEROSHOT_TASKS)
def test_local_definition_matches_stock(task):
    import datasets
    from lm_eval.tasks import TaskManager

    stock = _stock_yaml(task)
    assert stock["task"] == task  # STOCK_TASK_YAML points at the task of that name
    assert set(stock) <= _DATA_KEYS | _IGNORED_KEYS | _COMPARED_KEYS, set(stock)
    mine = local_task_config(task, DATA_DIR)
    # the split scored by the stock task is the split the local file is declared as
    stock_split = "test" if stock.get("test_split") else "validation"
    assert list(mine["dataset_kwargs"]["data_files"]) == [stock_split]
    assert mine["output_type"] == stock["output_type"] == "multiple_choice"
    assert [m["metric"] for m in mine["metric_list"]] == [m["metric"] for m in stock["metric_list"]]
    for m in stock["metric_list"]:
        assert m.get("aggregation", "mean") == "mean" and m.get("higher_is_better", True)
    assert mine["metadata"]["version"] == stock["metadata"]["version"]
    if "process_docs" in stock:  # reused by import, not copied
        # (lm-eval's YAML loader re-executes the module file, so compare by name and code)
        a, b = inspect.unwrap(mine["process_docs"]), stock["process_docs"]
        assert (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)
        assert a.__code__.co_code == b.__code__.co_code

    # The stock definition, unchanged except for where its rows come from.
    rows = _rows(task)
    idx = _sample_indices(task)
    ref_rows = [rows[i] for i in idx]
    if task == "boolq":  # stock reads super_glue/boolq: label 0/1 instead of answer bool
        ref_rows = [{"question": r["question"], "passage": r["passage"], "idx": i,
                     "label": int(r["answer"])} for i, r in zip(idx, ref_rows)]
    ref_cfg = {k: v for k, v in stock.items() if k not in ("tag",)}
    ref_cfg.update(task=f"stockref_{task}", dataset_kwargs=None,
                   custom_dataset=lambda **_: datasets.DatasetDict(
                       {stock_split: datasets.Dataset.from_list(ref_rows)}),
                   training_split=None, validation_split=None, test_split=None)
    ref_cfg[f"{stock_split}_split"] = stock_split

    tm = TaskManager(include_defaults=False)
    ref_task = tm.load([ref_cfg])["tasks"][f"stockref_{task}"]
    my_task = tm.load([mine])["tasks"][LOCAL_PREFIX + task]
    assert list(my_task._metric_fn_list) == list(ref_task._metric_fn_list)
    my_docs, ref_docs = my_task.eval_docs, ref_task.eval_docs  # (property: re-maps each call)
    assert len(my_docs) == len(rows) and len(ref_docs) == len(idx)
    for j, i in enumerate(idx):
        ref_args, ref_gold = _requests_and_gold(ref_task, ref_docs[j])
        my_args, my_gold = _requests_and_gold(my_task, my_docs[i])
        assert my_args == ref_args, (task, i)
        assert my_gold == ref_gold and len(my_gold) == 1, (task, i)


# ------------------------------------------------ paired differences and standard errors


def test_paired_difference_matches_scipy_on_one_task():
    from scipy import stats

    rng = torch.Generator().manual_seed(0)
    ref = torch.randint(0, 2, (40,), generator=rng).tolist()
    var = torch.randint(0, 2, (40,), generator=rng).tolist()
    d = [a - b for a, b in zip(var, ref)]
    got = paired_difference([var], [ref])
    low, high = stats.norm.interval(0.95, loc=sum(d) / len(d), scale=stats.sem(d))
    assert got["delta"] == pytest.approx(sum(d) / len(d)) and got["se"] == pytest.approx(stats.sem(d))
    assert (got["low"], got["high"]) == pytest.approx((low, high))
    assert mean_standard_error([ref]) == pytest.approx(stats.sem(ref))  # lm-eval's acc_stderr


def test_paired_difference_over_tasks_matches_a_stratified_bootstrap():
    """Three tasks of different sizes: the analytic standard error of the mean over tasks of the
    per-task mean differences against a brute-force bootstrap that resamples documents within
    each task (seeded); the bootstrap's variance uses n, not n - 1, hence the small factor."""
    import numpy as np

    rng = np.random.default_rng(0)
    sizes = (30, 50, 80)
    ref = [rng.integers(0, 2, n) for n in sizes]
    var = [np.where(rng.random(n) < 0.7, r, 1 - r) for r, n in zip(ref, sizes)]  # 70 % agreement
    got = paired_difference([v.tolist() for v in var], [r.tolist() for r in ref])
    diffs = [v - r for v, r in zip(var, ref)]
    assert got["delta"] == pytest.approx(np.mean([d.mean() for d in diffs]))
    boot = np.mean([d[rng.integers(0, len(d), (20000, len(d)))].mean(axis=1) for d in diffs], axis=0)
    shrink = np.sqrt(sum(d.var(ddof=0) / len(d) for d in diffs) / sum(d.var(ddof=1) / len(d) for d in diffs))
    assert boot.std() == pytest.approx(got["se"] * shrink, rel=0.03)
    assert got["high"] - got["delta"] == pytest.approx(1.959964 * got["se"])
    # pairing: the same documents scored twice differ by exactly 0 with no spread
    same = paired_difference([r.tolist() for r in ref], [r.tolist() for r in ref])
    assert same == {"delta": 0.0, "se": 0.0, "low": 0.0, "high": 0.0}
    with pytest.raises(ValueError, match="not the same documents"):
        paired_difference([[1, 0]], [[1, 0, 1]])
