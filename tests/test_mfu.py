"""MFU against one peak for the whole run (bert_jax/train/perf.py): a measured peak (a CPU's) is a lower bound, and an
interval that beats it logs an MFU above 1 as it is, with a warning naming the FLOP count's source, never a peak
raised to fit (issue 76: that clamped the figure at 100 %). Each row carries what its MFU divides."""
import logging
import time

from bert_jax.train import perf


def test_an_interval_faster_than_the_peak_logs_an_mfu_above_1_and_the_peak_stays(caplog):
    meter = perf.PerfMeter(flops_per_step=1e3, tokens_per_step=8, peak_flops_total=1.0, num_steps=10,
                           peak_source=f"{perf.MEASURED} on cpu")
    assert meter.mfu_label == "MFU (of the measured peak)"
    rows = []
    with caplog.at_level(logging.WARNING):
        for step in (2, 3):
            meter.start(step - 1 if rows else 0)
            time.sleep(0.01)
            rows.append(meter.measure(step))
    for row in rows:
        assert row["perf/mfu"] > 1  # 1e3 FLOPs in ~10 ms against a peak of 1 FLOP/s
        assert row["perf/peak_flops"] == 1.0  # never raised
        assert row["perf/flops_per_step"] == 1e3
        assert row["perf/mfu"] == row["perf/flops_per_step"] / row["perf/step_time_s"] / row["perf/peak_flops"]
    warnings = [r.getMessage() for r in caplog.records if "above 100 %" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once, not per row
    assert perf.FORMULA in warnings[0] and perf.MEASURED in warnings[0]


def test_a_data_sheet_peak_is_named_plainly_and_gives_no_warning_below_1(caplog):
    meter = perf.PerfMeter(flops_per_step=1e3, tokens_per_step=8, peak_flops_total=1e30, num_steps=10,
                           peak_source="data sheet for TPU v5p")
    meter.start(0)
    with caplog.at_level(logging.WARNING):
        assert meter.measure(1)["perf/mfu"] < 1e-20
    assert not [r for r in caplog.records if "above 100 %" in r.getMessage()]
    assert meter.mfu_label == "MFU"
