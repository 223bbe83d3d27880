"""A CSV header is read whole up to MAX_COLUMNS columns (20,000): the count in errors is
right, a column anywhere in it is found, and a wider file is refused with 413 naming the
limit. (A header of 20,000 names is ~130 KB, twice what the sample starts with.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from api_helpers import api_world, assert_error_body, running_app, total_balance

from verimail.files.csv_detect import MAX_COLUMNS, inspect_csv
from verimail.files.upload_errors import UploadError, UploadTooLarge


def _wide_file(path: Path, columns: int, email_at: int, name: str = "email") -> Path:
    """A header of ``columns`` names (``name`` at ``email_at``) and one row whose cell
    under it is an address."""
    header = [f"c{i}" for i in range(columns)]
    header[email_at] = name
    row = [""] * columns
    row[email_at] = "alice@acme.test"
    path.write_text(",".join(header) + "\n" + ",".join(row) + "\n", encoding="utf-8")
    return path


def test_a_recognised_header_in_the_last_column_allowed_is_found(tmp_path: Path) -> None:
    path = _wide_file(tmp_path / "wide.csv", MAX_COLUMNS, MAX_COLUMNS - 1)
    info = inspect_csv(path, max_rows=10)
    assert len(info.columns) == MAX_COLUMNS
    assert info.email_index == MAX_COLUMNS - 1
    assert (info.row_count, info.email_count) == (1, 1)


def test_a_named_column_far_past_the_first_sample_is_found(tmp_path: Path) -> None:
    path = _wide_file(tmp_path / "wide.csv", MAX_COLUMNS, MAX_COLUMNS - 100, name="contact")
    info = inspect_csv(path, max_rows=10, email_column="contact")
    assert info.email_index == MAX_COLUMNS - 100
    assert info.email_count == 1


def test_an_unknown_column_counts_every_column_of_the_header(tmp_path: Path) -> None:
    path = _wide_file(tmp_path / "wide.csv", MAX_COLUMNS, 5)
    with pytest.raises(UploadError) as refused:
        inspect_csv(path, max_rows=10, email_column="nope")
    assert f"({MAX_COLUMNS} in all)" in refused.value.detail


def test_one_column_more_than_the_limit_is_refused_naming_it(tmp_path: Path) -> None:
    path = _wide_file(tmp_path / "wider.csv", MAX_COLUMNS + 1, 0)
    with pytest.raises(UploadTooLarge) as refused:
        inspect_csv(path, max_rows=10)
    assert f"{MAX_COLUMNS + 1:,} columns" in refused.value.detail
    assert f"at most {MAX_COLUMNS:,}" in refused.value.detail


async def test_the_api_refuses_a_too_wide_upload_with_413(
    testbed_factory, testbed_settings, tmp_path: Path
) -> None:
    tb = testbed_factory(api_world())
    settings = testbed_settings(tb, tmp_path / "data")
    data = _wide_file(tmp_path / "wider.csv", MAX_COLUMNS + 1, 0).read_bytes()
    async with running_app(settings) as app:
        customer = app.customer(credits=10)
        response = await app.client.post(
            "/api/bulk",
            headers=customer.headers,
            files={"file": ("wider.csv", data, "text/csv")},
        )
        assert f"at most {MAX_COLUMNS:,} columns" in assert_error_body(response, 413)
        assert total_balance(app.store, customer.account_id) == 10
