"""Loaders on the real offline mirror, windows and partitions."""

import numpy as np
import pytest
import torch

from fedlib.data import (
    DataError, calibration_windows, evaluation_text, evaluation_windows, iid_partition,
    load_tokens, ptb_rows, save_tokens, wikitext2_rows,
)


def test_wikitext_rows_follow_the_hub_layout(data_dir):
    rows = wikitext2_rows(data_dir, "test")
    assert len(rows) == 4358  # the HF test split has 4358 rows
    assert rows[0] == "" and rows[1] == " = Robert Boulter = \n"
    # HF reports num_bytes = text bytes + 4 bytes of offsets per row: 1290590 - 2*blank + 4*rows
    assert sum(len(r.encode()) for r in rows) + 4 * len(rows) == 1290590 - 2 * rows.count("") + 4 * 4358


def test_ptb_rows_are_stripped_sentences(data_dir):
    rows = ptb_rows(data_dir, "test")
    assert len(rows) == 3761 and rows[0] == rows[0].strip() and rows[0].startswith("no it was n't")


def test_calibration_windows_are_seeded_and_from_allowed_documents(data_dir, smollm_tokenizer):
    a = calibration_windows(smollm_tokenizer, "c4", data_dir, 4, 64, seed=0, docs_range=(0, 50))
    b = calibration_windows(smollm_tokenizer, "c4", data_dir, 4, 64, seed=0, docs_range=(0, 50))
    c = calibration_windows(smollm_tokenizer, "c4", data_dir, 4, 64, seed=1, docs_range=(0, 50))
    assert a.shape == (4, 64) and torch.equal(a, b) and not torch.equal(a, c)
    # every window is a contiguous piece of one of the first 50 documents
    from fedlib.data import c4_documents
    docs = [smollm_tokenizer(d).input_ids for d in c4_documents(data_dir)[:50]]
    for window in a.tolist():
        assert any(
            any(doc[i : i + 64] == window for i in range(len(doc) - 63)) for doc in docs
        )


def test_evaluation_windows_are_non_overlapping_and_evenly_spaced(data_dir, smollm_tokenizer):
    all_windows, total = evaluation_windows(smollm_tokenizer, "ptb", data_dir, 128)
    some, total2 = evaluation_windows(smollm_tokenizer, "ptb", data_dir, 128, max_windows=5)
    ids = smollm_tokenizer(evaluation_text("ptb", data_dir, None), return_tensors="pt").input_ids[0]
    assert total == total2 == ids.numel() // 128 == all_windows.shape[0]
    torch.testing.assert_close(all_windows.reshape(-1).long(), ids[: total * 128])
    picks = np.linspace(0, total - 1, 5).round().astype(int)
    assert torch.equal(some, all_windows[torch.as_tensor(picks)])


def test_c4_evaluation_uses_held_out_documents(data_dir):
    from fedlib.data import c4_documents
    docs = c4_documents(data_dir)
    assert evaluation_text("c4", data_dir, (800, 1000)) == " ".join(docs[800:1000])


def test_iid_partition_keeps_every_sample_once():
    parts = iid_partition(33, 8, seed=0)
    flat = sorted(i for part in parts for i in part)
    assert flat == list(range(33)) and {len(p) for p in parts} == {4, 5}
    assert parts == iid_partition(33, 8, seed=0) and parts != iid_partition(33, 8, seed=1)
    with pytest.raises(DataError):
        iid_partition(3, 4, 0)


def test_missing_dataset_names_the_path(tmp_path, smollm_tokenizer):
    with pytest.raises(DataError, match=str(tmp_path / "c4" / "train.jsonl")):
        calibration_windows(smollm_tokenizer, "c4", tmp_path, 1, 8, 0)
    (tmp_path / "c4").mkdir()
    (tmp_path / "c4" / "train.jsonl").write_text('{"text": "short"}\nnot json\n')
    with pytest.raises(DataError, match="train.jsonl:2"):
        calibration_windows(smollm_tokenizer, "c4", tmp_path, 1, 8, 0)


def test_token_file_round_trip_and_errors(tmp_path):
    ids = torch.randint(0, 100, (3, 7))
    save_tokens(tmp_path / "t.safetensors", ids, dataset="c4", rows=[1, 2])
    back, meta = load_tokens(tmp_path / "t.safetensors")
    assert torch.equal(back, ids) and meta == {"dataset": "c4", "rows": [1, 2]}
    (tmp_path / "bad.safetensors").write_bytes(b"nonsense")
    with pytest.raises(DataError, match="bad.safetensors"):
        load_tokens(tmp_path / "bad.safetensors")
