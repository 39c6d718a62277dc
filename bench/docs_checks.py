"""The checks that keep docs/ true to the product, beside bench/report.py's (which runs them):

- Limitations are tests. docs/limitations.md is the one page that says what loom does not do.
  Each limitation carries the command that meets it and the error it prints, in a block

      ```limitation
      $ build/examples/train_cifar10 --mode fsdp --amp fp16 --synthetic
      --amp fp16 needs a GradScaler, which --mode fsdp does not
      ```

  The check runs the command (from the repository, `build/` meaning the build being tested)
  and wants it to fail with that text in its output. A limitation that went away (the command
  now succeeds, or says something else) fails the docs test until the page changes.
- No page but limitations.md says "not yet", "not supported", "unsupported", "not applied" or
  "has not run" in its prose (code blocks, which quote programs, are exempt): a limitation
  stated anywhere else is one nobody checks.
- One ratio per comparison, by one rule. A results file's ratio named "<row> / <row>" (two
  labels of its table's first column, and an optional "(...)" after) must equal the ratio of
  those rows' figures in its `ratio_figure` column (default: the first numeric column), to
  the ratio's printed precision: the bars a chart draws and the ratio beside them cannot
  disagree.

Standard library only.
"""
import os
import re
import shlex
import subprocess

FORBIDDEN = re.compile(r"\b(not yet|not supported|unsupported|not applied|has not run)\b", re.I)
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
RESULTS_BLOCK = re.compile(r"<!-- results: \S+ -->\n.*?<!-- end results -->", re.S)
LIMITATION = re.compile(r"^```limitation\n\$ (?P<command>[^\n]+)\n(?P<expected>.*?)\n```$", re.S | re.M)
LIMITATIONS_PAGE = os.path.join("docs", "limitations.md")
BUILD_WORD = re.compile(r"(^|[\s'\"=(;&|])build/")


def limitations(text):
    """[(command, expected output)] of a limitations page."""
    return [(m.group("command").strip(), m.group("expected").strip()) for m in LIMITATION.finditer(text)]


def check_limitations(root, build, problems, timeout=120):
    """Runs every limitation's command; a problem for each that no longer fails as the page says."""
    page = os.path.join(root, LIMITATIONS_PAGE)
    if not os.path.exists(page):
        problems.append(f"{LIMITATIONS_PAGE} is missing: it lists what loom does not do, each with its command")
        return 0
    with open(page) as f:
        entries = limitations(f.read())
    if not entries:
        problems.append(f"{LIMITATIONS_PAGE}: no ```limitation blocks (a command line after '$ ', then its error)")
    for command, expected in entries:
        # `build/` at the start of a word (also inside a quoted bash -c script) is the build tested.
        line = BUILD_WORD.sub(lambda m: m.group(1) + shlex.quote(build) + "/", command)
        try:
            out = subprocess.run(["bash", "-c", line], cwd=root, capture_output=True, text=True, timeout=timeout,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))
        except (OSError, subprocess.TimeoutExpired) as e:
            problems.append(f"{LIMITATIONS_PAGE}: `{command}` could not run as the page says: {e}")
            continue
        said = out.stdout + out.stderr
        if out.returncode == 0:
            problems.append(f"{LIMITATIONS_PAGE}: `{command}` now succeeds: the limitation is gone; "
                            "move it out of limitations.md and document the feature")
        elif expected not in said:
            tail = said.strip().splitlines()[-1:] or ["(nothing)"]
            problems.append(f"{LIMITATIONS_PAGE}: `{command}` failed, but without \"{expected}\"; it said: {tail[0]}")
    return len(entries)


def check_phrases(page, text, root, problems):
    """Flags a limitation stated in the prose of any page but limitations.md."""
    rel = os.path.relpath(page, root)
    if rel == LIMITATIONS_PAGE:
        return
    prose = RESULTS_BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), prose)
    prose = re.sub(r"`[^`\n]*`", "", prose)  # inline code quotes programs too
    for number, line in enumerate(prose.splitlines(), 1):
        match = FORBIDDEN.search(line)
        if match:
            problems.append(f"{rel}:{number}: \"{match.group(0)}\" states a limitation outside {LIMITATIONS_PAGE}; "
                            "say what loom does, and list what it does not there, with its command")


def decimals(fmt):
    match = re.fullmatch(r"\.(\d+)f", fmt or ".2f")
    return int(match.group(1)) if match else 2


def check_ratios(results, rel, problems):
    """Each "<row> / <row>" ratio of a results file against its rows' figures."""
    columns = results.get("columns", [])
    rows = results.get("rows", [])
    if not columns or not rows:
        return 0
    label = columns[0]["key"]
    figure = results.get("ratio_figure")
    if figure is None:
        numeric = [c["key"] for c in columns[1:]
                   if all(isinstance(r.get(c["key"]), (int, float)) for r in rows if r.get(c["key"]) is not None)
                   and any(isinstance(r.get(c["key"]), (int, float)) for r in rows)]
        figure = numeric[0] if numeric else None
    by_label = {str(r.get(label)): r for r in rows}
    checked = 0
    for ratio in results.get("ratios", []):
        name = re.sub(r"\s*\([^()]*\)\s*$", "", ratio["name"]).strip()
        parts = name.split(" / ")
        if len(parts) != 2 or figure is None or parts[0] not in by_label or parts[1] not in by_label:
            continue
        top, bottom = by_label[parts[0]].get(figure), by_label[parts[1]].get(figure)
        if not isinstance(top, (int, float)) or not isinstance(bottom, (int, float)) or bottom == 0:
            continue
        checked += 1
        implied = top / bottom
        tolerance = 0.5 * 10 ** -decimals(ratio.get("format")) + 1e-9
        if abs(ratio["value"] - implied) > tolerance:
            problems.append(f"{rel}: ratio \"{ratio['name']}\" is {ratio['value']}, but its rows' {figure} give "
                            f"{top} / {bottom} = {implied:.3f}: one comparison, one rule (the ratio of the figures "
                            "shown, each a median of interleaved repeats)")
    return checked
