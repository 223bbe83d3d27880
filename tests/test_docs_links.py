"""Every link in README.md and docs/*.md names a file (and heading) inside the repository:
the documentation ships with the code, so it may neither point at the internet nor at
documents next to the checkout (``../shared/...``) that a user of the repository lacks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
# [text](target) and ![alt](target), a target without spaces, optionally "a title"
MD_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
HTML_ATTR = re.compile(r"\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
AUTOLINK = re.compile(r"<((?:https?|ftp|mailto):[^>\s]+)>", re.IGNORECASE)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _prose(text: str) -> str:
    """The text a reader follows links in: no HTML comments, code blocks or code spans."""
    return CODE_SPAN.sub("", FENCE.sub("", COMMENT.sub("", text)))


def links(text: str) -> list[str]:
    prose = _prose(text)
    found = [
        m.group(1) for pattern in (MD_LINK, REF_DEF, HTML_ATTR) for m in pattern.finditer(prose)
    ]
    return found + [m.group(1) for m in AUTOLINK.finditer(prose)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    result: set[str] = set()
    text = FENCE.sub("", COMMENT.sub("", path.read_text(encoding="utf-8")))
    for match in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.MULTILINE):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def problems(document: Path, root: Path = REPO) -> list[str]:
    """What is wrong with each link of ``document`` (empty when every one resolves)."""
    text = document.read_text(encoding="utf-8")
    found: list[str] = []
    if "../shared" in text:
        found.append("mentions ../shared (outside the repository)")
    for target in links(text):
        if SCHEME.match(target) or target.startswith("//"):
            found.append(f"{target}: points outside the repository")
            continue
        path_part, _, fragment = target.partition("#")
        path = (document.parent / path_part).resolve() if path_part else document
        if not path.is_relative_to(root):
            found.append(f"{target}: outside the repository")
        elif not path.exists():
            found.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            found.append(f"{target}: no heading #{fragment} in {path.name}")
    return found


def test_the_readme_is_a_front_door_and_links_every_docs_page():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(readme)}
    orphans = [p.name for p in DOCUMENTS[1:] if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_link_resolves_inside_the_repository(document: Path):
    assert problems(document) == []


def test_the_checker_catches_what_it_should(tmp_path: Path):
    """The checks above could pass by finding no links at all; here each kind of bad link
    is caught, and the good ones (and anything in code or a comment) are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "cli.md").write_text("# Commands\n\n## History shortcuts\n")
    doc = tmp_path / "docs" / "probe.md"
    doc.write_text(
        "# Title\n\nSee [spec](../../shared/spec/SPEC.md), [web](https://example.com/x),\n"
        "[gone](docs/nowhere.md), [anchor](#no-such-heading), ![img](images/none.png),\n"
        "[ok](#title), [cli](cli.md#history-shortcuts) and `[code](https://code.example)`.\n"
        "<!-- [hidden](https://commented.example) -->\n\n```\n[x](https://fenced.example)\n```\n",
        encoding="utf-8",
    )
    found = problems(doc, root=tmp_path)
    assert found == [
        "mentions ../shared (outside the repository)",
        "../../shared/spec/SPEC.md: outside the repository",
        "https://example.com/x: points outside the repository",
        "docs/nowhere.md: no such file",
        "#no-such-heading: no heading #no-such-heading in probe.md",
        "images/none.png: no such file",
    ]


DOC_PATH = re.compile(r"\bdocs/[\w./-]+\.md\b")


@pytest.mark.parametrize(
    "source",
    [REPO / "Makefile", REPO / "pyproject.toml", *sorted((REPO / "bench").glob("*.py"))],
    ids=lambda path: path.name,
)
def test_documents_named_outside_the_docs_exist(source: Path) -> None:
    """The Makefile, pyproject.toml and the benchmarks name documents in comments and
    messages; each must exist (the Makefile cited a ``docs/testing.md`` that never did)."""
    missing = sorted(
        {m.group(0) for m in DOC_PATH.finditer(source.read_text())}
        - {p.relative_to(REPO).as_posix() for p in DOCUMENTS}
    )
    assert not missing, f"{source.name} names {missing}, which do not exist"
