"""Execute every notebook from its source, so the committed notebooks cannot rot."""

import importlib.util
import pathlib

import pytest

NB = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
spec = importlib.util.spec_from_file_location("nb_build", NB / "build.py")
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.stem for p in (NB / "src").glob("*.py")))
def test_notebook_executes(name):
    nb = build.build(name)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors
    assert (NB / f"{name}.ipynb").exists(), f"run `python notebooks/build.py {name}` and commit it"
