"""Creates Cloud TPU VMs and runs pre-training on every worker.

    bert-jax tpu-vm --help

The flags and the work are launch/tpu_vm.py's (the launcher layer, which the library's sweeps and batteries use too).
"""
from launch import tpu_vm


def main() -> None:
    tpu_vm.main()


if __name__ == "__main__":
    main()
