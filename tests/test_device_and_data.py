"""The device helper and the course's example data."""

from __future__ import annotations

import pytest
import torch

from conftest import CUDA
from mha_course import (
    DEVICE_ENV_VAR,
    RUNNING_WORDS,
    causal_mask,
    get_device,
    random_batch,
    running_example,
    three_token_example,
    visibility,
)


def test_default_device_order(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV_VAR, raising=False)
    expected = "cuda" if torch.cuda.is_available() else (
        "mps" if torch.backends.mps.is_available() else "cpu")
    assert get_device().type == expected


def test_environment_variable_overrides(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV_VAR, "cpu")
    assert get_device() == torch.device("cpu")


def test_unavailable_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(DEVICE_ENV_VAR, "cuda")
    with pytest.raises(RuntimeError, match=r"MHA_COURSE_DEVICE='cuda' asks for CUDA, but torch sees no CUDA device"
                                           r".*Use 'cpu', or unset MHA_COURSE_DEVICE"):
        get_device()


def test_unavailable_device_from_an_argument_names_the_argument(monkeypatch):
    """The advice to unset the environment variable is for a value that came from it, not from an argument."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(DEVICE_ENV_VAR, "cpu")
    for name in ("prefer", "--device"):
        with pytest.raises(RuntimeError, match=rf"^{name}='cuda' asks for CUDA.*Use 'cpu' instead\.$"):
            get_device("cuda", name=name)
    monkeypatch.setattr("mha_course.device._mps_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"^prefer='mps' asks for Apple MPS.*Use 'cpu' instead\.$"):
        get_device("mps")


def test_the_bench_command_names_its_option_once(monkeypatch, capsys):
    from mha_course.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--quick", "--device", "gpu0"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("python -m mha_course bench: error: --device must name a torch device such as 'cpu', "
                           "'cuda' or 'mps', got 'gpu0'.")
    assert main(["bench", "--quick", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device='cuda' asks for CUDA" in err and "Use 'cpu' instead." in err and DEVICE_ENV_VAR not in err


def test_nonsense_device_name(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV_VAR, raising=False)
    with pytest.raises(ValueError, match=r"prefer must name a torch device such as 'cpu'.*got 'gpu0'"):
        get_device("gpu0")


@CUDA
def test_cuda_preferred_when_present(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV_VAR, raising=False)
    assert get_device().type == "cuda"


def test_running_example():
    x = running_example()
    assert x.shape == (6, 3) and len(RUNNING_WORDS) == 6
    assert running_example(batch=True).shape == (1, 6, 3)
    torch.testing.assert_close(x[1], torch.tensor([0.55, 0.87, 0.66]))


def test_three_token_example():
    assert three_token_example().shape == (3, 3)
    assert three_token_example(batch=True).shape == (1, 3, 3)


def test_random_batch_is_reproducible_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    a, b = random_batch(2, 4, 3, seed=7), random_batch(2, 4, 3, seed=7)
    assert torch.equal(a, b) and not torch.equal(a, random_batch(2, 4, 3, seed=8))
    assert torch.equal(state, torch.get_rng_state())


def test_mask_and_visibility_are_complements():
    assert torch.equal(visibility(3), torch.tensor([[True, False, False], [True, True, False], [True, True, True]]))
    assert torch.equal(~causal_mask(5), visibility(5))
