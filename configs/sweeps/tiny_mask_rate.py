"""Two arms of configs/tiny.py that differ in mask rate (15 % against 30 %), to be judged downstream.

    bert-jax sweep run --sweep=configs/sweeps/tiny_mask_rate.py --sweep_dir=runs/tiny_mask_rate
    bert-jax sweep evaluate --sweep_dir=runs/tiny_mask_rate --suite=smoke --glue_dir=data/glue
    bert-jax sweep summary --sweep_dir=runs/tiny_mask_rate

Their MLM losses do not compare (each arm predicts another share of its tokens:
`train/masked_fraction`); the summary's downstream columns do. Each arm is configs/tiny.py's
1000 steps (about 6 minutes on 2 idle CPU cores), then the smoke battery runs per arm.
"""


def get_sweep():
    return dict(config="configs/tiny.py", grid={"data.mask_rate": [0.15, 0.3]})
