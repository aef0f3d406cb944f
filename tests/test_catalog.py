"""fedlib.catalog: the variant label grammar, setting components, and table / privacy specs built
from a tiny config. Expected rows and files are written out here, not computed by the catalog."""

import hashlib
import json
import re

import pytest

from fedlib.catalog import (
    LABEL_PATTERN,
    SETTING_LABEL_PATTERN,
    Calib,
    Catalog,
    PrivacyCatalog,
    Prune,
    Split,
    Variant,
    plot_inputs,
    table_inputs,
)

R = "res"  # results_dir of the tiny config


def tiny_config(**changes):
    config = {
        "seed": 0, "threads": 1, "results_dir": R, "reports_dir": "rep",
        "model": {"name": "tiny"},
        "calibration": {"dataset": "c4", "nsamples": 4, "seqlen": 32},
        "clients": {"n": 2, "partition": "iid"},
        "pruning": {"method": "wanda", "sparsity": 0.5, "local_group": "row"},
        "server": {"groups": ["layer", "2:4"], "scaling": [False, True]},
        "baselines": {"local_only_clients": 1},
        "evaluation": {"datasets": ["wikitext2", "c4"], "seqlen": 32},
        "zeroshot": {"limit": 2, "run_rows": ["dense", "fedprllm_scale"]},
        "studies": {"local_groups": ["column"], "fedspallm": {"clients": [2], "sparsities": [0.6],
                                                             "standalone_clients": 3}},
    }
    for key, value in changes.items():
        config[key] = value
    return config


EVERY_KIND = {
    "dense": Variant("dense"),
    "centralized": Variant("centralized"),
    "local_3": Variant("local", client=3),
    "random": Variant("random"),
    "fedspallm": Variant("fedspallm"),
    "standalone_0": Variant("standalone", client=0),
    "fedprllm_oneshot_layer_noscale": Variant("fedprllm", schedule="oneshot", group="layer", scale=False),
    "fedprllm_iterative_2of4_scale": Variant("fedprllm", schedule="iterative", group="2of4", scale=True),
    "fedprllm_oneshot_column_scale": Variant("fedprllm", schedule="oneshot", group="column", scale=True),
    "fedprllm_iterative_row_noscale": Variant("fedprllm", schedule="iterative", group="row", scale=False),
}


@pytest.mark.parametrize("label", list(EVERY_KIND))
def test_label_round_trip(label):
    variant = Variant.from_label(label)
    assert variant == EVERY_KIND[label]
    assert variant.label == variant.to_label() == str(variant) == label
    assert re.fullmatch(LABEL_PATTERN, label)
    # the rules' wildcard takes every label but dense (scored by its own rule)
    assert bool(re.fullmatch(SETTING_LABEL_PATTERN, label)) == (label != "dense")


@pytest.mark.parametrize("label", ["", "Dense", "local_", "local_x", "fedprllm_oneshot_layer", "fedprllm_twoshot_layer_scale",
                                   "fedprllm_oneshot_block_scale", "fedprllm_oneshot_layer_scaled", "standalone",
                                   "random_1", "centralized ", None])
def test_invalid_labels_are_refused(label):
    with pytest.raises(ValueError, match=r"invalid variant label .*expected dense \| centralized"):
        Variant.from_label(label)


def test_inconsistent_variants_are_refused():
    for bad in (dict(kind="local"), dict(kind="dense", client=1), dict(kind="fedprllm", schedule="oneshot", group="layer"),
                dict(kind="centralized", scale=True), dict(kind="shadow")):
        with pytest.raises(ValueError, match="invalid variant"):
            Variant(**bad)


def test_setting_components_round_trip_and_refuse():
    assert Calib.parse("mix-8x512") == Calib("mix", 8, 512) and str(Calib("c4", 32, 512)) == "c4-32x512"
    assert Split.parse("dir0.5-12") == Split("dir0.5", 12) and Split.parse("dir0.5-12").describe() == "Dirichlet(alpha=0.5)"
    assert Prune.parse("owl-0.7-2of4") == Prune("owl", 0.7, "2of4") and str(Prune("wanda", 0.5, "row")) == "wanda-0.5-row"
    for parse, text, expected in ((Calib.parse, "c4-32", "nsamples"), (Split.parse, "noniid-3", "iid-"),
                                  (Prune.parse, "wanda-0.5-2:4", "method")):
        with pytest.raises(ValueError, match=rf"invalid .*{re.escape(text)}.*expected .*{expected}"):
            parse(text)


def test_variant_files_and_cli_arguments():
    s = ("c4-4x32", "iid-2", "wanda-0.5-row")
    base = f"{R}/masks/c4-4x32/iid-2/wanda-0.5-row"
    expected = {
        "dense": (None, ""),
        "centralized": (f"{R}/masks/c4-4x32/central/wanda-0.5-row/centralized.mask.safetensors", "--mask"),
        "local_3": (f"{base}/client_3.mask.safetensors", "--mask"),
        "random": (f"{R}/random/0.5.mask.safetensors", "--mask"),
        "fedspallm": (f"{R}/fedspallm/c4-4x32/iid-2/wanda-0.5-row/global.weights.safetensors", "--weights"),
        "standalone_0": (f"{R}/fedspallm/c4-4x32/iid-2/wanda-0.5-row/standalone_0.weights.safetensors", "--weights"),
        "fedprllm_oneshot_layer_noscale": (f"{R}/global/c4-4x32/iid-2/wanda-0.5-row/fedprllm_oneshot_layer.mask.safetensors", "--mask"),
        "fedprllm_oneshot_column_scale": (f"{R}/global/c4-4x32/iid-2/wanda-0.5-row/fedprllm_oneshot_column.mask.safetensors", "--mask"),
        # iterative with scaling is a run of its own; without, it is the plain iterative run
        "fedprllm_iterative_2of4_scale": (f"{R}/global/c4-4x32/iid-2/wanda-0.5-row/fedprllm_iterative-scaled_2of4.mask.safetensors", "--mask"),
        "fedprllm_iterative_row_noscale": (f"{R}/global/c4-4x32/iid-2/wanda-0.5-row/fedprllm_iterative_row.mask.safetensors", "--mask"),
    }
    catalog = Catalog(tiny_config())
    for label, (path, flag) in expected.items():
        args = "" if path is None else f"{flag} {path}" + (" --scale" if label.endswith("_scale") else "")
        assert catalog.variant_source(*s, label) == (path, args), label
    assert catalog.eval_json(*s, "dense") == f"{R}/eval/dense.json"
    assert catalog.eval_json(*s, "local_3") == f"{R}/eval/c4-4x32/iid-2/wanda-0.5-row/local_3.json"


def test_method_options_reach_the_method_they_name():
    catalog = Catalog(tiny_config())
    assert catalog.mask_args("owl-0.7-2of4") == "--method owl --sparsity 0.7 --local-group 2:4"
    config = tiny_config()
    config["pruning"] = {**config["pruning"], "method_options": {"owl": {"lam": 0.08, "note": "it's"}}}
    catalog = Catalog(config)
    assert catalog.mask_args("owl-0.7-row") == (
        "--method owl --sparsity 0.7 --local-group row --method-options '{\"lam\": 0.08, \"note\": \"it'\\''s\"}'")
    assert catalog.mask_args("wanda-0.5-row") == "--method wanda --sparsity 0.5 --local-group row"


def test_table1_rows():
    spec = Catalog(tiny_config(), config_files="a.yaml + b.yaml").table1()
    e = f"{R}/eval/c4-4x32/iid-2/wanda-0.5-row"
    assert spec["columns"] == ["Method", "Comparison group", "Pruning strategy", "Weight scaling"]
    assert spec["rows"] == [
        {"cells": ["Dense", "-", "-", "-"], "results": [f"{R}/eval/dense.json"]},
        {"cells": ["Centralized", "-", "-", "-"], "results": [f"{e}/centralized.json"]},
        {"cells": ["Local-only (mean ± std, 1 clients)", "-", "-", "-"], "results": [f"{e}/local_0.json"]},
        {"cells": ["FedPrLLM", "Layer", "One-shot", "✗"], "results": [f"{e}/fedprllm_oneshot_layer_noscale.json"]},
        {"cells": ["FedPrLLM", "2:4", "One-shot", "✗"], "results": [f"{e}/fedprllm_oneshot_2of4_noscale.json"]},
        {"cells": ["FedPrLLM", "Layer", "One-shot", "✓"], "results": [f"{e}/fedprllm_oneshot_layer_scale.json"]},
        {"cells": ["FedPrLLM", "2:4", "One-shot", "✓"], "results": [f"{e}/fedprllm_oneshot_2of4_scale.json"]},
    ]
    hashed = {k: v for k, v in tiny_config().items() if k != "threads"}
    assert spec["context"] == {
        "model": "tiny", "config": "a.yaml + b.yaml", "seed": 0,
        "config_hash": hashlib.sha256(json.dumps(hashed, sort_keys=True).encode()).hexdigest()[:12],
        "lines": ["2 clients, 4 calibration samples from c4 x 32 tokens (IID split); "
                  "local method wanda with row comparison at 50%"],
    }
    assert spec["title"] == "Table 1 analogue: perplexity of pruned tiny (wanda, 50% sparsity)"


def test_table1_pairs_rows_with_centralized_and_fedprllm_layer_with_local_only():
    e = f"{R}/eval/c4-4x32/iid-2/wanda-0.5-row"
    spec = Catalog(tiny_config()).table1()
    assert spec["paired_reference"] == f"{e}/centralized.json"
    # only the layer group without scaling is contrasted (the 2:4 and scaled rows are not)
    assert spec["contrasts"] == [{"name": "FedPrLLM (layer, one-shot) vs Local-only",
                                  "results": [f"{e}/fedprllm_oneshot_layer_noscale.json"],
                                  "reference": [f"{e}/local_0.json"]}]
    assert f"{e}/centralized.json" in table_inputs(spec)
    # the zero-shot twins pair with Dense (or nothing), never with the perplexity files
    assert "contrasts" not in Catalog(tiny_config()).table12()
    assert "paired_reference" not in Catalog(tiny_config(zeroshot={"limit": 2, "run_rows": ["centralized"]})).table12_run()


def test_table1_seeds_is_table1_of_each_calibration_draw():
    """The config's seed is make run's draw (the same files); another seed is a calib component of its own."""
    config = tiny_config(studies={"table1_seeds": [0, 3]})
    catalog = Catalog(config)
    spec = catalog.table1_seeds()
    assert [d["name"] for d in spec["draws"]] == ["seed 0", "seed 3"]
    assert spec["draws"][0]["rows"] == catalog.table1()["rows"]
    e3 = f"{R}/eval/c4-4x32-seed3/iid-2/wanda-0.5-row"
    assert spec["draws"][1]["paired_reference"] == f"{e3}/centralized.json"
    assert spec["draws"][1]["rows"][0]["results"] == [f"{R}/eval/dense.json"]  # Dense needs no calibration
    assert spec["draws"][1]["rows"][3]["results"] == [f"{e3}/fedprllm_oneshot_layer_noscale.json"]
    assert table_inputs(spec) == sorted(set(table_inputs(catalog.table1())) | set(table_inputs(spec["draws"][1])))
    assert "calibration draws with seeds 0, 3" in spec["context"]["lines"][0]
    assert Calib.parse("c4-4x32-seed3") == Calib("c4", 4, 32, 3) and str(Calib("c4", 4, 32, 3)) == "c4-4x32-seed3"
    assert Calib.parse("c4-4x32-seed3").draw_seed(0) == 3 and Calib.parse("c4-4x32").draw_seed(7) == 7
    with pytest.raises(ValueError, match="expected .*-seed"):
        Calib.parse("c4-4x32-3")


def test_table12_run_keeps_the_run_rows_with_zeroshot_files():
    spec = Catalog(tiny_config()).table12_run()
    z = f"{R}/zeroshot/c4-4x32/iid-2/wanda-0.5-row"
    assert spec["measure"] == "zeroshot"
    assert [row["results"] for row in spec["rows"]] == [
        [f"{R}/zeroshot/dense.json"], [f"{z}/fedprllm_oneshot_layer_scale.json"], [f"{z}/fedprllm_oneshot_2of4_scale.json"]]
    assert spec["title"] == ("Table 12 analogue (rows of `make run`): zero-shot accuracy (%) of pruned tiny "
                             "(wanda, 50% sparsity; first 2 documents per task)")


def test_zeroshot_tables_read_their_paired_reference_only_with_a_dense_row():
    with_dense = Catalog(tiny_config()).table12_run()
    assert with_dense["paired_reference"] == f"{R}/zeroshot/dense.json"
    assert table_inputs({**with_dense, "rows": with_dense["rows"][1:]}) == sorted(
        [f"{R}/zeroshot/dense.json", *(row["results"][0] for row in with_dense["rows"][1:])])
    without = Catalog(tiny_config(zeroshot={"limit": 2, "run_rows": ["fedprllm_scale"]})).table12_run()
    assert "paired_reference" not in without
    assert table_inputs(without) == sorted(row["results"][0] for row in without["rows"])


def test_table2_rows():
    spec = Catalog(tiny_config()).table2()
    e = f"{R}/eval/c4-4x32/iid-2/wanda-0.5-column"
    assert spec["rows"] == [
        {"cells": ["Column", "Centralized", "-"], "results": [f"{e}/centralized.json"]},
        {"cells": ["Column", "Local-only (mean ± std, 1 clients)", "-"], "results": [f"{e}/local_0.json"]},
        {"cells": ["Column", "FedPrLLM", "Layer"], "results": [f"{e}/fedprllm_oneshot_layer_noscale.json"]},
        {"cells": ["Column", "FedPrLLM", "Row"], "results": [f"{e}/fedprllm_oneshot_row_noscale.json"]},
        {"cells": ["Column", "FedPrLLM", "Column"], "results": [f"{e}/fedprllm_oneshot_column_noscale.json"]},
    ]


def test_fedspallm_table_with_and_without_layer_sampling():
    e = f"{R}/eval/c4-4x32/iid-2/sparsegpt_update-0.6-layer"
    plain = Catalog(tiny_config()).fedspallm_table(2)
    # 3 standalone clients configured, but the table has 2 clients
    assert plain["rows"] == [
        {"cells": ["60%", "Random"], "results": [f"{e}/random.json"]},
        {"cells": ["60%", "Standalone (mean ± std, 2 clients)"], "results": [f"{e}/standalone_0.json", f"{e}/standalone_1.json"]},
        {"cells": ["60%", "FedSpaLLM"], "results": [f"{e}/fedspallm.json"]},
    ]
    config = tiny_config()
    config["studies"]["fedspallm"].update(resources=0.5, rounds=4)
    catalog = Catalog(config)
    sampled = catalog.fedspallm_table(2)
    assert [row["cells"][1] for row in sampled["rows"]] == ["Random", "FedSpaLLM"]
    assert "4 round(s), layer sampling with resources 0.5 (no Standalone models)" in sampled["context"]["lines"][0]
    assert catalog.fedspallm_standalone() == [] and catalog.fedspallm_resources_arg("iid-2") == "--resources 0.5 0.5"
    assert Catalog(tiny_config()).fedspallm_resources_arg("iid-2") == ""

    config["studies"]["fedspallm"]["resources"] = [0.25, 1.0]
    assert Catalog(config).fedspallm_resources_arg("iid-2") == "--resources 0.25 1"
    config["studies"]["fedspallm"]["resources"] = [0.25, 1.0, 1.0]
    with pytest.raises(ValueError, match=r"studies.fedspallm.resources: 3 per-client fractions.*clients has 2"):
        Catalog(config)


def test_figure2_sweep_rows_and_inputs():
    config = tiny_config(studies={"clients_sweep": [1, 2, 8]})  # 8 > nsamples: dropped
    spec = Catalog(config).figure2()
    assert [(row["x"], row["series"]) for row in spec["rows"]] == [
        (1, "FedPrLLM (layer, one-shot)"), (1, "Centralized"), (1, "Local-only (mean ± std)"),
        (2, "FedPrLLM (layer, one-shot)"), (2, "Centralized"), (2, "Local-only (mean ± std)")]
    assert spec["reference"] == [{"series": "Dense", "results": [f"{R}/eval/dense.json"]}]
    rows = [f"{R}/eval/c4-4x32/iid-{n}/wanda-0.5-row/{label}.json" for n in (1, 2)
            for label in ("fedprllm_oneshot_layer_noscale", "centralized", "local_0")]
    # the table reads its rows; the plot also its Dense reference line
    assert table_inputs(spec) == sorted(rows)
    assert plot_inputs(spec) == sorted(rows + [f"{R}/eval/dense.json"])


def test_privacy_specs():
    config = tiny_config(privacy={"membership": {"population": 16, "seqlen": 8, "epsilons": [2]},
                                  "defence": {"epsilons": [0.5]},
                                  "full": {"defence": {"epsilons": [0.5, 8], "datasets": ["wikitext2", "c4"]}}})
    privacy = PrivacyCatalog(Catalog(config))
    base = f"{R}/privacy/c4-4x32/iid-2/wanda-0.5-row"
    assert privacy.pruning_args() == "--method wanda --sparsity 0.5 --local-group row --seed 0"
    assert privacy.population("run") == f"{R}/pools/c4-16x8.safetensors"
    assert privacy.membership_samples("run") == 2  # 4 samples over 2 clients
    assert privacy.membership_epsilons("run") == [0.5, 2.0] and privacy.membership_epsilons("full") == [0.5, 2.0, 8.0]
    assert privacy.replacement_shards("run") == [f"{R}/shards/c4-4x32/iid-2/client_1.safetensors"]
    assert privacy.prior_pool("run") == [f"{R}/pools/wikitext2-32x32.safetensors"]
    spec = privacy.report_spec("privacy", "full")  # the bundled audit's
    assert spec["suffix"] == "_full" and spec["out_dir"] == "rep" and spec["entropy"] == f"{base}/entropy.json"
    assert spec["membership"] == f"{base}/full/membership.json"
    assert spec["defence"] == {
        "records": {"0.5": f"{base}/defence/rr0.5_layer.record.json", "8": f"{base}/defence/rr8_layer.record.json"},
        "evals": {"0.5": f"{base}/full/defence/rr0.5_layer.eval.json", "8": f"{base}/full/defence/rr8_layer.eval.json"},
        "datasets": ["wikitext2", "c4"], "group": "layer",
        "clean_eval": f"{R}/eval/c4-4x32/iid-2/wanda-0.5-row/fedprllm_oneshot_layer_noscale.json",
        "dense_eval": f"{R}/eval/dense.json",
    }
    # the report reads every result file of its spec, written out here
    d = spec["defence"]
    assert privacy.report_inputs("privacy", "full") == sorted(
        [spec[a] for a in ("entropy", "similarity", "sensitivity", "membership", "inversion")]
        + [*d["records"].values(), *d["evals"].values(), d["clean_eval"], d["dense_eval"]])
    outputs = privacy.report_outputs("privacy", "run")
    assert {"rep/privacy_entropy.md", "rep/privacy_entropy_layers.csv", "rep/privacy_membership_roc.png",
            "rep/privacy_defence.png", "rep/privacy_inversion.html"} <= set(outputs)
    assert len(outputs) == 6 * 3 + 3 and not any("dp" in path or "secagg" in path for path in outputs)
    # a named target's report: its own spec, inputs and tables
    assert privacy.report_spec("privacy_secagg") == {"context": spec["context"], "out_dir": "rep",
                                             "secagg": f"{base}/secagg.json"}
    assert privacy.report_inputs("privacy_secagg") == [f"{base}/secagg.json"]
    assert privacy.report_outputs("privacy_dp", "full") == [
        f"rep/privacy_dp{t}_full.{ext}" for t in ("", "_release", "_utility") for ext in ("md", "csv", "html")] + [
        "rep/privacy_dp_utility_full.png"]
    dp = privacy.dp_spec("run")
    assert set(privacy.report_inputs("privacy_dp")) == {
        *[f for s in dp["settings"].values() for f in s.values()],
        *[f for fed in dp["utility"]["federations"] for s in fed["settings"].values() for f in s.values()],
        dp["utility"]["public"]["mask"], dp["utility"]["public"]["eval"], dp["utility"]["public"]["text"],
        dp["utility"]["dense_eval"], *dp["utility"]["randomized_response"]["records"].values(),
        *dp["utility"]["randomized_response"]["evals"].values(), dp["release_audit"]}
    # the release audit: the table's ε and its own smaller ones, on windows of the calibration length
    assert dp["release_audit"] == f"{base}/run/dp/release_audit.json"
    assert privacy.release_audit_population("run") == f"{R}/pools/c4-64x32.safetensors"
    assert privacy.release_audit_args("run") == (
        "--epsilons 1 2 8 64 512 --delta 1e-05 --clip 1.0 --trials 100000 --factor 10.0 --seed 0")
    assert privacy.secagg_args() == ("--targets 16 --pairs 4 --pool 32 --draws 2 --blocks 1 --cohorts 1 2 4 8 16 32 "
                                     "--server-group layer")


def test_privacy_defence_datasets_must_be_evaluated():
    config = tiny_config(privacy={"defence": {"datasets": ["ptb"]}})
    with pytest.raises(ValueError, match=r"privacy \(run\): defence datasets \['ptb'\] are not evaluation.datasets"):
        PrivacyCatalog(Catalog(config))


def test_cohort_args_are_the_clients_pruning():
    """The server is told the clients' method, group and sparsity: the same values mask_args gives them."""
    catalog = Catalog(tiny_config())
    assert catalog.cohort_args("wanda-0.5-2of4") == "--client-method wanda --client-group 2:4 --client-sparsity 0.5"
    assert catalog.mask_args("wanda-0.5-2of4") == "--method wanda --sparsity 0.5 --local-group 2:4"
