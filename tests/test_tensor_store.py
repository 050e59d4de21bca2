import pytest
import torch

from animegamer.data.tensor_store import TensorStore


def test_store_append_and_reload(tmp_path):
    store = TensorStore(tmp_path / "s")
    assert len(store) == 0
    store.write_shard({"a": {"x": torch.ones(2, 3), "y": torch.zeros(1)}, "b": {"x": torch.full((2, 3), 2.0)}})
    store.write_shard({"c": {"x": torch.arange(3.0)}})
    assert store.write_shard({}) is None
    again = TensorStore(tmp_path / "s")
    assert again.clip_ids() == ["a", "b", "c"] and "b" in again
    assert torch.equal(again.load("b")["x"], torch.full((2, 3), 2.0))
    assert set(again.load("a")) == {"x", "y"} and list(again.load("a", ("y",))) == ["y"]
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "index.json", "shard_00000.safetensors", "shard_00001.safetensors"]
    with pytest.raises(KeyError, match="'zz'"):
        again.load("zz")
    with pytest.raises(KeyError, match="no \\['q'\\]"):
        again.load("a", ("q",))
