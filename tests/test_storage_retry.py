"""bert_jax/storage/retry.py: a transient storage fault is tried again; one that another try cannot mend is not."""
import pytest

from bert_jax.storage import retry


class Failing:
    def __init__(self, error: BaseException, times: int):
        self.error, self.times, self.calls = error, times, 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.times:
            raise self.error
        return "read"


@pytest.fixture(autouse=True)
def no_waits(monkeypatch):
    monkeypatch.setattr(retry, "FIRST_WAIT_S", 0.0)


def test_a_dropped_connection_is_tried_again():
    operation = Failing(ConnectionResetError(), retry.ATTEMPTS - 1)
    assert retry.retried(operation, "a read") == "read" and operation.calls == retry.ATTEMPTS


@pytest.mark.parametrize("error", [FileNotFoundError("gs://b/x"), PermissionError("403"), MemoryError(),
                                   ValueError("not storage")], ids=lambda e: type(e).__name__)
def test_a_fault_another_try_cannot_mend_is_raised_at_once(error):
    operation = Failing(error, 1)
    with pytest.raises(type(error)) as raised:
        retry.retried(operation, "a read")
    assert raised.value is error and operation.calls == 1
