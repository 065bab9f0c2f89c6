"""docs/tutorial.md runs as written: every code block, in page order, one test per "## Step" section.

Conventions of the page (what a reader does, and what this test does):
- A ```python block is a file: its first line is a comment naming it (`# train.py: ...`). The test writes it
  into the working folder, as the reader saves it; a later block with the same name replaces it.
- A ```bash block is commands to run in that folder. The test runs it with `bash -e`, with the running
  interpreter's folder first on PATH (so `python` and `torchrun` are this environment's), the repository on
  PYTHONPATH, `OMP_NUM_THREADS=1` (what the launched ranks get anyway), and no rank or cluster variables
  inherited.
- A ```text block titled "Output" right after a ```bash block lists lines that command prints: each must
  appear in its output, in order. A number with a decimal point matches any such number (accuracies and
  losses vary with torch versions and CPUs), and `...` matches anything (e.g. the start of an absolute
  path); everything else must match exactly.
- A block whose fence has a title starting with "Not run here" (e.g. ```bash title="Not run here: needs
  GPUs") needs hardware the tests do not have (GPUs, several machines, SLURM) and is skipped; the page
  keeps those few (test_few_blocks_are_not_run).

Each section's test writes the files of every section up to it (later sections reuse earlier files) and
runs the commands of its own section only, in a fresh folder, so the sections do not depend on each
other's runs. Every command has a hard timeout, and on the way out every process still running in the
test's folder (torchrun starts its workers in sessions of their own) is killed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "tutorial.md"
BLOCK_TIMEOUT_S = 150  # one command: a 2-rank launch takes 10-40 s on 2 busy cores
_FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.M | re.S)
_DECIMAL = re.compile(r"\d+\.\d+")
_CLEAN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
               "MASTER_PORT")


@dataclass
class Block:
    lang: str
    title: str
    code: str
    section: str

    @property
    def skipped(self) -> bool:
        return self.title.startswith("Not run here")


def _blocks() -> list[Block]:
    text = PAGE.read_text()
    headings = [(m.start(), m.group(1)) for m in re.finditer(r"^## (.+)$", text, re.M)]
    blocks = []
    for m in _FENCE.finditer(text):
        section = next((h for start, h in reversed(headings) if start < m.start()), "")
        title = re.search(r'title="([^"]*)"', m.group(2))
        blocks.append(Block(m.group(1), title.group(1) if title else "", m.group(3), section))
    return blocks


BLOCKS = _blocks()
STEPS = list(dict.fromkeys(b.section for b in BLOCKS if b.section.startswith("Step")))
DISTRIBUTED_STEPS = {s for s in STEPS if s.startswith(("Step 4", "Step 5"))}


def _file_name(block: Block) -> str:
    match = re.match(r"# ([\w.-]+\.py)\b", block.code)
    assert match, f"a python block must start with '# <file>.py': {block.code.splitlines()[0]!r}"
    return match.group(1)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _CLEAN_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # a 10k-parameter MLP: one thread is fastest, and steady on a shared 2-core box
    return env


def _processes_in(folder: Path) -> list[int]:
    """Live processes whose working directory is `folder` or below: everything the page's commands started."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cwd = Path(os.readlink(f"/proc/{entry}/cwd"))
            except OSError:
                continue
            if cwd == folder or folder in cwd.parents:
                found.append(int(entry))
    return found


def _kill_all_in(folder: Path) -> list[int]:
    left = _processes_in(folder)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def _run_bash(code: str, folder: Path) -> str:
    proc = subprocess.Popen(["bash", "-e", "-c", code], cwd=folder, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _kill_all_in(folder)
        output, _ = proc.communicate()
        pytest.fail(f"timed out after {BLOCK_TIMEOUT_S} s:\n$ {code}\n{output[-3000:]}")
    assert proc.returncode == 0, f"exit code {proc.returncode}:\n$ {code}\n{output[-3000:]}"
    return output


def _assert_printed(expected: str, output: str, command: str) -> None:
    position = 0
    for line in filter(None, (raw.strip() for raw in expected.splitlines())):
        pattern = "".join(r"\d+\.\d+" if _DECIMAL.fullmatch(part) else ".*?" if part == "..." else re.escape(part)
                          for part in re.split(r"(\d+\.\d+|\.\.\.)", line))
        found = re.compile(pattern).search(output, position)
        assert found, f"expected line {line!r} not printed (in order) by:\n$ {command}\n{output[-3000:]}"
        position = found.end()


def _run_section(step: str, folder: Path) -> None:
    last_command, last_output = None, ""
    started = time.monotonic()
    try:
        for block in BLOCKS:
            if block.skipped:
                continue
            if block.lang == "python" and STEPS.index(block.section) <= STEPS.index(step):
                (folder / _file_name(block)).write_text(block.code)
            elif block.section != step:
                continue
            elif block.lang == "bash":
                last_command, last_output = block.code, _run_bash(block.code, folder)
            elif block.lang == "text" and block.title == "Output":
                assert last_command is not None, "an Output block must follow a bash block"
                _assert_printed(block.code, last_output, last_command)
            elif block.lang != "python":
                pytest.fail(f"{step}: a ```{block.lang} block the test does not know how to run")
    finally:
        survivors = _kill_all_in(folder)
    assert not survivors, f"{step}: processes still running after its commands: {survivors}"
    print(f"{step}: {time.monotonic() - started:.1f} s")


@pytest.mark.subprocess
@pytest.mark.parametrize("step", [s for s in STEPS if s not in DISTRIBUTED_STEPS])
@pytest.mark.timeout(300)
def test_tutorial_step_runs(step, tmp_path):
    _run_section(step, tmp_path)


@pytest.mark.distributed
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds leftover processes through /proc")
@pytest.mark.parametrize("step", sorted(DISTRIBUTED_STEPS))
@pytest.mark.timeout(300)
def test_tutorial_distributed_step_runs(step, tmp_path):
    _run_section(step, tmp_path)


def test_page_has_five_steps_and_every_block_is_known():
    assert [s.split(":")[0] for s in STEPS] == [f"Step {i}" for i in range(1, 6)]
    assert all(b.lang in ("python", "bash", "text") for b in BLOCKS)
    assert all(b.section in STEPS for b in BLOCKS if not b.skipped), "a runnable block outside the steps"


def test_few_blocks_are_not_run():
    skipped = [b for b in BLOCKS if b.skipped]
    assert 0 < len(skipped) <= 3 and all(b.section.startswith("Step 5") for b in skipped)
