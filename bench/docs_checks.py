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
  A rule of the library's API that no program meets from the command line is held by the
  test that asserts it, in a ```limitation-test block: a doctest case (`--test-case=`) that
  must run, pass, and print (under `--success`, which prints each passing assertion) the
  error it asserts; a refusal that went away fails that test, and so the docs test.
- No page but limitations.md says "not yet", "not supported", "unsupported", "not applied" or
  "has not run" in its prose (code blocks, which quote programs, are exempt): a limitation
  stated anywhere else is one nobody checks.
- A refusal is a limitation. A paragraph of any page but limitations.md that says
  "refused", "cannot" or "not supported" links the limitations.md section that lists it
  (`[...](limitations.md#checkpoints)`), and that section holds at least one ```limitation
  block, so the refusal is tested. Input that is wrong (a rank outside the world, a file
  that is not a checkpoint) is an error, and the pages say so in those words.
- No private paths: no page names `../shared`, `~/.cache` or `/tmp/` (commands write to the
  working directory, or a placeholder names the folder).
- Captions state the conditions of a measurement, not the story of how it was made: no
  results block, caption or picture's alternative text speaks of the working tree,
  uncommitted changes, or a series resumed.

The figures against their results files are bench/docs_figures.py's.

Standard library only.
"""
import os
import re
import shlex
import subprocess

FORBIDDEN = re.compile(r"\b(not yet|not supported|unsupported|not applied|has not run)\b", re.I)
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
RESULTS_BLOCK = re.compile(r"<!-- results: \S+ -->\n.*?<!-- end results -->", re.S)
LIMITATION = re.compile(r"^```(?P<kind>limitation(?:-test)?)\n\$ (?P<command>[^\n]+)\n(?P<expected>.*?)\n```$",
                        re.S | re.M)
TEST_CASES_RUN = re.compile(r"test cases:\s*(\d+)")
LIMITATIONS_PAGE = os.path.join("docs", "limitations.md")
BUILD_WORD = re.compile(r"(^|[\s'\"=(;&|])build/")


def limitations(text):
    """[(command, expected output, kind)] of a limitations page; kind is "limitation" (the
    command fails saying it) or "limitation-test" (a test case that asserts the refusal)."""
    return [(m.group("command").strip(), m.group("expected").strip(), m.group("kind"))
            for m in LIMITATION.finditer(text)]


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
    for command, expected, kind in entries:
        # `build/` at the start of a word (also inside a quoted bash -c script) is the build tested.
        line = BUILD_WORD.sub(lambda m: m.group(1) + shlex.quote(build) + "/", command)
        if kind == "limitation-test":
            line += " --success"
        try:
            out = subprocess.run(["bash", "-c", line], cwd=root, capture_output=True, text=True, timeout=timeout,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))
        except (OSError, subprocess.TimeoutExpired) as e:
            problems.append(f"{LIMITATIONS_PAGE}: `{command}` could not run as the page says: {e}")
            continue
        said = out.stdout + out.stderr
        if kind == "limitation-test":
            ran = TEST_CASES_RUN.search(said)
            if out.returncode != 0:
                tail = said.strip().splitlines()[-1:] or ["(nothing)"]
                problems.append(f"{LIMITATIONS_PAGE}: `{command}` failed: the test asserting the refusal no longer "
                                f"passes (the refusal went away, or says something else); it said: {tail[0]}")
            elif not ran or int(ran.group(1)) == 0:
                problems.append(f"{LIMITATIONS_PAGE}: `{command}` ran no test case: its --test-case names none")
            elif expected not in said:
                problems.append(f"{LIMITATIONS_PAGE}: `{command}` passed, but asserts no \"{expected}\"")
        elif out.returncode == 0:
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


REFUSAL = re.compile(r"\b(refused|cannot|not supported)\b", re.I)
LIMITATION_LINK = re.compile(r"\]\((?:[^)\s#]*/)?limitations\.md#([\w-]+)")
PRIVATE_PATH = re.compile(r"\.\./shared\b|~/\.cache\b|(?<![\w.~-])/tmp/")
CAPTION_WORDS = re.compile(r"working tree|uncommitted|beyond (?:it|the commit)|\bseries resumed\b|"
                           r"\bresumed from the runs\b|\bnow includes\b|\bran again\b", re.I)
IMAGE_ALT = re.compile(r"!\[([^\]]*)\]")


def anchor(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def masked_prose(text):
    """The page with results blocks and fenced code blanked (line numbers kept) and inline code
    dropped: what the page says in its own words."""
    prose = RESULTS_BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), prose)
    return re.sub(r"`[^`\n]*`", "", prose)


def paragraphs(prose):
    """[(first line number, text)] of the blocks between blank lines."""
    found, lines, start = [], [], 0
    for number, line in enumerate(prose.splitlines() + [""], 1):
        if line.strip():
            if not lines:
                start = number
            lines.append(line)
        elif lines:
            found.append((start, "\n".join(lines)))
            lines = []
    return found


def tested_sections(root):
    """{anchor: ```limitation blocks in that section of limitations.md, its subsections included}."""
    page = os.path.join(root, LIMITATIONS_PAGE)
    if not os.path.exists(page):
        return {}
    with open(page) as f:
        text = f.read()
    headings = [(m.start(), len(m.group(1)), anchor(m.group(2))) for m in
                re.finditer(r"^(#+) (.*)$", FENCE.sub(lambda m: " " * len(m.group(0)), text), re.M)]
    blocks = [m.start() for m in LIMITATION.finditer(text)]
    sections = {}
    for i, (start, level, name) in enumerate(headings):
        end = next((s for s, lv, _ in headings[i + 1:] if lv <= level), len(text))
        sections[name] = sum(start < b < end for b in blocks)
    return sections


def check_refusals(page, text, root, problems, sections=None):
    """A paragraph outside limitations.md that states a refusal links the limitations.md
    section listing it, and that section is tested (holds a ```limitation block)."""
    rel = os.path.relpath(page, root)
    if rel == LIMITATIONS_PAGE:
        return 0
    sections = tested_sections(root) if sections is None else sections
    stated = 0
    for number, paragraph in paragraphs(masked_prose(text)):
        match = REFUSAL.search(paragraph)
        if not match:
            continue
        stated += 1
        linked = LIMITATION_LINK.findall(paragraph)
        if not linked:
            problems.append(f"{rel}:{number}: \"{match.group(0)}\" states a refusal without a link to the "
                            f"{LIMITATIONS_PAGE} section that lists it ([...](limitations.md#section)); wrong "
                            "input is \"an error\", not a refusal")
        elif not any(sections.get(name) for name in linked):
            problems.append(f"{rel}:{number}: \"{match.group(0)}\" links {LIMITATIONS_PAGE}#{linked[0]}, which holds "
                            "no ```limitation block: list the refusal there with its command and error")
    return stated


def check_private_paths(page, text, root, problems):
    """No page names a folder of one machine: ../shared, ~/.cache, /tmp/."""
    rel = os.path.relpath(page, root)
    for number, line in enumerate(text.splitlines(), 1):
        match = PRIVATE_PATH.search(line)
        if match:
            problems.append(f"{rel}:{number}: \"{match.group(0)}\" is a path of one machine: write a path in the "
                            "working directory or a placeholder (a results file's command: fix it in the file)")


def check_caption_words(page, text, root, problems):
    """Captions (results blocks, italic caption lines, pictures' alternative text) say under
    what conditions a figure was measured, never how the measuring went."""
    rel = os.path.relpath(page, root)
    captions = [m.group(0) for m in RESULTS_BLOCK.finditer(text)]
    prose = FENCE.sub("", RESULTS_BLOCK.sub("", text))
    captions += [line for line in prose.splitlines() if re.match(r"\*[^*\s]", line.strip())]
    captions += IMAGE_ALT.findall(prose)
    for caption in captions:
        match = CAPTION_WORDS.search(caption)
        if match:
            quoted = caption[max(0, match.start() - 60):match.end() + 20]
            problems.append(f"{rel}: a caption says \"{match.group(0)}\" (\"...{quoted}...\"): state the "
                            "measurement's conditions, not its history")
