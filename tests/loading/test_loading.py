"""PackedLoader: parts into their rows of a fused parameter, and errors that name the tensor."""
import pytest
import torch
from torch import nn

from rose_backend.loading import PackedLoader


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(2, 6)          # q, k, v: 2 rows each
        self.out = nn.Linear(2, 2)


def shards(name):
    return {"q": (0, 2), "k": (2, 2), "v": (4, 2)} if name.startswith("qkv.") else {None: (0, 0)}


def loader(m):
    return PackedLoader(m, "folder", shards)


def test_parts_land_in_their_rows_and_everything_is_accounted_for():
    m = Tiny()
    ld = loader(m)
    with torch.no_grad():
        for i, part in enumerate("qkv"):
            ld.copy("qkv.weight", torch.full((2, 2), float(i)), part)
            ld.copy("qkv.bias", torch.full((2,), float(i)), part)
        ld.copy("out.weight", torch.eye(2))
        ld.copy("out.bias", torch.zeros(2))
    ld.finish()
    assert m.qkv.weight[:, 0].tolist() == [0, 0, 1, 1, 2, 2] and m.qkv.bias.tolist() == [0, 0, 1, 1, 2, 2]


def test_missing_unexpected_and_misshapen_weights_are_named():
    m = Tiny()
    ld = loader(m)
    with torch.no_grad():
        ld.copy("qkv.weight", torch.zeros(2, 2), "q")
        with pytest.raises(KeyError, match="unexpected weight 'encoder.extra'"):
            ld.copy("extra", torch.zeros(1), raw_name="encoder.extra")
        with pytest.raises(ValueError, match=r"'out.weight' has shape \(3, 2\), expected \(2, 2\)"):
            ld.copy("out.weight", torch.zeros(3, 2))
    with pytest.raises(KeyError, match=r"missing .*'out.bias', 'qkv.bias\[k\]'"):
        ld.finish()


def test_a_model_folder_may_be_named_by_an_environment_variable(tmp_path, monkeypatch):
    """A served config names the folder as "$VAR" (no local path shows); an unset variable is named."""
    from rose_backend.config import ModelFolderError, resolve_model_dir
    monkeypatch.setenv("ROSE_TEST_MODELS", str(tmp_path))
    assert resolve_model_dir("$ROSE_TEST_MODELS/bge") == (tmp_path / "bge").resolve()
    monkeypatch.delenv("ROSE_TEST_MODELS")
    with pytest.raises(ModelFolderError, match=r"'\$ROSE_TEST_MODELS/bge' names an environment variable"):
        resolve_model_dir("$ROSE_TEST_MODELS/bge")
