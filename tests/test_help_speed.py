"""Every `--help` answers without loading torch or transformers (5-7 s of CPU before a help text, when they
loaded first): `hf-posenc --help`, each subcommand's, both recipes' as modules and as the clone's scripts.
Each runs in a fresh interpreter that reports, on exit, which heavy packages it imported; the CPU time is
the child's own (getrusage), so a busy machine does not inflate it."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "datasets", "accelerate")
# ~0.1 s of CPU here (5.5-7 s when torch loaded first): the bound leaves a slow CI machine ten times that
CPU_BOUND_S = 1.0

# Run as `python -m X` / `python script.py` would, then say on stderr which heavy packages got imported.
PROBE = """
import atexit, json, runpy, sys
atexit.register(lambda: sys.stderr.write("\\nHEAVY " + json.dumps(sorted(m for m in {heavy} if m in sys.modules)) + "\\n"))
kind, target, *argv = sys.argv[1:]
if kind == "module":
    sys.argv = [target, *argv]
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    sys.argv = [target, *argv]
    runpy.run_path(target, run_name="__main__")
""".format(heavy=repr(HEAVY))

COMMANDS = {
    "hf-posenc --help": ("module", "hf_posenc.cli", "--help"),
    **{f"hf-posenc {sub} --help": ("module", "hf_posenc.cli", sub, "--help")
       for sub in ("methods", "inspect", "patch", "demo", "plot", "finetune", "evaluate", "search", "extend")},
    "python -m hf_posenc.recipes.finetune --help": ("module", "hf_posenc.recipes.finetune", "--help"),
    "python -m hf_posenc.recipes.evaluate --help": ("module", "hf_posenc.recipes.evaluate", "--help"),
    "python recipes/finetune.py --help": ("path", str(ROOT / "recipes" / "finetune.py"), "--help"),
    "python recipes/evaluate.py -h": ("path", str(ROOT / "recipes" / "evaluate.py"), "-h"),
}


def run_probe(args: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, cpu


@pytest.mark.parametrize("name", COMMANDS)
def test_help_loads_no_torch_and_takes_well_under_a_second_of_cpu(name):
    proc, cpu = run_probe(COMMANDS[name])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: "), proc.stdout[:300]
    imported = json.loads(proc.stderr.rsplit("HEAVY ", 1)[1])
    assert imported == [], f"{name} imported {imported} before printing its help"
    assert cpu < CPU_BOUND_S, f"{name} took {cpu:.2f} s of CPU"
