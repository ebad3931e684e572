"""MFU on a device without a data sheet (a CPU): the peak is a matmul measured at start-up, a lower bound that load
makes low, so no logged ratio may pass 1 (issue 69: a run started under load logged "MFU 159.77 %")."""
import time

from bert_jax.train import perf


def test_a_step_faster_than_the_measured_peak_measures_it_again_and_logs_at_most_1():
    calls = []

    def measure_again():
        calls.append(1)
        return 50.0  # still below what the step achieved: the step's own rate bounds the peak

    meter = perf.PerfMeter(flops_per_step=1e3, tokens_per_step=8, peak_flops_total=1.0, num_steps=10,
                           measure_peak=measure_again)
    meter.start(0)
    time.sleep(0.01)
    row = meter.measure(2)
    assert calls == [1]
    assert 0 < row["perf/mfu"] <= 1.0
    assert meter.peak_flops_total >= 1e3 / row["perf/step_time_s"] * (1 - 1e-9)
    assert meter.mfu_label == "MFU (of the measured peak)"
    meter.start(2)
    time.sleep(0.05)  # five times the first interval's step time: under the raised peak, not measured again
    meter.measure(3)
    assert calls == [1]


def test_a_data_sheet_peak_is_never_measured_again():
    meter = perf.PerfMeter(flops_per_step=1e3, tokens_per_step=8, peak_flops_total=1e30, num_steps=10)
    meter.start(0)
    assert meter.measure(1)["perf/mfu"] < 1e-20
    assert meter.mfu_label == "MFU"
