"""The README's demo command end to end (small sizes), as a user runs it."""

import pytest
import subprocess
import sys


@pytest.mark.slow
def test_demo_runs_every_format_and_the_shipped_checkpoint():
    out = subprocess.run([sys.executable, "-m", "jqlin", "demo", "--m", "2", "--n", "64", "--k", "96"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    import jqlin
    for name in jqlin.formats.names():
        assert f"\n{name} " in out.stdout
    assert "converting" in out.stdout and "generated:" in out.stdout
    assert "relative Frobenius error" in out.stdout and "top-1 agreement" in out.stdout
