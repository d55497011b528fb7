"""Safetensors files laid out from shapes and written a range of rows at a time (as each rank writes its
shards) are files safetensors and transformers read; rows read back are the tensor's rows."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from forge_nb.parallel.safetensors_rows import (
    INDEX,
    SINGLE,
    Planned,
    RowReader,
    create,
    layout,
    stored_tensors,
    write_at,
    write_index,
)


def tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(7, 5, generator=gen),
        "b.weight": torch.randn(6, 3, generator=gen).to(torch.bfloat16),
        "c.norm": torch.randn(9, generator=gen),
        "d.steps": torch.arange(4, dtype=torch.int64),
        "e.scale": torch.tensor(2.5),
    }


def write_in_halves(folder, named: dict[str, torch.Tensor], max_file_bytes: int):
    """Lay the files out, create them, then write each tensor's first and second half of rows apart, as
    two ranks would."""
    files = layout([Planned(n, tuple(t.shape), t.dtype) for n, t in named.items()], max_file_bytes)
    for f in files:
        create(folder / f.name, f)
    if len(files) > 1:
        write_index(folder, files)
    for f in files:
        fd = os.open(folder / f.name, os.O_WRONLY)
        for name, start in f.starts.items():
            t = named[name]
            rows = t.shape[0] if t.dim() else 1
            half = (rows + 1) // 2
            row_bytes = t.nbytes // rows
            for first, part in ((0, t[:half]), (half, t[half:])) if t.dim() else ((0, t),):
                write_at(fd, part, start + first * row_bytes)
        os.close(fd)
    return files


def test_one_file_holds_every_tensor_under_transformers_name(tmp_path):
    named = tensors()
    files = write_in_halves(tmp_path, named, max_file_bytes=10**9)
    assert [f.name for f in files] == [SINGLE]
    assert len(files[0].prefix) % 8 == 0  # the data starts 8-byte aligned
    loaded = load_file(tmp_path / SINGLE)
    assert loaded.keys() == named.keys()
    for name, t in named.items():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t), name


def test_several_files_have_transformers_index_and_rows_read_back(tmp_path):
    named = tensors()
    files = write_in_halves(tmp_path, named, max_file_bytes=100)
    assert len(files) > 2 and files[0].name == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((tmp_path / INDEX).read_text())
    assert set(index["weight_map"]) == set(named)
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in named.values())
    stored = stored_tensors(tmp_path)
    assert {n: s.shape for n, s in stored.items()} == {n: tuple(t.shape) for n, t in named.items()}
    with RowReader(stored) as reader:
        assert torch.equal(reader.rows("a.weight", 2, 5), named["a.weight"][2:5])
        assert torch.equal(reader.rows("b.weight", 0, 6), named["b.weight"])
        assert torch.equal(reader.rows("e.scale", 0, 0), named["e.scale"])
    for f in files:
        loaded = load_file(tmp_path / f.name)
        for name in f.starts:
            assert torch.equal(loaded[name], named[name]), name


def test_a_folder_without_safetensors_files_has_no_stored_tensors(tmp_path):
    torch.save({"w": torch.zeros(2)}, tmp_path / "pytorch_model.bin")
    assert stored_tensors(tmp_path) is None


@pytest.mark.parametrize("limit", [1, 10**9])
def test_the_layout_is_a_function_of_names_shapes_and_dtypes(limit):
    planned = [Planned(n, tuple(t.shape), t.dtype) for n, t in tensors().items()]
    first, again = layout(planned, limit), layout(list(planned), limit)
    assert [vars(f) for f in first] == [vars(f) for f in again]


def test_a_truncated_file_is_named_when_its_rows_are_read(tmp_path):
    named = tensors()
    write_in_halves(tmp_path, named, max_file_bytes=10**9)
    with open(tmp_path / SINGLE, "rb+") as f:
        f.truncate(f.seek(0, 2) - 8)
    with RowReader(stored_tensors(tmp_path)) as reader, pytest.raises(OSError, match="a truncated file"):
        reader.rows("e.scale", 0, 0)


def test_rows_are_read_into_a_tensor_straight_or_cast_to_its_dtype(tmp_path):
    named = tensors()
    write_in_halves(tmp_path, named, max_file_bytes=10**9)
    with RowReader(stored_tensors(tmp_path)) as reader:
        same = torch.empty(3, 5)
        reader.read_into("a.weight", 4, same)  # float32 into float32: read in place
        cast = torch.empty(2, 3, dtype=torch.float32)
        reader.read_into("b.weight", 1, cast)  # bfloat16 into float32
        strided = torch.empty(5, 8)[:, :5]  # not contiguous: through a buffer
        reader.read_into("a.weight", 2, strided)
    assert torch.equal(same, named["a.weight"][4:7]) and torch.equal(strided, named["a.weight"][2:7])
    assert torch.equal(cast, named["b.weight"][1:3].float())
