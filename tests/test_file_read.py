"""``read_file``: a large file read by two threads is the file, byte for byte."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from verimail.files import file_read
from verimail.files.file_read import PARALLEL_MIN, read_file


@pytest.mark.parametrize("size", [0, 1, 1000, PARALLEL_MIN - 1, PARALLEL_MIN, PARALLEL_MIN + 7])
def test_read_file_is_the_files_bytes(tmp_path: Path, size: int) -> None:
    data = random.Random(size).randbytes(size)
    path = tmp_path / "upload.csv"
    path.write_bytes(data)
    got = read_file(path)
    assert type(got) is bytes
    assert len(got) == size and got == data
    assert hash(got) == hash(data)  # a finished, ordinary bytes object


@pytest.mark.parametrize("size", [1, 2, 3, 9])
def test_tiny_files_split_in_two_halves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """Halves of zero or one byte (the split rounds down) are still read whole."""
    monkeypatch.setattr(file_read, "PARALLEL_MIN", 1)
    path = tmp_path / "small.csv"
    path.write_bytes(bytes(range(65, 65 + size)))
    assert read_file(path) == bytes(range(65, 65 + size))


@pytest.mark.parametrize("skew", [-5, 5], ids=["grew", "shrank"])
def test_a_file_whose_size_changes_is_read_plainly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skew: int
) -> None:
    """Measured at one size, found at another: the plain read gives the bytes there are,
    never a buffer with a hole or a cut-off tail."""
    data = random.Random(3).randbytes(PARALLEL_MIN + 11)
    path = tmp_path / "changing.csv"
    path.write_bytes(data)
    real_fstat = os.fstat

    class _Stat:
        def __init__(self, fd: int) -> None:
            self.st_size = real_fstat(fd).st_size + skew

    def fstat(fd: int) -> Any:
        return _Stat(fd)

    monkeypatch.setattr(file_read.os, "fstat", fstat)
    assert read_file(path) == data


def test_populating_faults_the_pages_in_beforehand() -> None:
    """After ``_populate`` writing to each page of a fresh mapping faults no more (the kernel
    did it in one call), and what the pages held is unchanged."""
    import ctypes
    import mmap
    import resource

    pages = 256
    size = pages * mmap.PAGESIZE

    def faults_writing(buffer: mmap.mmap) -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for page in range(pages):
            buffer[page * mmap.PAGESIZE] = 7
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    plain = mmap.mmap(-1, size)
    assert faults_writing(plain) >= pages // 2  # the baseline: a fault per page, or near
    populated = mmap.mmap(-1, size)
    populated[size - 1] = 9  # (one page touched already: it keeps its byte)
    address = ctypes.addressof(ctypes.c_char.from_buffer(populated))
    if not file_read._populate(address, size):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE")
    assert faults_writing(populated) < pages // 8
    assert populated[size - 1] == 9 and populated[1] == 0
