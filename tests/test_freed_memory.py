"""What a downstream probe frees is given back without costing the pre-training its compiled step
(bert_jax/run/freed_memory.py; the hour that shows the flat RSS is bench/long_haul.py's)."""
import logging

import jax
import jax.numpy as jnp
from jax._src import pjit

from bert_jax.run import freed_memory


def test_traces_entries_go_and_a_compiled_step_is_not_compiled_again(caplog):
    @jax.jit
    def step(x):
        return jnp.einsum("ij,jk->ik", x, x)

    x = jnp.ones((4, 4))
    expected = step(x)
    for _ in range(3):  # a probe's model traced anew: each einsum call leaves an entry nothing hits again
        jax.jit(lambda y: jnp.einsum("ij,jk->ik", y, y)).lower(x)
    assert pjit._infer_params_cached.cache_info().currsize >= 3

    freed_memory.give_back()
    assert pjit._infer_params_cached.cache_info().currsize == 0
    with caplog.at_level(logging.DEBUG), jax.log_compiles(True):
        again = step(x)
    assert not [r for r in caplog.records if "Compiling" in r.getMessage()], "the step was compiled again"
    assert jnp.array_equal(again, expected)
