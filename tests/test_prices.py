"""Prices come from one place (store/billing/prices.py): verification per address, finds at the
configured finder price; the routes charge what it says."""

from __future__ import annotations

import pytest
from api_helpers import api_world, assert_error_body, running_app

from verimail.config import Settings
from verimail.store.billing.prices import VERIFY_CREDITS, price


def test_verification_costs_one_credit_per_address() -> None:
    assert VERIFY_CREDITS == 1
    assert price("verify", 1) == 1
    assert price("verify", 500) == 500
    assert price("verify", 0) == 0


def test_a_find_costs_the_configured_finder_price() -> None:
    assert price("find", 1, Settings(finder_charge=7)) == 7
    assert price("find", 3, Settings(finder_charge=7)) == 21
    assert price("find", 2, Settings(finder_charge=0)) == 0


def test_prices_refuse_what_cannot_be_priced() -> None:
    with pytest.raises(ValueError, match="pass settings"):
        price("find", 1)
    with pytest.raises(ValueError, match="cannot price -1"):
        price("verify", -1)


async def test_the_finder_route_asks_the_configured_price(
    testbed_factory, tmp_path, testbed_settings
) -> None:
    """A balance of 6 is short of a find at 7: the 402 names the price the setting gives."""
    tb = testbed_factory(api_world())
    async with running_app(testbed_settings(tb, tmp_path, finder_charge=7)) as api:
        customer = api.customer(credits=6)
        response = await api.client.post(
            "/api/find-email",
            headers=customer.headers,
            json={"first_name": "Alice", "last_name": "Smith", "domain": "acme.test"},
        )
        detail = assert_error_body(response, 402)
        assert "costs 7" in detail and "balance is 6" in detail
