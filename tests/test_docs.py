"""The docs (mkdocs.yml, docs/, README.md) say what the code does: the site builds in strict mode (a broken link or
anchor, a page left out of the nav, an API name that does not resolve fails it), every ```python block of the home
page, the install page and the guides runs, the README's relative links lead somewhere, the magics page lists every
`%forge` subcommand, and the calls the architecture page names exist.

A page's runnable blocks run in order in one fresh Python process (they share their names, like a notebook's cells),
from a temporary folder, with this checkout first on the path. A block marked on the line before its fence with
``<!-- not run: REASON -->`` is left out (docs/development.md says when that is allowed). A page's processes carry
a tag in their environment, so one a page left running is found even after its parent exited.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<why>\S.*?)\s*-->$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
TAG = "FORGE_NB_DOCS_PAGE"  # in the environment of every process a page's code starts


def code_blocks(page: Path) -> list[tuple[str, str, str | None]]:
    """The fenced blocks of a Markdown page -> (language, code, the reason it is not run or None), in order."""
    blocks, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        marker = NOT_RUN.match(lines[i - 1].strip()) if i > 0 else None
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        blocks.append((fence["lang"], "\n".join(lines[i + 1 : end]), marker["why"] if marker else None))
        i = end + 1
    return blocks


def runnable(page: Path) -> list[str]:
    return [code for lang, code, why in code_blocks(page) if lang == "python" and why is None]


PAGES = [DOCS / "index.md", DOCS / "install.md", *sorted((DOCS / "guides").glob("*.md"))]
RUNNABLE = [p for p in PAGES if runnable(p)]


def test_the_site_builds_in_strict_mode(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml")]
    done = subprocess.run([*cmd, "--site-dir", str(site)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    tutorial = (site / "tutorials" / "01_quickstart" / "index.html").read_text()
    assert "steps = s.step(STEPS)" in re.sub(r"<[^>]+>", "", tutorial)  # a cell's source
    assert "data:image/png;base64" in tutorial  # and the figure stored with it
    assert "grpo_loss" in (site / "reference" / "python-api" / "index.html").read_text()  # from the docstrings


def test_every_python_block_is_run_or_says_why_not():
    """A page's blocks are ```python (run unless marked), ```ipython (magics), ```bash or a diagram."""
    for page in PAGES:
        for lang, code, _why in code_blocks(page):
            assert lang in ("python", "ipython", "bash", ""), f"{page.name}: a ```{lang} block"
            assert not (lang == "python" and code.lstrip().startswith("%")), f"{page.name}: a magic in a python block"
    assert RUNNABLE, "no page has a block to run"


@pytest.mark.mesh
@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_the_code_blocks_of_a_page_run(page, tmp_path):
    script = tmp_path / f"{page.stem}.py"
    script.write_text("\n\n".join(runnable(page)) + "\n")
    tag = uuid.uuid4().hex
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    # FORGE_NB_ZYGOTE=1: the page's sessions after its first fork their servers from a zygote, as a kernel's do.
    env = {**os.environ, "PYTHONPATH": pythonpath, TAG: tag, "FORGE_NB_ZYGOTE": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, f"{page.name}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    # The page's zygote (it forked the page's session servers: `forge_nb.server.zygote`) outlives the page by
    # design; the servers it forked carry its environment, the tag, and must be gone.
    zygotes = {p.pid: p for p in tagged(tag, wait_s=0.0) if "--zygote" in cmdline(p)}
    left = tagged(tag, wait_s=15.0, leaving_out=set(zygotes))
    for p in zygotes.values():
        p.terminate()
    assert psutil.wait_procs(list(zygotes.values()), timeout=10)[1] == []
    assert not left, f"{page.name} left processes running: " + "; ".join(f"{p.pid} {cmdline(p)}" for p in left)


def tagged(tag: str, wait_s: float, leaving_out: set[int] = frozenset()) -> list[psutil.Process]:
    """This user's processes whose environment carries `tag` (but `leaving_out`), after waiting up to `wait_s` for
    them to end."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for p in psutil.process_iter():
            try:
                if p.pid not in leaving_out and p.uids().real == os.getuid() and p.environ().get(TAG) == tag:
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:200]
    except psutil.Error:
        return "?"


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def test_the_readmes_relative_links_lead_to_files_and_headings():
    from markdown.extensions.toc import slugify

    for target in LINK.findall((ROOT / "README.md").read_text()):
        if target.startswith(("http://", "https://", "#")):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README links to {path}, which is not there"
        if anchor:
            headings = [line.lstrip("#").strip() for line in (ROOT / path).read_text().splitlines() if line[:2] == "##"]
            assert anchor in [slugify(h, "-") for h in headings], f"README links to {target}: no such heading"


def test_the_magics_page_lists_every_subcommand():
    source = (ROOT / "forge_nb" / "notebook" / "magics.py").read_text()
    assigned = next(
        n
        for n in ast.parse(source).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "SUBCOMMANDS"
    )
    page = (DOCS / "reference" / "magics.md").read_text()
    missing = [s for s in ast.literal_eval(assigned.value) if f"%forge {s}" not in page and f"`{s}`" not in page]
    assert not missing, f"docs/reference/magics.md does not list %forge {missing}"


DOTTED = re.compile(r"`(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)`")


def test_the_calls_of_one_step_exist():
    """Each `module.function`, `Class.member` or `section.field` that architecture.md's walk through a step names is
    in the code (read statically, by griffe)."""
    import griffe

    text = (DOCS / "architecture.md").read_text()
    section = text.split("## One step, call by call", 1)[1].split("\n## ", 1)[0]
    package = griffe.load("forge_nb", search_paths=[str(ROOT)], resolve_aliases=False)
    classes: dict[str, list] = {}

    def walk(obj) -> None:
        for member in obj.members.values():
            if member.is_alias:
                continue
            if member.is_class:
                classes.setdefault(member.name, []).append(member)
            if member.is_module or member.is_class:
                walk(member)

    walk(package)
    config = package["config.Config"]
    names = DOTTED.findall(section)
    assert len(names) > 20, names
    for name in names:
        head, *rest = name.split(".")
        if _has(package, name):
            continue
        if head in config.members:  # a config field: algorithm.epochs
            section_class = str(config.members[head].annotation)
            assert any(_has(c, ".".join(rest)) for c in classes.get(section_class, [])), name
            continue
        assert any(_has(c, ".".join(rest)) for c in classes.get(head, [])), f"{name} is not in forge_nb"


def _has(obj, path: str) -> bool:
    try:
        for part in path.split("."):
            obj = obj.all_members[part] if obj.is_class else obj.members[part]
        return True
    except Exception:  # KeyError, or griffe's own errors on a member it cannot resolve statically
        return False
