"""What every model.py does first inside Triton's Python stub (rose_backend/triton/stub_path.py): the
launcher's paths (ROSE_PYTHONPATH) end up ahead of the stub's own, with what their .pth files add,
paths the stub already has stay where they are, and the model.py's appended copy is gone."""
import os
import sys

from rose_backend.triton.stub_path import VARIABLE, launcher_paths_first


def _as_a_model_py_does(environ: dict) -> None:
    sys.path += environ.get(VARIABLE, "").split(os.pathsep)
    launcher_paths_first(environ)


def test_the_launcher_paths_come_first_with_their_pth_files(tmp_path, monkeypatch):
    project, venv, added = tmp_path / "project", tmp_path / "venv", tmp_path / "added_by_pth"
    for folder in (project, venv, added):
        folder.mkdir()
    (venv / "extra.pth").write_text(f"{added}\n")
    stub = ["", "/stdlib", "/interpreter/site-packages", "/repo/model/1", "/repo/model"]
    monkeypatch.setattr(sys, "path", list(stub))
    _as_a_model_py_does({VARIABLE: os.pathsep.join([str(project), str(venv), "/interpreter/site-packages"])})
    assert sys.path == [str(project), str(venv), str(added), *stub]


def test_without_launcher_paths_nothing_changes(monkeypatch):
    stub = ["", "/stdlib", "/interpreter/site-packages", "/repo/model/1"]
    monkeypatch.setattr(sys, "path", list(stub))
    _as_a_model_py_does({})
    assert sys.path == stub
