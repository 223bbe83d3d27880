"""Generated CSV uploads for the ingest benchmark.

``write_upload(path, rows, seed)`` writes a 6-column contact list the way CRMs and
spreadsheets export them: a header ``id,first_name,last_name,Email,company,notes``, CRLF line
ends, quoted fields where a value holds a comma or quotes (a company ``"Acme, Inc."`` on ~5% of
rows, a note with ``""quoted""`` words on ~2%), ~1% blank email cells, ~10% repeated addresses
(half of them with the domain in upper case), domains drawn from a skewed pool.
"""

from __future__ import annotations

import random
from pathlib import Path

FIRST = "anna ben carla david emma felix greta hugo ida jonas karl lena max nina oskar"
LAST = "adams baker clark davis evans fisher green hall irwin jones king lewis moore nash"
WORDS = "call back next week prefers email met at fair new lead vip asked for pricing"


def write_upload(path: Path, rows: int, seed: int = 7) -> dict[str, int]:
    """Write the file; returns what a correct reader must find (rows, blanks, uniques)."""
    rng = random.Random(seed)
    first_names, last_names, words = FIRST.split(), LAST.split(), WORDS.split()
    n_domains = max(10, rows // 50)
    domains = [f"company{i:06d}.example" for i in range(n_domains)]
    weights = [1.0 / (r + 1) ** 0.8 for r in range(n_domains)]
    picks = rng.choices(range(n_domains), weights=weights, k=rows)
    issued: list[str] = []
    uniques: set[str] = set()
    blanks = 0
    with path.open("w", encoding="utf-8", newline="") as fh:
        fh.write("id,first_name,last_name,Email,company,notes\r\n")
        for i in range(rows):
            first, last = rng.choice(first_names), rng.choice(last_names)
            roll = rng.random()
            if roll < 0.01:
                email = ""
                blanks += 1
            elif roll < 0.11 and issued:
                email = rng.choice(issued)
                if rng.random() < 0.5:
                    local, _, dom = email.rpartition("@")
                    email = f"{local}@{dom.upper()}"
            else:
                email = f"{first}.{last}{i}@{domains[picks[i]]}"
                issued.append(email)
            if email:
                local, _, dom = email.rpartition("@")
                uniques.add(f"{local}@{dom.lower()}")
            company = f"Company {picks[i]}"
            if rng.random() < 0.05:
                company = f'"{company}, Inc."'
            note = " ".join(rng.choices(words, k=3))
            if rng.random() < 0.02:
                note = f'"said ""{note}"" on the phone"'
            fh.write(f"{i},{first.title()},{last.title()},{email},{company},{note}\r\n")
    return {"rows": rows, "blank_emails": blanks, "unique_addresses": len(uniques)}
