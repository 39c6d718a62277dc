"""Figures against their results files, beside bench/report.py's rendering (which runs these):

- One ratio per comparison, by one rule. A results file's ratio named "<row> / <row>" (two
  labels of its table's first column, and an optional "(...)" after) must equal the ratio of
  those rows' figures in its `ratio_figure` column (default: the first numeric column), to
  the ratio's printed precision: the bars a chart draws and the ratio beside them cannot
  disagree.
- A ratio printed beside its row's figures follows from them. A column whose spec says
  `"ratio_of": "loom / torch_tuned"` holds, in every row, that row's `loom` over its
  `torch_tuned`, to the column's printed precision. A term `key@col=value` is the figure of
  another row: the one with that value in `col` and this row's values in the file's other
  `labels` (the columns that name a row; default the first), e.g. "img_per_s /
  img_per_s@mode=loom single" or, per batch, "img_per_s / img_per_s@amp=float32" with
  "labels": ["batch", "amp"]. "100 * a / b" is a percentage.
- A figure quoted in prose is a link to its results file whose title names the cell:

      [1.70×](../bench/results/train_isa.json "vs_tuned @ isa=AVX2, batch=128")
      [16.4%](../bench/results/pipeline_bubble.json "100 * mean @ schedule=1F1B, stages=threads")
      [1.61](../bench/results/modes.json "ratio: loom ddp / torch ddp")

  The reader follows the link to the file (and its page's table); the check reads the first
  number of the link's text and wants the cell, to the text's precision. A title is
  `[100 *] KEY [/ 60|3600|1024] [@ col=value, ...]` (a column's key, as a percentage or in
  minutes, hours or GiB, and the values that pick its row; none for a file of one row) or
  `ratio: NAME` (an entry of the file's ratios, NAME without its "(...)"). A link to a
  results file without a title is only a link.

Standard library only.
"""
import json
import os
import re

RESULTS_LINK = re.compile(r"\[(?P<text>(?:[^\[\]]|\[[^\[\]]*\])*)\]\((?P<path>[^)\s]*bench/results/[\w.-]+\.json)"
                          r"\s+\"(?P<title>[^\"]*)\"\)")
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def decimals(fmt):
    """The decimals a format prints (".2f" -> 2, "+.1f" -> 1, ",.0f" -> 0); 2 without one."""
    match = re.search(r"\.(\d+)f", fmt or ".2f")
    return int(match.group(1)) if match else 2


def agrees(shown, value, places):
    """Whether `shown`, printed to `places` decimals, is `value` rounded."""
    return abs(shown - value) <= 0.5 * 10 ** -places + 1e-9


def labels_of(results):
    columns = results.get("columns", [])
    return results.get("labels") or ([columns[0]["key"]] if columns else [])


def same(value, wanted):
    """A cell against a label written in a selector: as text, or as the number it is."""
    if str(value) == wanted:
        return True
    try:
        return isinstance(value, (int, float)) and float(wanted) == value
    except ValueError:
        return False


def parse_labels(text):
    """"col=value, col=value" -> {col: value} (a value may hold ", " only after its own "=")."""
    pairs = {}
    for part in re.split(r",\s*(?=[\w]+=)", text.strip()):
        if part:
            key, _, value = part.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def rows_where(results, wanted):
    return [r for r in results.get("rows", []) if all(same(r.get(k), v) for k, v in wanted.items())]


def term_value(results, row, term):
    """The figure a term of a ratio_of names for `row`: "key" or "key@col=value, ..."."""
    key, _, where = term.partition("@")
    key = key.strip()
    if not where:
        return row.get(key), None
    wanted = {k: str(row.get(k)) for k in labels_of(results)}
    wanted.update(parse_labels(where))
    found = rows_where(results, wanted)
    if len(found) != 1:
        return None, f"{term} names {len(found)} rows (labels {wanted})"
    return found[0].get(key), None


def check_ratio_columns(results, rel, problems):
    """Every cell of a `ratio_of` column against its row's figures; returns the cells checked."""
    checked = 0
    for column in results.get("columns", []):
        spec = column.get("ratio_of")
        if not spec:
            continue
        scale, expression = 1.0, spec
        match = re.fullmatch(r"\s*100\s*\*\s*(.*)", spec)
        if match:
            scale, expression = 100.0, match.group(1)
        top_term, _, bottom_term = expression.partition(" / ")
        for row in results.get("rows", []):
            shown = row.get(column["key"])
            if shown is None or shown == "":
                continue
            top, why = term_value(results, row, top_term)
            bottom, why_bottom = term_value(results, row, bottom_term)
            name = ", ".join(f"{k}={row.get(k)}" for k in labels_of(results))
            if why or why_bottom:
                problems.append(f"{rel}: column {column['key']} ({spec}), row {name}: {why or why_bottom}")
                continue
            if not isinstance(top, (int, float)) or not isinstance(bottom, (int, float)) or bottom == 0:
                problems.append(f"{rel}: column {column['key']} ({spec}), row {name}: no figures to divide "
                                f"({top!r} / {bottom!r})")
                continue
            implied = scale * top / bottom
            if column.get("format"):
                places = decimals(column["format"])
            else:  # printed as stored: 152, or "167%"
                places = 0 if isinstance(shown, int) else printed_places(str(shown))
            value = shown if isinstance(shown, (int, float)) else first_number(str(shown))
            checked += 1
            if value is None or not agrees(value, implied, places):
                problems.append(f"{rel}: row {name}: {column['title']} is {shown}, but its figures give "
                                f"{top} / {bottom}{' x 100' if scale != 1 else ''} = {implied:.{places + 1}f}: "
                                "a ratio beside its row's figures is the ratio of those figures")
    return checked


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
        if not agrees(ratio["value"], implied, decimals(ratio.get("format"))):
            problems.append(f"{rel}: ratio \"{ratio['name']}\" is {ratio['value']}, but its rows' {figure} give "
                            f"{top} / {bottom} = {implied:.3f}: one comparison, one rule (the ratio of the figures "
                            "shown, each a median of interleaved repeats)")
    return checked


def first_number(text):
    match = NUMBER.search(text)
    return float(match.group(0).replace(",", "")) if match else None


def printed_places(text):
    match = NUMBER.search(text)
    if not match or "." not in match.group(0):
        return 0
    return len(match.group(0).split(".")[1])


def cell_of(results, title):
    """(value, None) for a link title's cell, or (None, why not)."""
    title = title.strip()
    if title.startswith("ratio:"):
        name = title[len("ratio:"):].strip()
        found = [r for r in results.get("ratios", [])
                 if r["name"] == name or re.sub(r"\s*\([^()]*\)\s*$", "", r["name"]).strip() == name]
        if len(found) != 1:
            return None, f"no single ratio named \"{name}\" (it has {[r['name'] for r in results.get('ratios', [])]})"
        return found[0]["value"], None
    scale = 1.0
    match = re.fullmatch(r"100\s*\*\s*(.*)", title)
    if match:
        scale, title = 100.0, match.group(1)
    key, _, where = title.partition("@")
    key = key.strip()
    match = re.fullmatch(r"(\S+)\s*/\s*(60|3600|1024)", key)  # seconds as minutes or hours, MiB as GiB
    if match:
        key, scale = match.group(1), scale / float(match.group(2))
    found = rows_where(results, parse_labels(where)) if where else results.get("rows", [])
    if len(found) != 1:
        return None, f"\"{where.strip()}\" selects {len(found)} rows, not one"
    if key not in found[0]:
        return None, f"the row has no column \"{key}\" (it has {sorted(found[0])})"
    value = found[0][key]
    if isinstance(value, (int, float)):
        return scale * value, None
    return value, None


def check_quoted_figures(page, text, root, problems):
    """Every figure a page quotes from a results file (a titled link to it) against the file;
    returns how many were checked."""
    rel = os.path.relpath(page, root)
    checked = 0
    for match in RESULTS_LINK.finditer(text):
        path = os.path.normpath(os.path.join(os.path.dirname(page), match.group("path")))
        if not os.path.exists(path):
            continue  # the link check says so
        with open(path) as f:
            results = json.load(f)
        quoted = " ".join(match.group("text").split())
        value, why = cell_of(results, match.group("title"))
        where = f"{rel}: \"{quoted}\" quoted from {os.path.relpath(path, root)} (\"{match.group('title')}\")"
        if why:
            problems.append(f"{where}: {why}")
            continue
        checked += 1
        shown = first_number(quoted)
        if isinstance(value, (int, float)):
            if shown is None or not agrees(shown, value, printed_places(quoted)):
                problems.append(f"{where}: the file says {value}; quote the file's figure (or the figure of "
                                "another measurement, with its own link)")
        elif str(value) not in quoted and not (NUMBER.search(quoted) and NUMBER.search(quoted).group(0) in str(value)):
            problems.append(f"{where}: the file says \"{value}\"")  # a text cell: the quote is it, or its figure
    return checked
