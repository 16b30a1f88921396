"""Build and execute the notebooks from their cell sources (notebooks/src/*.py).

Each source file is a sequence of cells separated by lines `# %%` (code) or `# %% [markdown]`.
`python notebooks/build.py` writes the executed .ipynb beside this file; the test suite runs
the same execution (tests/test_notebooks.py), so a notebook cannot rot.
"""

from __future__ import annotations

import pathlib
import sys

import nbformat
from nbclient import NotebookClient

HERE = pathlib.Path(__file__).resolve().parent
SRC = HERE / "src"


def cells_from_source(text: str) -> list:
    cells, kind, buf = [], None, []

    def flush():
        body = "\n".join(buf).strip("\n")
        if kind is not None and body:
            if kind == "markdown":
                body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                                 for line in body.splitlines())
                cells.append(nbformat.v4.new_markdown_cell(body))
            else:
                cells.append(nbformat.v4.new_code_cell(body))

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            kind, buf = ("markdown" if "[markdown]" in line else "code"), []
        else:
            buf.append(line)
    flush()
    return cells


def build(name: str, execute: bool = True, timeout: int = 600) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells_from_source((SRC / f"{name}.py").read_text())
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if execute:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(HERE.parent)}}).execute()
    return nb


def main(names: list[str]) -> int:
    for name in names or sorted(p.stem for p in SRC.glob("*.py")):
        nb = build(name)
        nbformat.write(nb, HERE / f"{name}.ipynb")
        print(f"wrote notebooks/{name}.ipynb")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
