"""The SMTP prober: sessions and domain sessions (``prober``), reply codes (``replies``),
per-host session caps (``host_slots``) and their cross-process leases (``leases``)."""
