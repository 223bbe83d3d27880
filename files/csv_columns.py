"""Which columns of an upload hold what: the email column and the Email Finder's person
columns, by the name a person gave, by a recognised header, or by what the cells hold.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verimail.files.upload_errors import UploadError

if TYPE_CHECKING:
    from verimail.files.csv_detect import CsvInfo

# Header names compared after header_key(): case-folded, spaces, `_`, `-` and `.` removed.
# Order is preference when several columns match.
EMAIL_HEADERS: tuple[str, ...] = (
    "email",
    "emailaddress",
    "emails",
    "workemail",
    "businessemail",
    "contactemail",
    "emailaddresses",
    "mail",
    "mailaddress",
    "primaryemail",
    "emailid",
)
PERSON_HEADERS_ADVICE = (
    "Head the columns first_name, last_name and domain (First Name, surname, company_domain "
    "and website work too)."
)
"""How a surface without the API's column fields (the CLI, the dashboard) says to name a
finder upload's columns: by the headers below."""
FIRST_NAME_HEADERS: tuple[str, ...] = ("firstname", "first", "givenname", "fname", "forename")
LAST_NAME_HEADERS: tuple[str, ...] = ("lastname", "last", "surname", "familyname", "lname")
DOMAIN_HEADERS: tuple[str, ...] = (
    "domain",
    "companydomain",
    "website",
    "companywebsite",
    "url",
    "companyurl",
    "websiteurl",
    "web",
    "emaildomain",
)


@dataclass(frozen=True)
class PersonColumns:
    """The Email Finder's input columns: names as in ``CsvInfo.columns`` and 0-based indexes."""

    first_name: str
    last_name: str
    domain: str
    first_name_index: int
    last_name_index: int
    domain_index: int


def looks_like_email(value: str) -> bool:
    """Loose shape test for detection only: one ``@``, text before it, a dotted domain after."""
    value = value.strip()
    if value.count("@") != 1 or any(c.isspace() for c in value):
        return False
    local, domain = value.split("@")
    return bool(local) and "." in domain.strip(".")


_KEY_DROP = re.compile(r"[\s_\-.\ufeff\u200b]+")


def header_key(name: str) -> str:
    """Case- and separator-blind form of a header: ``E-mail Address`` → ``emailaddress``."""
    return _KEY_DROP.sub("", name.removeprefix("ï»¿")).casefold()


def column_listing(columns: Sequence[str], limit: int = 20) -> str:
    """Column names for a message: blanks shown, long names and long lists shortened."""
    shown = [
        (c if len(c) <= 40 else c[:39] + "…") if c.strip() else "(blank)" for c in columns[:limit]
    ]
    more = f" … ({len(columns)} in all)" if len(columns) > limit else ""
    return ", ".join(shown) + more


def resolve_column(columns: Sequence[str], wanted: str, param: str) -> int:
    """0-based index of the column a person named.

    ``#N`` is always the Nth column (what the dashboard's picker sends, and what a job
    stores when a header is used twice). Otherwise, in order: exact name; same name ignoring
    case and surrounding spaces; same :func:`header_key`; a whole number as a 1-based
    position (``1`` is the first column); ``column_N`` (the names headerless files get).
    First match wins among duplicates.
    """
    position = re.fullmatch(r"#(\d+)", wanted.strip())
    if position and 1 <= int(position.group(1)) <= len(columns):
        return int(position.group(1)) - 1
    if wanted in columns:
        return list(columns).index(wanted)
    folded = wanted.strip().casefold()
    for i, c in enumerate(columns):
        if c.strip().casefold() == folded:
            return i
    key = header_key(wanted)
    for i, c in enumerate(columns):
        if key and header_key(c) == key:
            return i
    match = re.fullmatch(r"(?:column[ _]?)?(\d+)", folded)
    if match and 1 <= int(match.group(1)) <= len(columns):
        return int(match.group(1)) - 1
    raise UploadError(
        f"{param} '{wanted}' is not a column of the file; columns are: {column_listing(columns)}."
        + (" A number counts columns from 1." if match else ""),
        fields=(param,),
    )


def column_by_header(columns: Sequence[str], names: Sequence[str]) -> int | None:
    """The first column whose :func:`header_key` is one of ``names``, in their order."""
    keys = [header_key(c) for c in columns]
    for name in names:
        if name in keys:
            return keys.index(name)
    return None


def column_by_content(columns: Sequence[str], data: Sequence[Sequence[str]]) -> int | None:
    """The column where most sampled non-blank values look like addresses (at least half)."""
    best: tuple[float, int, int] | None = None
    for i in range(len(columns)):
        share, hits = _address_share(data, i)
        if share >= 0.5 and (best is None or (share, hits) > best[:2]):
            best = (share, hits, i)
    return best[2] if best else None


def _address_share(data: Sequence[Sequence[str]], index: int) -> tuple[float, int]:
    """(share of the column's non-blank sampled values that are addresses, how many are)."""
    values = [r[index] for r in data if index < len(r) and r[index].strip()]
    hits = sum(1 for v in values if looks_like_email(v))
    return (hits / len(values) if hits else 0.0), hits


def email_like_columns(
    columns: Sequence[str], data: Sequence[Sequence[str]], has_header: bool
) -> list[int]:
    """Every column that would be taken for the email column on its own: a recognised
    header, or at least half of its sampled values addresses (as :func:`column_by_content`)."""
    found = []
    for i, name in enumerate(columns):
        if has_header and header_key(name) in EMAIL_HEADERS:
            found.append(i)
            continue
        if _address_share(data, i)[0] >= 0.5:
            found.append(i)
    return found


def find_person_columns(
    info: CsvInfo,
    first: str | None = None,
    last: str | None = None,
    domain: str | None = None,
) -> PersonColumns:
    """Columns for the Email Finder: the caller's names (see :func:`resolve_column`), else the
    recognised headers; one UploadError names every column still missing."""
    found: dict[str, int] = {}
    missing: list[tuple[str, str]] = []
    specs = (
        ("first_name", first, FIRST_NAME_HEADERS, "first-name"),
        ("last_name", last, LAST_NAME_HEADERS, "last-name"),
        ("domain", domain, DOMAIN_HEADERS, "company-domain"),
    )
    for field, wanted, names, label in specs:
        if wanted is not None and wanted.strip():
            found[field] = resolve_column(info.columns, wanted, f"{field}_column")
            continue
        index = column_by_header(info.columns, names) if info.has_header else None
        if index is None:
            missing.append((label, f"{field}_column"))
        else:
            found[field] = index
    if missing:
        labels = " or ".join(label for label, _ in missing)
        params = ", ".join(param for _, param in missing)
        raise UploadError(
            f"No {labels} column found; columns are: {column_listing(info.columns)}.",
            advice=f"Pass {params} to choose {'it' if len(missing) == 1 else 'them'}.",
            fields=tuple(param for _, param in missing),
        )
    return PersonColumns(
        first_name=info.columns[found["first_name"]],
        last_name=info.columns[found["last_name"]],
        domain=info.columns[found["domain"]],
        first_name_index=found["first_name"],
        last_name_index=found["last_name"],
        domain_index=found["domain"],
    )
