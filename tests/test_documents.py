"""The documents a newcomer reads say what the code does, and lead somewhere.

- The README's annotation table lists exactly the annotations stormtopo accepts on a StormService, and
  every annotation key of the vocabulary is either one of those or one stormtopo writes.
- docs/monitoring.md's metric table lists exactly the metrics the operator serves.
- Every relative link in README.md, docs/*.md, COMPATIBILITY.md and RELIABILITY.md names a file that
  exists, and every `#anchor` a heading of its target, by GitHub's slug rules.

Pure: no cluster, no network.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stormtopo.core import vocabulary as v

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MONITORING = REPO / "docs" / "monitoring.md"
DOCUMENTS = sorted([README, REPO / "COMPATIBILITY.md", REPO / "RELIABILITY.md", *(REPO / "docs").glob("*.md")])

# What a user sets on a StormService: the request (the only parser, core/request.py), and the switches
# read beside it (core/admission.py, core/healing.py, core/moves.py); the spread tier is part of the request.
SET_BY_USERS = {
    *v.REQUEST_ANNOTATIONS,
    v.REPLICA_SPREAD_TIER,
    v.REPLICA_SPREAD_TIER_NAME,
    v.PREFER_SAME_NODE,
    v.HEAL_ANNOTATION,
    v.LEND_ROOM_ANNOTATION,
}
# What stormtopo writes (records, labels, its gate) and Volcano's discovery label: never read from a user.
NOT_SET_BY_USERS = {
    v.REQUEST_ANNOTATION,
    v.PLACEMENT_ANNOTATION,
    v.MOVES_ANNOTATION,
    v.NARROWED_ANNOTATION,
    v.DOMAIN_LABEL_PREFIX,
    v.NODE_TIER_LABEL,
    v.ADMITTED_LABEL,
    v.OPTED_IN_LABEL,
    v.DOMAIN_GATE,
    v.ROOM_GATE,
    v.SPREAD_KEPT_OUT_LABEL,
    v.TOPOLOGY_SOURCE_LABEL,
}
OUR_PREFIXES = ("stormtopo.io/", "volcano.sh/network-topology-")


def section(text: str, heading: str) -> str:
    """The lines under `heading` (a whole heading line), up to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if re.match(rf"#{{1,{level}}} ", lines[i])), len(lines))
    return "\n".join(lines[start:end])


def first_column(table: str) -> list[list[str]]:
    """The code spans of each body row's first cell, in a Markdown table."""
    rows = [line for line in table.splitlines() if line.startswith("|")][2:]  # past the header and its rule
    return [re.findall(r"`([^`]+)`", row.split("|")[1]) for row in rows]


def test_every_annotation_key_of_the_vocabulary_is_either_set_by_users_or_written_by_stormtopo() -> None:
    keys = {value for value in vars(v).values() if isinstance(value, str) and value.startswith(OUR_PREFIXES)}
    unclassified = keys - SET_BY_USERS - NOT_SET_BY_USERS
    assert not unclassified, (
        f"stormtopo/core/vocabulary.py has keys this test does not know: {sorted(unclassified)}. A key users set on the "
        "StormService goes into SET_BY_USERS and into the README's annotation table; one stormtopo writes into NOT_SET_BY_USERS."
    )
    gone = (SET_BY_USERS | NOT_SET_BY_USERS) - keys
    assert not gone, f"keys no longer in stormtopo/core/vocabulary.py: {sorted(gone)}"


def test_readme_annotation_table_lists_exactly_the_annotations_stormtopo_accepts() -> None:
    cells = first_column(section(README.read_text(), "## The annotations"))
    assert all(len(keys) == 1 for keys in cells), f"one annotation per row of the README's table, in backticks: {cells}"
    listed = [keys[0] for keys in cells]
    assert len(listed) == len(set(listed)), f"an annotation listed twice in the README's table: {listed}"
    missing, unknown = SET_BY_USERS - set(listed), set(listed) - SET_BY_USERS
    assert not missing, f"README.md, 'The annotations': the code accepts {sorted(missing)}, which the table does not list"
    assert not unknown, f"README.md, 'The annotations': the table lists {sorted(unknown)}, which the code does not accept"


def served_metrics() -> set[str]:
    from prometheus_client import REGISTRY

    import stormtopo.operator.metrics  # noqa: F401  (registers the operator's metrics)

    families = [f for f in REGISTRY.collect() if f.name.startswith("stormtopo_")]
    return {f"{f.name}_total" if f.type == "counter" else f.name for f in families}


def test_the_monitoring_page_lists_exactly_the_metrics_the_operator_serves() -> None:
    cells = first_column(section(MONITORING.read_text(), "## Metrics"))
    listed = {re.sub(r"\{.*\}$", "", name) for names in cells for name in names}
    served = served_metrics()
    assert not served - listed, f"docs/monitoring.md, 'Metrics': the operator serves {sorted(served - listed)}, which it does not list"
    assert not listed - served, f"docs/monitoring.md, 'Metrics': it lists {sorted(listed - served)}, which the operator does not serve"


# Links -------------------------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)


def without_code_blocks(text: str) -> str:
    return FENCE.sub("", text)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text as rendered, lowercased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "")
    text = re.sub(r"(\*\*|__|\*)", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(without_code_blocks(path.read_text())):
        slug = github_slug(match.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(document: Path, repo: Path = REPO) -> list[str]:
    """Each relative link of `document` whose file does not exist, or whose anchor no heading of the target has."""
    problems = []
    repo, document = repo.resolve(), document.resolve()
    for target in LINK.findall(without_code_blocks(document.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (document.parent / path_part).resolve() if path_part else document
        where = f"{document.relative_to(repo)}: ({target})"
        if not resolved.exists():
            problems.append(f"{where}: no file {path_part}")
        elif repo not in resolved.parents and resolved != repo:
            problems.append(f"{where}: outside the repository")
        elif anchor:
            if resolved.suffix != ".md":
                problems.append(f"{where}: an anchor into a file that is not Markdown")
            elif anchor not in anchors(resolved):
                problems.append(f"{where}: no heading #{anchor} in {resolved.relative_to(repo)}; it has {sorted(anchors(resolved))}")
    return problems


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(document: Path) -> None:
    assert broken_links(document) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Volcano's setting (`normal-pod`)\n\n## Twice\n\n## Twice\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Title\n\n"
        "[ok](docs/page.md#volcanos-setting-normal-pod) [ok](docs/page.md#twice-1) [ok](#title) [web](https://example.com/x#y)\n"
        "[gone](docs/none.md) [no heading](docs/page.md#nowhere) [here](#nowhere)\n\n"
        "```\n[in a code block](docs/none.md)\n```\n"
    )
    assert broken_links(readme, tmp_path) == [
        "README.md: (docs/none.md): no file docs/none.md",
        "README.md: (docs/page.md#nowhere): no heading #nowhere in docs/page.md; "
        "it has ['a-page', 'twice', 'twice-1', 'volcanos-setting-normal-pod']",
        "README.md: (#nowhere): no heading #nowhere in README.md; it has ['title']",
    ]


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        (
            "Issue 20, item 5: reviews made up on the cluster network (2026-12-01)",
            "issue-20-item-5-reviews-made-up-on-the-cluster-network-2026-12-01",
        ),
        ("3. Install the chart", "3-install-the-chart"),
        ("What stormtopo's own identity can do", "what-stormtopos-own-identity-can-do"),
        (
            "Scale with nodes: 4,096 against 1,024 (`python -m bench --scale-nodes`)",
            "scale-with-nodes-4096-against-1024-python--m-bench---scale-nodes",
        ),
    ],
)
def test_github_slug(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


# -- references, not notebooks (issue 45, item 4) ------------------------------------------------------------
USER_PAGES = [REPO / "README.md", REPO / "RELIABILITY.md", REPO / "COMPATIBILITY.md", *sorted((REPO / "docs").glob("*.md"))]
CHART_FILES = sorted(
    p for p in (REPO / "deploy" / "helm" / "stormtopo").rglob("*") if p.is_file() and p.suffix in (".yaml", ".tpl", ".json")
)
# Run records keep their dates (and the commits they measured): BENCHMARKS.md, COMPATIBILITY.md's runs, and the
# README's table of how long the commands take, a measured figure with the day it was measured.
DATED_PAGES = [REPO / "RELIABILITY.md", *sorted((REPO / "docs").glob("*.md")), *CHART_FILES]
_ISSUE = re.compile(r"\bissues? [0-9]+|\(issue\b", re.IGNORECASE)
_DATE = re.compile(r"\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b")
_COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def _findings(paths: list[Path], pattern: re.Pattern[str], what: str) -> list[str]:
    out = []
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if (found := pattern.search(line)) is not None and "fromisoformat" not in line and "strftime" not in line:
                out.append(f"{path.relative_to(REPO)}:{number}: {what} {found.group(0)!r}")
    return out


def test_user_pages_and_product_code_name_no_issue_of_ours() -> None:
    """The project's issue numbers mean nothing to a user: what a page or a comment says stands on its own."""
    code = sorted((REPO / "stormtopo").rglob("*.py"))
    shipped = [REPO / "BENCHMARKS.md", REPO / "Makefile", REPO / "Dockerfile", *CHART_FILES]
    assert _findings([*USER_PAGES, *code, *shipped], _ISSUE, "an issue number") == []


def test_reference_pages_carry_no_dated_asides_nor_commits() -> None:
    """History is in git: reference pages say what is, not when it changed (benchmark run records keep their dates)."""
    assert _findings(DATED_PAGES, _DATE, "a date") == []
    assert _findings(USER_PAGES, _COMMIT, "a commit") == []


@pytest.mark.parametrize(
    ("line", "pattern"),
    [("healing (issue 34, item 4) moves", _ISSUE), ("Issue 20 found", _ISSUE), ("before 2026-12-03 it", _DATE), ("at 2b57836", _COMMIT)],
)
def test_the_notebook_checks_find_what_they_look_for(line: str, pattern: re.Pattern[str]) -> None:
    assert pattern.search(line) is not None
    assert _COMMIT.search("seed 3458436573") is None and _COMMIT.search("a deadbeef cafe") is None  # a seed, words


# -- the Events table is the code's (issue 45, item 4: a contradiction class, tested) ------------------------
def _event_reasons_in_code() -> set[str]:
    """Every reason the code posts: in each call whose arguments hold "Normal" or "Warning", the argument
    right after it, a string or a choice between strings."""
    import ast

    found: set[str] = set()
    for path in (REPO / "stormtopo").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            args = node.args
            for i, arg in enumerate(args[:-1]):
                if isinstance(arg, ast.Constant) and arg.value in ("Normal", "Warning"):
                    after = args[i + 1]
                    choices = [after.body, after.orelse] if isinstance(after, ast.IfExp) else [after]
                    found |= {c.value for c in choices if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return found


def test_the_events_table_lists_exactly_the_reasons_the_code_posts() -> None:
    text = (REPO / "docs" / "how-it-works.md").read_text()
    table = text.split("\n## Events\n", 1)[1].split("\n## ", 1)[0]
    rows = [row.split("|")[1] for row in table.splitlines() if row.startswith("| `")]
    documented = {reason for cell in rows for reason in re.findall(r"`([A-Za-z]+)`", cell)}
    assert len(_event_reasons_in_code()) >= 15  # the scan finds them (a scan that finds none would pass anything)
    assert _event_reasons_in_code() == documented


def modules_named_in_layout(text: str) -> list[str]:
    """The modules of docs/layout.md's "Every module, one line each" section: the first cell of each row."""
    listed = section(text, "## Every module, one line each")
    listed = listed.split("### Beside the package")[0]
    return re.findall(r"^\| `([^`]+\.py)` \|", listed, re.M)


def test_the_layout_page_has_one_line_for_every_module_and_no_other() -> None:
    package = REPO / "stormtopo"
    modules = sorted(str(p.relative_to(package)) for p in package.rglob("*.py") if p.read_text().strip())
    listed = modules_named_in_layout((REPO / "docs" / "layout.md").read_text())
    assert len(listed) == len(set(listed)), f"named twice: {sorted({m for m in listed if listed.count(m) > 1})}"
    assert not set(modules) - set(listed), f"modules without their line in docs/layout.md: {sorted(set(modules) - set(listed))}"
    assert not set(listed) - set(modules), f"lines in docs/layout.md for no module: {sorted(set(listed) - set(modules))}"


def test_the_layout_check_finds_a_missing_and_a_stale_line() -> None:
    page = "## Every module, one line each\n\n| module | what |\n|---|---|\n| `core/gang.py` | a gang |\n| `core/gone.py` | x |\n"
    assert modules_named_in_layout(page) == ["core/gang.py", "core/gone.py"]
    assert modules_named_in_layout(page + "\n### Beside the package\n\n| `bench/x.py` | y |\n") == ["core/gang.py", "core/gone.py"]


# -- every flag a page names is one a parser takes (a contradiction class, tested) ---------------------------
# Flags of other tools that the pages name, with the tool: anything else must be stormtopo's.
OTHER_TOOLS_FLAGS = {
    "--set": "helm",
    "--timeout": "helm",
    "--kube-version": "helm template",
    "--runtime-config": "kube-apiserver",
    "--admission-control-config-file": "kube-apiserver",
    "--advertise-address": "kube-apiserver",
    "--endpoint-reconciler-type": "kube-apiserver",
    "--controllers": "kube-controller-manager, AIBrix's controller manager",
    "--policy": "the SGLang router",
    "--no-deps": "pip",
}
_SPAN = re.compile(r"`([^`\n]+)`")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def flags_named(text: str) -> set[str]:
    """Flags a page names: a code span that is a flag (`--x` or `--x VALUE`), and every flag in a code span or a
    code-block line that runs stormtopo (`stormtopo ...`, `kubectl stormtopo ...`, `python -m stormtopo...`)."""
    found: set[str] = set()
    runs = ("stormtopo ", "kubectl stormtopo ", "python -m stormtopo", "$ stormtopo ")
    for span in _SPAN.findall(text):
        if span.startswith("--") and (flag := _FLAG.match(span)):
            found.add(flag.group(1))
        elif span.startswith(runs):
            found |= set(_FLAG.findall(span))
    for line in text.splitlines():
        if line.lstrip().startswith(runs):
            found |= set(_FLAG.findall(line))
    return found


def stormtopos_flags() -> set[str]:
    """Every option string of the CLI (with every subcommand's), of the operator and of the compatibility runner."""
    import argparse

    from stormtopo.cli import build_parser
    from stormtopo.devenv.compat import build_parser as compat_parser
    from stormtopo.operator.config import build_parser as operator_parser

    found: set[str] = set()
    parsers = [build_parser(), operator_parser(), compat_parser()]
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            found |= {o for o in action.option_strings if o.startswith("--")}
            if isinstance(action, argparse._SubParsersAction):
                parsers += list(action.choices.values())
    return found


def test_every_flag_a_page_names_is_one_a_parser_takes() -> None:
    taken = stormtopos_flags()
    assert {"--heal-interval", "--scheduler-config", "--without-operator", "--labelled-pods-binding"} <= taken  # the walk finds them
    unknown = sorted(
        f"{path.relative_to(REPO)}: {flag}"
        for path in USER_PAGES
        for flag in flags_named(path.read_text())
        if flag not in taken and flag not in OTHER_TOOLS_FLAGS
    )
    assert unknown == [], "flags no parser of stormtopo takes (rename them, or name their tool in OTHER_TOOLS_FLAGS)"
    assert not set(OTHER_TOOLS_FLAGS) & taken, "a flag listed as another tool's is stormtopo's"


def test_the_flag_check_finds_a_flag_in_a_span_and_in_a_command() -> None:
    page = "Set `--heal-intervall 5`; or run `stormtopo doctor --kubeconfg F`.\n\n```\nstormtopo dev up --state-dirr D\n```\n"
    assert flags_named(page) == {"--heal-intervall", "--kubeconfg", "--state-dirr"}
    assert not flags_named(page) & stormtopos_flags()
    assert flags_named("`helm install x --wait`, a---b, `x--y`") == set()


def test_every_docs_page_and_the_readme_lead_to_the_glossary() -> None:
    """The words replica, gang, domain, tier, wide, held, gate and listing mean one thing each: every page
    that uses them links the page that says what."""
    pages = [README, *(p for p in sorted((REPO / "docs").glob("*.md")) if p.name != "glossary.md")]
    assert [str(p.relative_to(REPO)) for p in pages if "glossary.md" not in p.read_text()] == []
    glossary = (REPO / "docs" / "glossary.md").read_text()
    for word in ("replica", "gang", "domain", "tier", "leaf", "wide", "held", "gate", "listing", "opted in"):
        assert f"**{word}**" in glossary or f"**{word}" in glossary, word
