"""`plan --tpu` prints the run's length, per stage, in hours and chip-hours, as a lower bound."""
from bert_jax.plan.run_length import StageLength, format_run_length


def test_run_length_is_steps_times_the_step_bound_per_stage_in_hours_and_chip_hours():
    stages = [StageLength("steps 1-900,000 (seq 128, batch 256)", 900_000, 0.1, 16),
              StageLength("steps 900,001-1,000,000 (seq 512, batch 256)", 100_000, 0.36, 16, exact_step=False)]
    assert stages[0].hours == 25.0 and stages[0].chip_hours == 400.0
    assert stages[1].hours == 10.0 and stages[1].chip_hours == 160.0
    text = format_run_length(stages)
    assert "Run length (a lower bound)" in text
    assert "| steps 1-900,000 (seq 128, batch 256) | 900,000 | 100.00 | ≥ 25.0 | ≥ 400 |" in text
    assert "| steps 900,001-1,000,000 (seq 512, batch 256) | 100,000 | ≥ 360.00 | ≥ 10.0 | ≥ 160 |" in text
    assert "| all | 1,000,000 | | ≥ 35.0 | ≥ 560 |" in text
    assert "| 10 | 100.00 | ≥ 0.000278 | ≥ 0.00111 |" in format_run_length([StageLength("s", 10, 0.1, 4)])
