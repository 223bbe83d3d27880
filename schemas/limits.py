"""Bounds the contract states, shared by the models here and the parts that enforce them
(the engine's deadline, the store's column sizes): one number each."""

MAX_EMAIL_LENGTH = 320
"""Longest address stored or accepted (64-octet local part + ``@`` + 255-octet domain)."""
MAX_BATCH = 500
"""Most addresses per batch request (SPEC §8)."""
TIMEOUT_MIN = 1.0
TIMEOUT_MAX = 60.0
"""Bounds of a synchronous call's deadline (API ``timeout``, CLI ``--timeout``), seconds."""
MAX_JSON_BULK = 10_000
"""Most addresses per JSON bulk job (``POST /api/verify/bulk``)."""
NAME_MAX_LENGTH = 100
"""Longest first or last name the Email Finder looks up (the API and a finder job's rows)."""
DOMAIN_MAX_LENGTH = 300
"""Longest domain the Email Finder takes as sent: a pasted URL is trimmed to its host, so
this leaves some slack."""
DOMAIN_PATTERN = r"[^.\s]\.[^.\s]"
"""What every domain the Email Finder takes has (a dot between two labels): stated in the
schema; the finder's own check, stricter, words the refusal."""
MAX_EVERY_DAYS = 365
"""Longest re-verification schedule, in days; also how far ahead its first run may be."""
MAX_FORM_FIELD_LENGTH = 2048
"""Longest text field of a multipart upload form (a column name, a webhook URL), in
characters."""
MAX_URL_LENGTH = 2048
"""Longest webhook URL."""
MAX_INT = 2**31 - 1
"""The largest value of an ``Integer`` column (32 bits on PostgreSQL): ids, credits, counts;
the bound of every id and count a surface accepts (``store.tables`` sizes its columns by it)."""
MAX_PAGE = 100
"""Most items per page of a list (jobs, the credit ledger); 20 unless ``limit`` says."""
MAX_USAGE_DAYS = 366
"""Longest range of ``GET /api/account/usage``, in days (a year, a leap one included)."""
DATE_TEXT = r"\d{4}-\d{2}-\d{2}"
"""How a date (and a date-time) a query takes begins: Pydantic alone reads ``0`` and
``1e12`` as Unix times, which the document (``format: date``, ``date-time``) does not allow."""
