"""One settings namespace: BATCHING keys, each overridden by BATCHING_<KEY>, validated
with errors that name both; documented in docs/configuration.md by the names that work."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from dynamic_batching.conf import KEYS, BatchingSettings, read

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_defaults_and_derived_defaults() -> None:
    values = read({}, {})
    assert values["VISIBILITY_TIMEOUT_S"] == 30 and values["LEDGER_GRACE_S"] == 70
    assert read({"VISIBILITY_TIMEOUT_S": 12}, {})["BATCH_HARD_LIMIT_S"] == 8


def test_the_environment_wins_over_the_dict_and_the_dict_over_the_default() -> None:
    assert read({"REQUEST_EVENTS": True}, {"BATCHING_REQUEST_EVENTS": "0"})["REQUEST_EVENTS"] is False
    assert read({"REQUEST_EVENTS": False}, {})["REQUEST_EVENTS"] is False
    assert read({}, {"BATCHING_DEVICES": "cpu:0, cpu:1"})["DEVICES"] == ["cpu:0", "cpu:1"]
    assert read({}, {"BATCHING_DEFAULT_QUOTA": "rate_per_s=5,burst=9"})["DEFAULT_QUOTA"] == {
        "rate_per_s": 5.0,
        "burst": 9.0,
    }


def test_a_value_out_of_range_names_the_variable_and_the_key() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"BATCHING_COLLECTOR_WINDOW \(BATCHING\['COLLECTOR_WINDOW'\]\)"):
        read({"COLLECTOR_WINDOW": 0}, {})
    with pytest.raises(ImproperlyConfigured, match="BATCHING_PREEMPTION cannot be read"):
        read({}, {"BATCHING_PREEMPTION": "maybe"})


def test_an_unknown_key_is_refused_not_ignored() -> None:
    # The old names (REQUEST_EVENTS was read into BATCHING_REQUEST_EVENTS) failed silently.
    with pytest.raises(ImproperlyConfigured, match="unknown keys.*BATCHING_REQUEST_EVENTS"):
        read({"BATCHING_REQUEST_EVENTS": False}, {})


def test_the_accessor_rereads_when_the_setting_changes(batching_settings) -> None:  # type: ignore[no-untyped-def]
    from dynamic_batching.conf import conf

    batching_settings(COLLECTOR_WINDOW=7)
    assert conf.COLLECTOR_WINDOW == 7
    with conf.override(COLLECTOR_WINDOW=9):
        assert conf.COLLECTOR_WINDOW == 9
    assert conf.COLLECTOR_WINDOW == 7
    with pytest.raises(AttributeError, match="no batching setting"):
        BatchingSettings().NOPE  # noqa: B018


def test_every_key_is_documented_by_its_key_and_its_variable() -> None:
    doc = DOC.read_text()
    missing = [k for k in KEYS if f"| `{k}` | `BATCHING_{k}` |" not in doc]
    assert missing == []
