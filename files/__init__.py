"""Files in and out: reading uploads (encoding, delimiter, header, the email and person
columns), job input and results (CSV, details, Parquet), and the DuckDB history."""
