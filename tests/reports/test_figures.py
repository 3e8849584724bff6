"""How the report prints figures: one function per kind, shared with the read-back tests."""

from __future__ import annotations

from reports import figures as fig


def test_rates_print_to_one_decimal() -> None:
    assert fig.tps(25.949) == "25.9"
    assert fig.tps(26.04) == "26.0"
    assert fig.tps(16.0) == "16.0"


def test_negative_changes_use_a_true_minus_and_positive_ones_a_plus() -> None:
    assert fig.signed(-416.0, fig.seconds) == "\u2212416 s"
    assert fig.signed(1.94, fig.tps) == "+1.9"
    assert fig.signed(0.0, fig.tps) == "0.0"


def test_an_interval_uses_an_en_dash_and_a_change_interval_keeps_its_signs() -> None:
    assert fig.interval([25.666, 26.372], fig.tps) == "25.7\u201326.4"
    assert fig.signed_interval([-216.48, -202.77], fig.seconds) == "[\u2212216 s,\u00a0\u2212203 s]"
    assert fig.signed_interval([1.41, 2.4], fig.tps) == "[+1.4,\u00a0+2.4]"


def test_durations_print_in_seconds_and_minutes() -> None:
    assert fig.seconds(562.8) == "563 s"
    assert fig.seconds(4.24) == "4.2 s"
    assert fig.seconds(0.352) == "0.35 s"
    assert fig.minutes(562.8) == "9.4 min"
    assert fig.milliseconds(0.3704) == "370 ms"


def test_fractions_print_as_percentages_without_needless_decimals() -> None:
    assert fig.percent(1.0) == "100 %"
    assert fig.percent(0.0) == "0 %"
    assert fig.percent(41 / 42) == "97.6 %"


def test_a_key_names_its_unit_by_one_of_its_words() -> None:
    assert fig.unit_for_key("cold_start_s") == "s"
    assert fig.unit_for_key("decode_tps.code") == "tok/s"
    assert fig.unit_for_key("disk_read_mbps_mean") == "MB/s"
    assert fig.unit_for_key("data_nic_mbps_mean") == "Mbit/s"
    assert fig.unit_for_key("canary_pass_rate") == "fraction"
    assert fig.unit_for_key("bootstrap_retries") == ""


def test_numbers_without_a_unit_are_grouped_or_kept_to_four_digits() -> None:
    assert fig.number(262144) == "262,144"
    assert fig.number(5260.0) == "5,260"
    assert fig.number(812.4) == "812.4"
    assert fig.number(0.004) == "0.004"
    assert fig.number(True) == "yes"
