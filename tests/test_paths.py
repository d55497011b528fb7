"""What forge_nb prints of a path: relative to the current folder, else under ~, and a model's registry name."""

from pathlib import Path

from forge_nb.paths import as_typed, model_label


def test_paths_print_relative_to_the_current_folder_else_under_home(tmp_path, monkeypatch):
    (tmp_path / "home" / "m").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert as_typed(tmp_path / "runs" / "a") == Path("runs/a")
    monkeypatch.chdir(tmp_path / "home" / "m")
    assert as_typed(tmp_path / "home" / "x") == Path("~/x")
    assert as_typed("/") == Path("/")


def test_a_model_prints_as_its_name_or_its_folder_as_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_model").mkdir()
    assert model_label("smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert model_label(str(tmp_path / "my_model")) == "my_model"
