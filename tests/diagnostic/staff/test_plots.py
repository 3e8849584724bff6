"""The job page's plots drawn from stage results: the cold start's phases for the
customer's configuration and with the proved changes on one scale, the head node's
telemetry; each says so in words when there is nothing to draw."""

from __future__ import annotations

from diagnostic.staff.plots import cold_start_waterfall, telemetry_charts

PHASES = [
    {"run": "before", "node": "spark-01", "phase": "weights_load", "start_s": 0.0, "end_s": 400.0},
    {"run": "before", "node": "spark-01", "phase": "graph_capture", "start_s": 400.0, "end_s": 560.0},
    {"run": "before", "node": "spark-02", "phase": "weights_load", "start_s": 0.0, "end_s": 410.0},
    {"run": "after", "node": "spark-01", "phase": "weights_load", "start_s": 0.0, "end_s": 20.0},
    {"run": "after", "node": "spark-01", "phase": "graph_capture", "start_s": 20.0, "end_s": 146.0},
]


def test_the_waterfall_shows_both_starts_of_the_head_node_on_one_scale() -> None:
    svg = str(cold_start_waterfall({"phases": PHASES}))
    assert "Cold start phases on spark-01" in svg
    assert "the customer&#x27;s configuration: 560 lab s" in svg
    assert "with the proved changes: 146 lab s" in svg
    assert svg.count("<rect") == 4  # spark-02's phase is not the head node's
    assert "weights load" in svg and "400 s" in svg and "126 s" in svg
    # One scale: the 146 s start's last bar ends at about a quarter of the 560 s one's.
    widths = [float(part.split('width="', 1)[1].split('"', 1)[0]) for part in svg.split("<rect")[1:]]
    assert abs((widths[2] + widths[3]) / (widths[0] + widths[1]) - 146 / 560) < 0.02
    assert "<script" not in svg and cold_start_waterfall({"phases": None}) is None


def test_a_phase_name_is_text_not_markup() -> None:
    svg = str(cold_start_waterfall({"phases": [{**PHASES[0], "phase": "<b>x</b>"}]}))
    assert "<b>" not in svg and "&lt;b&gt;" in svg


def test_telemetry_charts_from_the_reproduce_result() -> None:
    samples = [{"t": 100.0 + i, "disk_read_mbps": 10.0 * i, "cpu": {"idle": 90.0 - i},
                "mem": {"cached_kib": 1048576 * i}} for i in range(5)]
    charts = [str(c) for c in telemetry_charts({"telemetry": {"spark-02": samples, "spark-01": samples}})]
    assert len(charts) == 3
    assert "spark-01: disk read (peak 40.0 MB/s)" in charts[0] and "4 lab s" in charts[0]
    assert "spark-01: page cache (peak 4.0 GiB)" in charts[2]
    assert telemetry_charts({"telemetry": None}) == [] and telemetry_charts(None) == []
