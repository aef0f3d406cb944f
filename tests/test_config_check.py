"""fedlib.config_check: every configuration that would fail or silently misbehave mid-run is
refused before any job, in one message naming the key, the value and what is allowed.

Configs are .test/config.yaml (a tiny model in .test/model, data slices in .test/data; paths
relative to .test/) with one thing changed, validated against the workflow's schema first, as
the workflow does. The workflow-level twin: tests/test_workflow.py::test_invalid_config_is_rejected.
"""

import copy
import json
import shutil
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config, validate
from snakemake_interface_common.exceptions import WorkflowError

from fedlib.catalog import Catalog, table_inputs
from fedlib.config_check import ConfigError, validate_config, with_schema_defaults
from fedlib.embedded import EMBEDDED

REPO = Path(__file__).resolve().parents[1]
TEST_DIR = REPO / ".test"
SCHEMA = REPO / "fedlib" / "schemas" / "config.schema.yaml"


def config_with(*changes) -> dict:
    """.test/config.yaml with ``(dotted key, value)`` changes (a missing section is created)."""
    config = yaml.safe_load((TEST_DIR / "config.yaml").read_text())
    for key, value in changes:
        *parents, last = key.split(".")
        section = config
        for part in parents:
            section = section.setdefault(part, {})
        section[last] = value
    return config


def check(config: dict, workdir: Path = TEST_DIR) -> None:
    """What the workflow does: the schema (defaults filled in), then validate_config."""
    validate(config, str(SCHEMA))
    validate_config(config, workdir)


def refusal(config: dict, workdir: Path = TEST_DIR) -> str:
    with pytest.raises(ConfigError) as caught:
        check(config, workdir)
    return str(caught.value)


def assert_refused(config, key, value, allowed, workdir=TEST_DIR, why=None):
    """The message has a line ``key = value: expected ...allowed...`` (value as JSON)."""
    message = refusal(config, workdir)
    head = f"  - {key} = {json.dumps(value)}: expected "
    lines = [line for line in message.splitlines() if line.startswith(head)]
    assert lines, f"no line {head!r} in:\n{message}"
    assert any(allowed in line for line in lines), f"{allowed!r} not in {lines}"
    if why is not None:
        assert any(why in line for line in lines), f"{why!r} not in {lines}"
    return message


@pytest.fixture
def test_copy(tmp_path) -> Path:
    """A writable copy of .test/ (for broken data files and model folders)."""
    return Path(shutil.copytree(TEST_DIR, tmp_path / "t"))


# -- the valid configs pass ------------------------------------------------------------------------


def test_test_config_passes_and_is_not_changed():
    config = config_with()
    validate(config, str(SCHEMA))
    before = copy.deepcopy(config)
    validate_config(config, TEST_DIR)
    assert config == before  # the config's hash goes into table headers


@pytest.mark.parametrize("overlays", [(), ("config/gemma.yaml",), ("config/paper.yaml",), ("config/domain_quick.yaml",),
                                      ("config/domain_quick.yaml", "config/domain_samples.yaml"),
                                      ("config/domain_quick.yaml", "config/domain_samples.yaml", "config/domain_n1024.yaml"),
                                      ("config/domain_quick.yaml", "config/domain_samples.yaml", "config/domain_n1024.yaml",
                                       "config/domain_heldout.yaml")])
def test_shipped_configs_pass(overlays, monkeypatch):
    """config.yaml, and the files a user passes with --configfile merged over it in order (as
    Snakemake does). paper.yaml names a hub model: online it is fetched by the first job."""
    if not (REPO.parent / "shared" / "data" / "c4" / "train.jsonl").is_file():
        pytest.skip("the data mirror ../shared/data is not there")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    for overlay in overlays:
        update_config(config, yaml.safe_load((REPO / overlay).read_text()))
    check(config, REPO)


# -- clients and the pools they split --------------------------------------------------------------


def test_more_clients_than_calibration_samples():
    assert_refused(config_with(("clients.n", 4)), "clients.n", 4, "at most calibration.nsamples = 3")


def test_local_only_clients_beyond_the_clients():
    assert_refused(config_with(("baselines.local_only_clients", 4)), "baselines.local_only_clients", 4,
                   "at most clients.n = 3")


def test_clients_sweep_keeps_its_documented_drop_but_not_an_empty_figure():
    check(config_with(("studies.clients_sweep", [2, 3, 64])))  # 64 > nsamples: left out (tests/test_catalog.py)
    assert_refused(config_with(("studies.clients_sweep", [4, 8])), "studies.clients_sweep", [4, 8],
                   "at least one value <= calibration.nsamples = 3")


def test_noniid_clients_beyond_the_mixed_pool():
    config = config_with(("studies.noniid", {"per_dataset": 2, "clients": 7}))
    assert_refused(config, "studies.noniid.clients", 7, "at most 3 x studies.noniid.per_dataset = 6")
    check(config_with(("studies.noniid", {"per_dataset": 2, "clients": 6})))


def test_fedspallm_clients_beyond_the_pool_they_split():
    config = config_with(("studies.fedspallm", {"clients": [2, 4], "standalone_clients": 1}))
    assert_refused(config, "studies.fedspallm.clients", [2, 4], "each at most calibration.nsamples = 3")
    # with samples_per_client every client brings its own samples
    check(config_with(("studies.fedspallm", {"clients": [2, 4], "standalone_clients": 1, "samples_per_client": 2})))


def test_fedspallm_standalone_models_beyond_the_fewest_clients():
    config = config_with(("studies.fedspallm", {"clients": [2, 3], "standalone_clients": 3}))
    assert_refused(config, "studies.fedspallm.standalone_clients", 3,
                   "at most the fewest studies.fedspallm.clients = 2")
    # under layer sampling there are no Standalone models
    check(config_with(("studies.fedspallm", {"clients": [2], "standalone_clients": 3, "resources": 0.5})))


def test_study_defaults_are_checked_when_the_section_is_absent():
    """The studies' schema defaults split 32 samples: a config of 3 samples must size them."""
    config = config_with()
    del config["studies"]
    assert_refused(config, "studies.fedspallm.clients", [4, 8, 16], "each at most calibration.nsamples = 3")


def test_catalog_falls_back_to_the_schema_defaults():
    """validate_config fills absent study sections from the schema; the catalog falls back to
    literals of its own: both must describe the same tables."""
    config = config_with()
    del config["studies"]
    validate(config, str(SCHEMA))
    assert "studies" not in config  # Snakemake fills defaults only of sections a config has
    filled = with_schema_defaults(config)
    assert filled["studies"]["fedspallm"]["clients"] == [4, 8, 16]
    plain, defaults = Catalog(config).study_specs(), Catalog(filled).study_specs()
    assert plain.keys() == defaults.keys()
    for name in plain:
        a, b = plain[name](), defaults[name]()
        assert table_inputs(a) == table_inputs(b) and a["title"] == b["title"], name


# -- groups and methods ------------------------------------------------------------------------------


@pytest.mark.parametrize("key, value", [("pruning.local_group", "5:4"), ("pruning.local_group", "4:4"),
                                        ("server.groups", ["layer", "5:4"])])
def test_invalid_nm_groups(key, value):
    shown = "server.groups[1]" if key == "server.groups" else key
    assert_refused(config_with((key, value)), shown, "5:4" if key == "server.groups" else value,
                   "layer, row, column or N:M with 0 < N < M")


def test_nm_group_must_fit_the_model_layers():
    """.test/model: hidden 32, MLP 64, 4 heads x 8: M = 3 divides none, M = 8 all."""
    assert_refused(config_with(("server.groups", ["2:3"])), "server.groups[0]", "2:3",
                   "an N:M group whose M divides the input width of every linear of ./model (32, 64)")
    check(config_with(("server.groups", ["2:8"]), ("pruning.local_group", "4:8"), ("studies.methods", ["sparsegpt"])))


def schema_refuses(key, value) -> str:
    """The schema's message (Snakemake's validate) names the key as instance['a']['b']."""
    with pytest.raises(WorkflowError) as caught:
        validate(config_with((key, value)), str(SCHEMA))
    message = str(caught.value)
    assert "On instance" + "".join(f"[{part!r}]" for part in key.split(".")) in message, message
    return message


@pytest.mark.parametrize("key, value", [("pruning.local_group", "0:4"), ("pruning.local_group", "2of4"),
                                        ("server.groups", ["rows"]), ("pruning.method", "wandaa"),
                                        ("studies.methods", ["owl", "obs"]), ("pruning.sparsity", 1.5),
                                        ("studies.fedspallm.resources", 1.5),
                                        ("pruning.method_options", {"owl": 0.08})])
def test_schema_refuses_group_spellings_and_unknown_methods(key, value):
    schema_refuses(key, value)
    with pytest.raises(WorkflowError, match="'wandaa' is not one of"):
        validate(config_with(("pruning.method_options", {"wandaa": {}})), str(SCHEMA))


def test_schema_methods_are_the_registry():
    from fedlib.methods import METHODS

    schema = yaml.safe_load(SCHEMA.read_text())
    assert sorted(schema["$defs"]["method"]["enum"]) == sorted(METHODS)


def test_schema_server_and_upload_enums_are_the_registries():
    from fedlib.catalog.variants import SCHEDULES
    from fedlib.maskfile import FORMAT_VERSIONS
    from fedlib.server.robust import RULES

    server = yaml.safe_load(SCHEMA.read_text())["properties"]["server"]["properties"]
    assert server["schedules"]["items"]["enum"] == list(SCHEDULES)
    assert sorted(server["robust"]["enum"], key=str) == sorted([*RULES, None], key=str)
    upload = yaml.safe_load(SCHEMA.read_text())["properties"]["upload"]["properties"]
    assert upload["format_version"]["enum"] == list(FORMAT_VERSIONS)


def test_robust_server_is_one_shot_only():
    check(config_with(("server.robust", "mad")))
    assert_refused(config_with(("server.robust", "mad"), ("server.schedules", ["oneshot", "iterative"])),
                   "server.robust", "mad", "null with iterative in server.schedules")
    schema_refuses("server.robust", "median")
    schema_refuses("upload.format_version", 3)


def test_schema_privacy_sections_are_the_registry():
    """privacy.<name> for every analysis with sizes (fedlib.privacy_analyses), privacy.full.<name>
    for those of the full audit; each section's keys are its defaults'."""
    from fedlib.privacy_analyses import ANALYSES

    schema = yaml.safe_load(SCHEMA.read_text())
    privacy = schema["properties"]["privacy"]["properties"]

    def keys(section):
        return set((schema["$defs"][section["$ref"].split("/")[-1]] if "$ref" in section else section)["properties"])

    sized = {a.name: a for a in ANALYSES if a.defaults}
    assert set(privacy) - {"full"} == set(sized)
    assert set(privacy["full"]["properties"]) == {name for name, a in sized.items() if "full" in a.sizes}
    assert all(keys(privacy[name]) == set(a.defaults) for name, a in sized.items())


def test_secagg_cohorts_come_from_the_pool_and_targets_from_the_population():
    check(config_with(("privacy.secagg", {"targets": 7, "pool": 2, "cohorts": [3]})))  # 7 + 1 sample = 8 rows
    assert_refused(config_with(("privacy.secagg", {"targets": 3, "pool": 2, "cohorts": [1, 4]})),
                   "privacy.secagg.pool", 2, "at least the largest cohort - 1 = 3")
    assert_refused(config_with(("privacy.secagg", {"targets": 8, "pool": 2, "cohorts": [1]})),
                   "privacy.secagg.targets", 8, "at most privacy.membership.population - 1")


def test_schema_zeroshot_tasks_are_the_registry():
    from fedlib.evaluate.zeroshot import ZEROSHOT_TASKS

    schema = yaml.safe_load(SCHEMA.read_text())
    assert sorted(schema["properties"]["zeroshot"]["properties"]["tasks"]["items"]["enum"]) == sorted(ZEROSHOT_TASKS)


@pytest.mark.parametrize("method, options, why", [
    ("wanda", {"note": "x"}, "unexpected keyword argument 'note'"),
    ("owl", {"lam": 0.9}, "lam (lambda) must be in [0, 0.5]"),
    ("besa", {"stepz": 3}, "besa: unknown options ['stepz']"),
    ("sparsegpt", {"blocksize": 0}, "blocksize must be >= 1"),
])
def test_method_options_the_method_refuses(method, options, why):
    allowed = {"wanda": "options wanda accepts: none", "owl": "options owl accepts: outlier_m, lam",
               "besa": "options besa accepts: the options its documentation lists",
               "sparsegpt": "options sparsegpt accepts: percdamp, blocksize, dtype, metric_diag, solve, batch_gram"}[method]
    assert_refused(config_with(("pruning.method_options", {method: options})),
                   f"pruning.method_options.{method}", options, allowed, why=why)


def test_method_options_the_method_accepts():
    check(config_with(("pruning.method_options", {"owl": {"lam": 0.1}, "sparsegpt_update": {"blocksize": 16}})))


def test_per_layer_methods_with_an_nm_local_group():
    assert_refused(config_with(("pruning.local_group", "2:4")), "studies.methods[1]", "owl",
                   "a method that prunes every layer alike with pruning.local_group = 2:4")
    config = config_with(("pruning.local_group", "2:4"), ("pruning.method", "besa"),
                         ("studies.methods", ["sparsegpt", "magnitude"]))
    assert_refused(config, "pruning.method", "besa", "a method that prunes every layer alike")
    check(config_with(("pruning.local_group", "2:4"), ("studies.methods", ["sparsegpt", "magnitude"])))


# -- the data mirror ---------------------------------------------------------------------------------


def test_data_dir_that_is_not_a_folder():
    assert_refused(config_with(("data_dir", "no-data")), "data_dir", "no-data",
                   "a folder laid out like shared/data")


def test_empty_c4_file(test_copy):
    (test_copy / "data" / "c4" / "train.jsonl").write_text("")
    message = assert_refused(config_with(), "calibration.dataset", "c4",
                             f"a non-empty data file {test_copy / 'data' / 'c4' / 'train.jsonl'}", test_copy)
    assert "it is empty" in message


@pytest.mark.parametrize("path, key, value", [
    ("ptb/test.txt", "evaluation.datasets", "ptb"),
    ("wikitext2/validation.txt", "studies.noniid", "wikitext2"),
    ("zeroshot/rte.jsonl", "zeroshot.tasks", "rte"),
])
def test_missing_data_files(test_copy, path, key, value):
    (test_copy / "data" / path).unlink()
    assert_refused(config_with(), key, value, str(test_copy / "data" / Path(path).parent), test_copy)


def test_wikitext2_calibration_reads_the_validation_split_offline(test_copy):
    (test_copy / "data" / "wikitext2" / "validation.txt").unlink()
    assert_refused(config_with(("calibration.dataset", "wikitext2")), "calibration.dataset", "wikitext2",
                   f"the data file {test_copy / 'data' / 'wikitext2' / 'validation.txt'}", test_copy)


def test_the_attackers_prior_needs_wikitext2(test_copy):
    (test_copy / "data" / "wikitext2" / "validation.txt").unlink()
    config = config_with(("privacy.inversion", {"tokens": [3], "steps": 10, "prior_samples": 4, "tiny": [1]}))
    assert_refused(config, "studies.noniid", "wikitext2", "the data file", test_copy,
                   why="also needed by privacy.inversion.prior_samples")


def test_hub_data_skips_the_file_checks(test_copy):
    shutil.rmtree(test_copy / "data")
    check(config_with(("data_dir", None)), test_copy)


@pytest.mark.parametrize("key, value, allowed", [
    ("calibration.c4_docs", [50, 0], "[start, stop) with start < stop"),
    ("evaluation.c4_docs", [50, 50], "[start, stop) with start < stop"),
    ("evaluation.c4_docs", [50, 70], "a range within the 60 documents of"),
    ("evaluation.c4_docs", [40, 60], "documents disjoint from calibration.c4_docs = [0, 50]"),
    ("calibration.c4_docs", None, "a [start, stop) range of C4 documents"),
    ("evaluation.c4_docs", None, "a [start, stop) range of held-out C4 documents"),
])
def test_c4_document_ranges(key, value, allowed):
    assert_refused(config_with((key, value)), key, value, allowed)


def test_c4_ranges_without_c4_evaluation_may_be_anything_ordered():
    # the domain study's C4 guard is a C4 evaluation too: without held-out documents it goes
    check(config_with(("evaluation.datasets", ["wikitext2"]), ("calibration.c4_docs", None),
                      ("evaluation.c4_docs", None), ("domain.evaluation.guards", ["wikitext2"])))
    assert_refused(config_with(("evaluation.datasets", ["wikitext2"]), ("calibration.c4_docs", None),
                               ("evaluation.c4_docs", None)), "evaluation.c4_docs", None,
                   "a range of held-out C4 documents (domain.evaluation.guards has c4)")


# -- the model -----------------------------------------------------------------------------------------


def test_model_path_that_does_not_exist():
    assert_refused(config_with(("model.name", "./modle")), "model.name", "./modle",
                   "an embedded alias (smollm2-135m, gemma3-270m), a model folder with config.json",
                   why="not a hub id")


def test_model_folder_without_config(test_copy):
    (test_copy / "model" / "config.json").unlink()
    assert_refused(config_with(), "model.name", "./model", "a model folder with config.json", test_copy,
                   why="has no config.json")


def test_hub_id_offline_must_be_cached(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = config_with(("model.name", "someone/some-model"))
    assert_refused(config, "model.name", "someone/some-model", "a Hugging Face hub id",
                   why="HF_HUB_OFFLINE is set but the local Hugging Face cache has no config.json")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    check(config)  # online: the first job downloads it

    # in the cache (its layout: refs/main names the snapshot): offline is fine, and its config counts
    snapshot = tmp_path / "hub" / "models--someone--some-model" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc")
    (snapshot / "config.json").write_text(json.dumps({"max_position_embeddings": 16}))
    (snapshot / "model.safetensors").write_bytes(b"{}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_refused(config, "calibration.seqlen", 32, "at most 16 tokens, the context of someone/some-model")


def test_sequence_lengths_within_the_local_models_context():
    """.test/model has max_position_embeddings 256."""
    allowed = "at most 256 tokens, the context of ./model"
    assert_refused(config_with(("evaluation.seqlen", 512)), "evaluation.seqlen", 512, allowed)
    assert_refused(config_with(("calibration.seqlen", 257)), "calibration.seqlen", 257, allowed)
    config = config_with(("privacy.membership.seqlen", 300))
    assert_refused(config, "privacy.membership.seqlen", 300, allowed)
    config = config_with(("privacy.full", {"inversion": {"tokens": [3, 1000]}}))
    assert_refused(config, "privacy.full.inversion.tokens", 1000, allowed)
    check(config_with(("evaluation.seqlen", 256)))


def test_sequence_lengths_within_an_embedded_models_context():
    """Not materialized under .test/: the sizes come from the GGUF header (no weights read)."""
    assert_refused(config_with(("model.name", "smollm2-135m"), ("calibration.seqlen", 8193)),
                   "calibration.seqlen", 8193, "at most 8192 tokens, the context of smollm2-135m")
    check(config_with(("model.name", "smollm2-135m"), ("calibration.seqlen", 8192), ("server.groups", ["2:4"])))


@pytest.mark.slow
def test_embedded_sizes_from_the_gguf_header_are_the_models():
    """The header's sizes as transformers converts them for smollm2-135m (what the jobs load),
    and the published config of Gemma 3 270M (google/gemma-3-270m config.json)."""
    from transformers import AutoConfig

    smollm = EMBEDDED["smollm2-135m"]
    with smollm.gguf() as gguf:
        loaded = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = smollm.config()
    assert config == {k: getattr(loaded, k) for k in config}
    assert EMBEDDED["gemma3-270m"].config() == {
        "max_position_embeddings": 32768, "hidden_size": 640, "intermediate_size": 2048,
        "num_hidden_layers": 18, "num_attention_heads": 4, "head_dim": 256}


# -- the privacy audit ------------------------------------------------------------------------------


def test_privacy_audit_needs_two_clients():
    assert_refused(config_with(("clients.n", 1), ("baselines.local_only_clients", 1)), "clients.n", 1,
                   "at least 2")


def test_sensitivity_neighbours_beyond_the_other_clients_samples():
    # 3 samples over 3 clients: clients 1 and 2 hold 2 replacement samples
    assert_refused(config_with(("privacy.sensitivity", {"neighbours": 3})), "privacy.sensitivity.neighbours", 3,
                   "at most 2, the calibration samples of clients 1..2")
    check(config_with(("privacy.sensitivity", {"neighbours": 2})))


def test_membership_game_sizes():
    membership = {"targets": 4, "pairs": 2, "blocks": 1, "seqlen": 8, "population": 8, "epsilons": [2]}
    config = config_with(("privacy.membership", {**membership, "targets": 9}))
    assert_refused(config, "privacy.membership.targets", 9, "at most privacy.membership.population = 8")
    config = config_with(("privacy.membership", {**membership, "samples": 8}))
    assert_refused(config, "privacy.membership.samples", 8, "less than privacy.membership.population = 8")
    # the full audit's override is named as such (its population comes from the reduced audit)
    config = config_with(("privacy.full", {"membership": {"targets": 20}}))
    assert_refused(config, "privacy.full.membership.targets", 20, "at most privacy.membership.population = 8")


def test_attribute_sizes():
    """Each half of the windows without the property fills a data set; the domain is not the
    calibration data it is told apart from; terms are single words (they name files)."""
    attr = {"terms": ["of"], "samples": 2, "seqlen": 16, "population": 6, "domain_population": 2}
    check(config_with(("privacy.attribute", attr)))
    assert_refused(config_with(("privacy.attribute", {**attr, "population": 5})),
                   "privacy.attribute.population", 5, "at least 2 x privacy.attribute.samples + 2 = 6")
    assert_refused(config_with(("privacy.attribute", {**attr, "domain": "c4"})),
                   "privacy.attribute.domain", "c4", "another dataset than calibration.dataset (c4), or null")
    assert_refused(config_with(("privacy.attribute", {**attr, "seqlen": 300})),
                   "privacy.attribute.seqlen", 300, "at most 256 tokens")
    with pytest.raises(WorkflowError, match="does not match"):
        check(config_with(("privacy.attribute.terms", ["two words"])))


def test_inversion_client_names_clients_of_the_setting():
    check(config_with(("privacy.inversion_client.clients", [0, 2])))
    n = config_with()["clients"]["n"]
    assert_refused(config_with(("privacy.inversion_client.clients", [0, n])),
                   "privacy.inversion_client.clients", [0, n], f"clients of the default setting, 0..{n - 1}")
    with pytest.raises(WorkflowError):  # the schema: distinct clients
        check(config_with(("privacy.inversion_client.clients", [1, 1])))


def test_membership_scale_sizes():
    scale = {"sizes": [[2, 16]], "seeds": [0], "targets": 4, "pairs": 2, "population": 8}
    check(config_with(("privacy.membership_scale", scale)))
    assert_refused(config_with(("privacy.membership_scale", {**scale, "targets": 9})),
                   "privacy.membership_scale.targets", 9, "at most privacy.membership_scale.population = 8")
    assert_refused(config_with(("privacy.membership_scale", {**scale, "sizes": [[2, 16], [8, 16]]})),
                   "privacy.membership_scale.sizes", [8, 16], "samples less than privacy.membership_scale.population = 8")
    with pytest.raises(WorkflowError):  # the schema: [samples, tokens] pairs
        check(config_with(("privacy.membership_scale.sizes", [[2]])))


def test_membership_shared_sizes():
    size = {"samples": 2, "seqlen": 16, "population": 4, "shadows": 4, "clients": 4}
    check(config_with(("privacy.membership_shared", {"sizes": [size], "seeds": [0]})))
    assert_refused(config_with(("privacy.membership_shared.sizes", [{**size, "population": 5}])),
                   "privacy.membership_shared.sizes.population", 5, "a multiple of samples (2) above it")
    assert_refused(config_with(("privacy.membership_shared.sizes", [{**size, "shadows": 3}])),
                   "privacy.membership_shared.sizes.shadows", 3, "a multiple of population / samples = 2")
    assert_refused(config_with(("privacy.membership_shared.sizes", [{**size, "seqlen": 4096}])),
                   "privacy.membership_shared.sizes.seqlen", 4096, "at most")
    with pytest.raises(WorkflowError):  # the schema: every field of a size
        check(config_with(("privacy.membership_shared.sizes", [{"samples": 2}])))


def test_catalog_refusals_are_listed_with_the_rest():
    config = config_with(("studies.fedspallm", {"clients": [2], "standalone_clients": 1, "resources": [0.5] * 3}),
                         ("privacy.defence", {"epsilons": [1], "group": "layer", "datasets": ["wikitext2", "c4"]}),
                         ("evaluation.datasets", ["wikitext2", "ptb"]), ("clients.n", 4))
    message = refusal(config)
    assert "studies.fedspallm.resources: 3 per-client fractions" in message
    assert "clients.n = 4: expected at most calibration.nsamples = 3" in message


def test_every_problem_in_one_message():
    config = config_with(("clients.n", 5), ("calibration.c4_docs", [50, 0]), ("pruning.local_group", "5:4"),
                         ("model.name", "./modle"))
    message = refusal(config)
    assert message.startswith("invalid configuration, 4 problem(s); nothing was run:")
    assert len([line for line in message.splitlines() if line.startswith("  - ")]) == 4


@pytest.mark.parametrize("key, value", [("zeroshot.limit", 0), ("evaluation.windows", 0),
                                        ("baselines.local_only_clients", 0), ("studies.sparsities", []),
                                        ("pruning.sparsity", 1.0), ("zeroshot.tasks", ["rte", "copa"])])
def test_schema_refuses_what_it_can_express(key, value):
    schema_refuses(key, value)


def test_privacy_dp_epsilons_are_distinct_and_finite():
    check(config_with(("privacy.dp", {"epsilons": [2, 8], "delta": 1e-5, "clip": 1.0, "clients": 2})))
    assert_refused(config_with(("privacy.dp.epsilons", [8, 8])), "privacy.dp.epsilons", [8, 8], "distinct finite ε")
    with pytest.raises(WorkflowError):
        check(config_with(("privacy.dp.delta", 1.5)))


# -- the domain study ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key, value, allowed, why", [
    ("domain.public_docs", [40, 55], "C4 documents disjoint from evaluation.c4_docs = [50, 60]",
     "C4 documents 50–54 are the C4 evaluation documents"),
    ("domain.control_docs", [20, 30], "C4 documents disjoint from domain.public_docs = [0, 25]",
     "C4 documents 20–24 would be both public and the control clients' private text"),
    ("domain.public_docs", [30, 20], "[start, stop) with start < stop", None),
    ("domain.control_docs", [25, 70], "a range within the 60 documents of", None),
    ("domain.control_docs", [25, 27], "at least 4 documents / domain.windows_per_unit = 1",
     "2 documents give at most 2"),
    ("domain.detail_sparsities", [0.7], "a subset of domain.sparsities = [0.5]", None),
    ("domain.membership.population", 4, "more than 4 (the largest audited data set", None),
    ("domain.sampling", "random", "disjoint (windows cut by document or span) while domain.mechanisms has DP rows",
     "random offsets with replacement put a token in several windows"),
])
def test_domain_texts_and_sizes(key, value, allowed, why):
    """The public text is never an evaluation set (the message names the overlap), nor the
    control clients' text; the audit's population exceeds the largest data set it audits."""
    assert_refused(config_with((key, value)), key, value, allowed, why=why)


def test_domain_control_can_be_left_out():
    """A control its C4 documents cannot fill is refused (above); with no control sparsities the
    same documents pass and the study plans no control row."""
    from fedlib.catalog.domain import DomainCatalog

    config = config_with(("domain.control_docs", [25, 27]), ("domain.control", {"sparsities": [], "seeds": [0]}))
    check(config)
    assert DomainCatalog(Catalog(with_schema_defaults(config))).spec()["evals"]["control"] == []


def test_domain_headroom_is_checked():
    """domain.headroom (target domain_headroom): the schema refuses an estimator the analysis lacks
    and a zero multiplier; without it the target says what to set."""
    from fedlib.catalog.domain import DomainCatalog

    oracle = {"variants": [{"estimator": "oracle", "epsilon": 8}]}
    refused = schema_refuses("domain.headroom", {"variants": [{"estimator": "exact", "epsilon": 8}]})
    assert "'exact' is not one of" in refused
    schema_refuses("domain.headroom", {"variants": [{"estimator": "oracle", "epsilon": 8, "multipliers": [0]}]})
    validate(config_with(("domain.headroom", oracle)), str(SCHEMA))
    with pytest.raises(ValueError, match="no domain.headroom"):
        DomainCatalog(Catalog(with_schema_defaults(config_with()))).headroom()
    configured = DomainCatalog(Catalog(with_schema_defaults(config_with(("domain.headroom", oracle)))))
    assert configured.headroom()["noise_seeds"] == [0]


def test_domain_headroom_reads_the_pool_of_its_seed_and_the_report_chooses_there():
    """domain.headroom.seed (default: the first data seed) names the pool the analysis reads, the
    pool the report lists its diagnostic on, and the world the report's choice is made in; with the
    analysis on validation the report's inputs include it."""
    from fedlib.catalog.domain import DomainCatalog

    variants = [{"estimator": "posterior", "epsilon": 8}]
    default = DomainCatalog(Catalog(with_schema_defaults(config_with(("domain.headroom", {"variants": variants})))))
    assert default.headroom_setting() == (0.5, 0) and default.spec()["choice"] is None
    chosen = {"variants": variants, "split": "validation", "seed": 3}
    domain = DomainCatalog(Catalog(with_schema_defaults(config_with(("domain.headroom", chosen)))))
    spec = domain.spec()
    assert domain.headroom_setting() == (0.5, 3) and "/private/s3/sp0.5/headroom.json" in domain.headroom_json()
    assert spec["choice"]["seed"] == 3 and spec["diagnostics"][0]["seed"] == 3
    assert spec["choice"]["mechanisms"] == {"threshold": "distributed", "posterior": "distributed_posterior"}
    assert {spec["choice"][k] for k in ("headroom", "public", "central")} <= set(domain.inputs())
    assert spec["choice"]["central"].endswith("/private/s3/sp0.5/central.validation.json")


def test_domain_dp_file_patterns_are_the_files_the_federation_writes():
    """The domain rule's outputs (spelled in the catalog, which the Snakefile reads without torch)
    are the files fedlib.privacy.stages.dp_federation.mask_paths names, for every mechanism."""
    from fedlib.catalog.domain import DomainCatalog
    from fedlib.privacy.stages.dp_federation import mask_paths

    domain = DomainCatalog(Catalog(with_schema_defaults(config_with())))
    releases = domain.releases()
    assert {spec["mechanism"] for spec in releases} == {"normalised", "distributed"}
    for draw in (0, 2):
        folder = Path(domain.dp_dir("private", 0.5, 0, draw))
        expected = [str(p) for spec in releases for p in mask_paths(folder, spec, domain.d["clients"])]
        got = [p.format(kind="private", dseed=0, dsp=0.5, dpdir=domain.dp_name(draw)) for p in domain.dp_file_patterns()]
        assert got == expected and len(got) == len(set(got))
