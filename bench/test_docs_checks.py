"""Tests of bench/docs_checks.py: each check passes a true page and fails its mutation (a
limitation that went away or says something else, a ratio that disagrees with its rows,
a "not yet" on a mode page). Run by meson test (test_docs_checks); standard library only."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docs_checks  # noqa: E402


def page_with(limitations):
    blocks = [f"```limitation\n$ {command}\n{expected}\n```\n" for command, expected in limitations]
    return "# Limitations\n\n" + "\n".join(blocks)


class Limitations(unittest.TestCase):
    def run_page(self, text):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "docs"))
            os.makedirs(os.path.join(root, "build"))
            with open(os.path.join(root, "build", "fails.sh"), "w") as f:
                f.write("echo \"error: --mode x cannot do y\" >&2\nexit 1\n")
            with open(os.path.join(root, docs_checks.LIMITATIONS_PAGE), "w") as f:
                f.write(text)
            problems = []
            count = docs_checks.check_limitations(root, os.path.join(root, "build"), problems)
            return count, problems

    def test_a_limitation_that_holds_passes(self):
        count, problems = self.run_page(page_with([("bash build/fails.sh --mode x", "--mode x cannot do y")]))
        self.assertEqual((count, problems), (1, []))

    def test_a_limitation_inside_a_script_finds_the_build(self):
        count, problems = self.run_page(page_with([("bash -c 'bash build/fails.sh && true'", "cannot do y")]))
        self.assertEqual((count, problems), (1, []))

    def test_mutation_the_command_now_succeeds(self):
        _, problems = self.run_page(page_with([("true", "anything")]))
        self.assertEqual(len(problems), 1)
        self.assertIn("now succeeds", problems[0])

    def test_mutation_the_command_fails_differently(self):
        _, problems = self.run_page(page_with([("bash build/fails.sh", "a message it no longer prints")]))
        self.assertEqual(len(problems), 1)
        self.assertIn("without", problems[0])

    def test_a_page_without_limitations_is_a_problem(self):
        _, problems = self.run_page("# Limitations\n\nNothing here.\n")
        self.assertEqual(len(problems), 1)


class Phrases(unittest.TestCase):
    def problems(self, rel, text):
        problems = []
        docs_checks.check_phrases(os.path.join("/repo", rel), text, "/repo", problems)
        return problems

    def test_mutation_not_yet_on_a_mode_page(self):
        problems = self.problems("docs/ddp.md", "# DDP\n\nGradient compression is not yet there.\n")
        self.assertEqual(len(problems), 1)
        self.assertIn("docs/ddp.md:3", problems[0])

    def test_each_phrase(self):
        for phrase in ["not yet", "Not supported", "unsupported", "not applied", "has not run"]:
            self.assertEqual(len(self.problems("docs/x.md", f"It is {phrase} here.\n")), 1, phrase)

    def test_code_and_the_limitations_page_are_exempt(self):
        self.assertEqual(self.problems("docs/ddp.md", "```\nerror: not supported\n```\nSay `not yet` in code.\n"), [])
        self.assertEqual(self.problems("docs/limitations.md", "FSDP's flat shards are not yet per parameter.\n"), [])


class Ratios(unittest.TestCase):
    def results(self, value, name="loom ddp / torch ddp (ratio of the medians)"):
        return {"columns": [{"key": "mode"}, {"key": "img_per_s"}, {"key": "peak"}],
                "rows": [{"mode": "loom ddp", "img_per_s": 142.74, "peak": 300},
                         {"mode": "torch ddp", "img_per_s": 88.65, "peak": 200}],
                "ratios": [{"name": name, "value": value}]}

    def test_a_ratio_of_the_figures_shown_passes(self):
        problems = []
        self.assertEqual(docs_checks.check_ratios(self.results(1.61), "r.json", problems), 1)
        self.assertEqual(problems, [])

    def test_mutation_a_ratio_that_disagrees_with_its_rows(self):
        problems = []
        docs_checks.check_ratios(self.results(1.68), "r.json", problems)  # a median of per-repeat ratios
        self.assertEqual(len(problems), 1)
        self.assertIn("142.74 / 88.65", problems[0])

    def test_ratio_figure_names_the_column(self):
        doc = self.results(1.5)
        doc["ratio_figure"] = "peak"
        problems = []
        docs_checks.check_ratios(doc, "r.json", problems)
        self.assertEqual(problems, [])

    def test_ratios_not_between_rows_are_left_alone(self):
        problems = []
        self.assertEqual(docs_checks.check_ratios(self.results(9.9, "bound DDP / bound independent"), "r.json",
                                                  problems), 0)
        self.assertEqual(problems, [])


if __name__ == "__main__":
    unittest.main()
