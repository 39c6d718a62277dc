"""Every number in docs/ from a results file: renders the tables in the docs from the JSON the
benchmarks write into bench/results/, and checks that the docs still say what those files say.

    python3 bench/report.py            # rewrite every results block in docs/ from its file
    python3 bench/report.py --check    # exit 1 if a block differs from its file, a relative
                                       # link does not resolve, or a cited Note does not exist

A results block in a page is the rendered table between two markers, which name the file:

    <!-- results: bench/results/modes.json -->
    ...                                  (written by this script: never edit by hand)
    <!-- end results -->

A results file (the Python benchmarks' --out writes one through bench/results_file.py; the
others were transcribed from their benchmark's printed table, with the same fields) holds:

    {"title": ..., "command": the command that remakes it, "machine": {"cpu": ..., "cores": N},
     "commit": ..., "date": ..., "conditions": optional free text (load, what else ran),
     "columns": [{"key": ..., "title": ..., "format": optional, e.g. ".1f"}, ...],
     "rows": [{key: value, ...}, ...], "ratios": optional [{"name": ..., "value": ...}, ...]}

The check also reads every Markdown page of the repository (docs/ and README.md): each
relative link [text](path#anchor) must name a file or folder that exists, and a page's
heading where it names one; each `Note [Name]` cited
must be defined by a comment `// Note [Name]` (or `# Note [Name]`) in the sources; and pages
and Notes named in prose must be links ([ddp.md](ddp.md), [Note [Name]](../path/file.h)).
bench/docs_checks.py adds the page checks: docs/limitations.md's commands still fail as it
says, no other page states a limitation, a refusal stated elsewhere links its tested
limitations.md section, no page names a private path (../shared, ~/.cache, /tmp/), and no
caption tells a measurement's history. bench/docs_figures.py adds the figure checks: every
"<row> / <row>" ratio and every ratio column beside its row's figures follows from those
figures, and every figure a page quotes from a results file (a titled link to the file)
equals the file's. Standard library only: the test suite runs it (meson test test_docs).
"""
import argparse
import difflib
import json
import os
import re
import subprocess
import sys

import docs_checks  # bench/docs_checks.py: limitations as tests, refusals linked to them, no private paths
import docs_figures  # bench/docs_figures.py: ratios follow from their figures, quoted figures equal their files
import results_file  # bench/results_file.py: the commit a caption names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"(<!-- results: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- end results -->)", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
NOTE_CITED = re.compile(r"Note \[([^\]]+)\]")
NOTE_DEFINED = re.compile(r"^\s*(?://|#) Note \[([^\]]+)\]", re.M)
SOURCE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh", ".py", ".sh", ".build", ".txt")


def cell(value, fmt=None):
    if value is None or value == "":
        return ""
    if isinstance(value, list):
        return " ".join(cell(v, fmt) for v in value)
    if fmt and isinstance(value, (int, float)):
        return format(value, fmt)
    return str(value)


def commit_phrase(commit):
    """"at commit `abc1234`" (results_file.commit_hash: no git jargon in a caption)."""
    return f"at commit `{results_file.commit_hash(commit)}`"


def machine_phrase(machine):
    """"AMD EPYC (family 25 model 1, AVX2), 2 cores": the model name alone does not tell apart
    the CPUs a kernel choice depends on; files written before results_file recorded more say less."""
    extra = []
    if "family" in machine:
        extra.append(f"family {machine['family']} model {machine['model']}")
    if "isa" in machine:
        extra.append({"avx512_bf16": "AVX-512 with bf16", "avx512f": "AVX-512", "avx2": "AVX2"}.get(
            machine["isa"], machine["isa"]))
    return machine["cpu"] + (f" ({', '.join(extra)})" if extra else "") + f", {machine['cores']} cores"


def render(results):
    """The Markdown a results file stands for: its provenance, the table, then the ratios."""
    lines = [f"*{results['title']}.* Made by `{results['command']}` on {machine_phrase(results['machine'])}, "
             f"{commit_phrase(results['commit'])}, {results['date']}."]
    if results.get("conditions"):
        lines[0] += f" {results['conditions']}"
    columns = [c for c in results["columns"]  # a column no row fills is left out
               if any(row.get(c["key"]) not in (None, "", []) for row in results["rows"])]
    lines += ["", "| " + " | ".join(c["title"] for c in columns) + " |",
              "|" + "---|" * len(columns)]
    for row in results["rows"]:
        lines.append("| " + " | ".join(cell(row.get(c["key"]), c.get("format")) for c in columns) + " |")
    if results.get("ratios"):
        lines.append("")
        for ratio in results["ratios"]:
            lines.append(f"- {ratio['name']}: **{cell(ratio['value'], ratio.get('format', '.2f'))}**")
    return "\n".join(lines) + "\n"


def markdown_pages(root):
    pages = [os.path.join(root, "README.md")]
    for folder, _, files in os.walk(os.path.join(root, "docs")):
        pages += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".md")]
    return [p for p in pages if os.path.exists(p)]


def tracked_sources(root):
    """The files Notes may be defined in: git's list where there is one, else a walk."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True, check=True).stdout
        files = [os.path.join(root, f) for f in out.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith((".", "build"))]
            files += [os.path.join(folder, n) for n in names]
    return [f for f in files if f.endswith(SOURCE_SUFFIXES) and os.path.isfile(f)]


def defined_notes(root):
    notes = {}
    for path in tracked_sources(root):
        with open(path, encoding="utf-8", errors="replace") as f:
            for name in NOTE_DEFINED.findall(f.read()):
                notes.setdefault(" ".join(name.split()), os.path.relpath(path, root))
    return notes


def update_blocks(page, text, root, problems):
    """The page with every results block rendered afresh from its file."""
    def one(match):
        path = os.path.join(root, match.group("path"))
        if not os.path.exists(path):
            problems.append(f"{os.path.relpath(page, root)}: results file {match.group('path')} does not exist")
            return match.group(0)
        with open(path) as f:
            body = render(json.load(f))
        return match.group(1) + body + match.group(4)
    return BLOCK.sub(one, text)


def check_links(page, text, root, problems):
    rel = os.path.relpath(page, root)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)  # code holds commands and calls, not links
    prose = re.sub(r"`[^`\n]*`", "", prose)
    for target in LINK.findall(prose):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(full):
            problems.append(f"{rel}: link to {target} does not resolve")
        elif anchor and full.endswith(".md") and anchor not in heading_anchors(full):
            problems.append(f"{rel}: link to {target}: {os.path.basename(full)} has no heading with that anchor")


def heading_anchors(page):
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as '-'."""
    with open(page) as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    return {docs_checks.anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def check_notes(page, text, notes, root, problems):
    rel = os.path.relpath(page, root)
    for name in NOTE_CITED.findall(" ".join(text.split())):
        if " ".join(name.split()) not in notes:
            problems.append(f"{rel}: Note [{name}] is cited but no source defines it (// Note [{name}])")


def check_citations_are_links(page, text, root, warnings):
    """Pages and Notes named in prose must be links a reader can follow (code blocks, which
    hold commands and program output, are exempt)."""
    rel = os.path.relpath(page, root)
    prose = re.sub(r"```.*?```|<!-- results: .*?<!-- end results -->", "", text, flags=re.S)
    prose = re.sub(r"^(?:    |\t).*$", "", prose, flags=re.M)  # indented code blocks
    prose = " ".join(LINK.sub("", prose).split())
    pages = {os.path.basename(p) for p in markdown_pages(root) if os.path.dirname(p).endswith("docs")}
    for name in sorted(set(re.findall(r"(?<![\w/.-])(?:docs/)?([a-z_]+\.md)\b", prose)) & pages):
        warnings.append(f"{rel}: the page {name} is named without a link; write [{name}](...)")
    for name in sorted(set(NOTE_CITED.findall(prose))):
        warnings.append(f"{rel}: Note [{name}] is cited without a link to the file that defines it")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 on any difference")
    parser.add_argument("--root", default=ROOT, help="the repository (default: this script's)")
    parser.add_argument("--build", help="the build the limitations' commands run from (default: ROOT/build)")
    parser.add_argument("--no-limitations", action="store_true", help="skip running docs/limitations.md's commands")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    notes = defined_notes(root)
    problems, warnings, stale, blocks, refusals, quoted = [], [], [], 0, 0, 0
    sections = docs_checks.tested_sections(root)
    for page in markdown_pages(root):
        with open(page) as f:
            text = f.read()
        blocks += len(BLOCK.findall(text))
        fresh = update_blocks(page, text, root, problems)
        if fresh != text:
            if args.check:
                rel = os.path.relpath(page, root)
                diff = difflib.unified_diff(text.splitlines(), fresh.splitlines(), f"{rel} (the page)",
                                            f"{rel} (rendered from its results files)", lineterm="", n=1)
                stale.append("\n".join(diff))
            else:
                with open(page, "w") as f:
                    f.write(fresh)
                print(f"updated {os.path.relpath(page, root)}")
        check_links(page, fresh, root, problems)
        check_notes(page, fresh, notes, root, problems)
        check_citations_are_links(page, fresh, root, problems)  # every page links what it names
        docs_checks.check_phrases(page, fresh, root, problems)
        refusals += docs_checks.check_refusals(page, fresh, root, problems, sections)
        docs_checks.check_private_paths(page, fresh, root, problems)
        docs_checks.check_caption_words(page, fresh, root, problems)
        quoted += docs_figures.check_quoted_figures(page, fresh, root, problems)
    ratios = 0
    for name in sorted(os.listdir(os.path.join(root, "bench", "results"))):
        if name.endswith(".json"):
            with open(os.path.join(root, "bench", "results", name)) as f:
                results = json.load(f)
            rel = os.path.join("bench", "results", name)
            ratios += docs_figures.check_ratios(results, rel, problems)
            ratios += docs_figures.check_ratio_columns(results, rel, problems)
    limitations = 0
    if not args.no_limitations:
        limitations = docs_checks.check_limitations(root, os.path.abspath(args.build or os.path.join(root, "build")),
                                                    problems)
    for diff in stale:
        print(diff)
    if stale:
        print(f"\n{len(stale)} page(s) disagree with their results files: run python3 bench/report.py "
              "(after a benchmark's --out), or fix the results file")
    for problem in problems:
        print(problem)
    for warning in warnings:
        print("warning:", warning)
    verdict = "OK" if not (stale or problems) else "FAILED"
    print(f"docs check {verdict}: {blocks} results blocks, {len(markdown_pages(root))} pages, "
          f"{len(notes)} Notes defined, {ratios} ratios against their rows, {quoted} quoted figures against "
          f"their files, {refusals} refusals linked, {limitations} limitations run; "
          f"{len(stale)} stale pages, {len(problems)} other problems, {len(warnings)} warnings")
    return 1 if (args.check and (stale or problems)) else 0


if __name__ == "__main__":
    sys.exit(main())
