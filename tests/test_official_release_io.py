"""The release's pickles are read without executing code, and anything but weights is refused with one line."""

import pickle

import pytest
import torch

from animegamer.official.release_io import ReleaseFileError, load_release_pickle, tensor_dict
from tests.helpers.pickle_trap import PickleTrap


def test_plain_weights_load_memory_mapped(tmp_path):
    path = tmp_path / "w.bin"
    torch.save({"a": torch.arange(6.0).reshape(2, 3)}, path)
    state = tensor_dict(load_release_pickle(path), path, "a state dict")
    assert torch.equal(state["a"], torch.arange(6.0).reshape(2, 3))


def test_hostile_pickle_is_refused_without_running(tmp_path):
    path = tmp_path / "evil.bin"
    marker = tmp_path / "ran"
    with open(path, "wb") as f:
        pickle.dump({"x": PickleTrap(marker)}, f)
    torch.save({"payload": PickleTrap(marker)}, tmp_path / "evil_zip.bin")
    for p in (path, tmp_path / "evil_zip.bin"):
        with pytest.raises(ReleaseFileError, match="refused"):
            load_release_pickle(p)
    assert not marker.exists()


def test_truncated_and_wrong_content(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({"a": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(ReleaseFileError, match="damaged or truncated"):
        load_release_pickle(path)
    with pytest.raises(ReleaseFileError, match="not found"):
        load_release_pickle(tmp_path / "missing.bin")
    torch.save({"a": 3}, tmp_path / "ints.bin")
    with pytest.raises(ReleaseFileError, match="not a tensor"):
        tensor_dict(load_release_pickle(tmp_path / "ints.bin"), "ints.bin", "a state dict")


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
@pytest.mark.parametrize("payload, named", [
    (lambda marker: PickleTrap(marker), "makedirs"),
    (lambda marker: __import__("pathlib").Path("/etc/passwd"), "Path"),
    (lambda marker: __import__("collections").OrderedDict(a=__import__("fractions").Fraction(1, 3)), "Fraction"),
], ids=["code", "path", "fraction"])
def test_a_refusal_names_what_was_refused_and_never_advises_loading_it_anyway(tmp_path, zipped, payload, named):
    """PyTorch's message suggests re-running with weights_only=False: for a file that needs it, that runs its code."""
    path, marker = tmp_path / "agent.bin", tmp_path / "ran"
    torch.save({"x": payload(marker)}, path, _use_new_zipfile_serialization=zipped)
    with pytest.raises(ReleaseFileError) as exc:
        load_release_pickle(path)
    message = str(exc.value)
    assert "refused" in message and named in message and "\n" not in message
    assert "weights_only" not in message and "False" not in message and "trusted" not in message
    assert not marker.exists()
