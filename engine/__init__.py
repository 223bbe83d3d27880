"""The verification engine, a plain library: syntax, lists, DNS facts, the SMTP prober
(``smtp/``), verdict and the finder. No Prefect, HTTP, database, typer or Rich: a script
verifies an address in three lines::

    from verimail.config import Settings
    from verimail.engine.core import Engine
    result = asyncio.run(Engine(Settings()).verify("alice@example.com"))
"""
