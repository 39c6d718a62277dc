"""Tests of bench/docs_checks.py and bench/docs_figures.py: each check passes a true page
and fails its mutation (a limitation that went away or says something else, a ratio that
disagrees with its rows, a quoted figure that disagrees with its file, a "not yet" on a
mode page, a refusal without its limitations entry, a private path, a caption's history).
Run by meson test (test_docs_checks); standard library only."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docs_checks  # noqa: E402
import docs_figures  # noqa: E402


def page_with(limitations):
    blocks = [f"```limitation\n$ {command}\n{expected}\n```\n" for command, expected in limitations]
    return "# Limitations\n\n" + "\n".join(blocks)


class Limitations(unittest.TestCase):
    def run_page(self, text):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "docs"))
            os.makedirs(os.path.join(root, "build"))
            scripts = {"fails.sh": "echo \"error: --mode x cannot do y\" >&2\nexit 1\n",
                       # a doctest case under --success: its passing assertion, quoted
                       "test_passes.sh": "echo 'CHECK( contains(e, \"--mode x cannot do y\") ) is correct!'\n"
                                         "echo '[doctest] test cases: 1 | 1 passed'\n",
                       "test_fails.sh": "echo '[doctest] test cases: 1 | 0 passed | 1 failed'\nexit 1\n",
                       "test_none.sh": "echo '[doctest] test cases: 0 | 0 passed'\n"}
            for name, script in scripts.items():
                with open(os.path.join(root, "build", name), "w") as f:
                    f.write(script)
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

    def run_test_block(self, script, expected):
        return self.run_page(f"```limitation-test\n$ bash build/{script} --test-case='x*'\n{expected}\n```\n")

    def test_a_limitation_test_that_passes_asserting_the_error_holds(self):
        self.assertEqual(self.run_test_block("test_passes.sh", "--mode x cannot do y"), (1, []))

    def test_mutation_the_test_of_a_refusal_fails(self):
        _, problems = self.run_test_block("test_fails.sh", "--mode x cannot do y")
        self.assertEqual(len(problems), 1)
        self.assertIn("no longer passes", problems[0])

    def test_mutation_the_test_case_filter_matches_nothing(self):
        _, problems = self.run_test_block("test_none.sh", "--mode x cannot do y")
        self.assertEqual(len(problems), 1)
        self.assertIn("ran no test case", problems[0])

    def test_mutation_the_test_asserts_another_error(self):
        _, problems = self.run_test_block("test_passes.sh", "an error it does not assert")
        self.assertEqual(len(problems), 1)
        self.assertIn("asserts no", problems[0])

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
        self.assertEqual(docs_figures.check_ratios(self.results(1.61), "r.json", problems), 1)
        self.assertEqual(problems, [])

    def test_mutation_a_ratio_that_disagrees_with_its_rows(self):
        problems = []
        docs_figures.check_ratios(self.results(1.68), "r.json", problems)  # a median of per-repeat ratios
        self.assertEqual(len(problems), 1)
        self.assertIn("142.74 / 88.65", problems[0])

    def test_ratio_figure_names_the_column(self):
        doc = self.results(1.5)
        doc["ratio_figure"] = "peak"
        problems = []
        docs_figures.check_ratios(doc, "r.json", problems)
        self.assertEqual(problems, [])

    def test_ratios_not_between_rows_are_left_alone(self):
        problems = []
        self.assertEqual(docs_figures.check_ratios(self.results(9.9, "bound DDP / bound independent"), "r.json",
                                                  problems), 0)
        self.assertEqual(problems, [])


class RatioColumns(unittest.TestCase):
    def results(self, vs_tuned=1.70, bf16=1.15):
        return {"labels": ["batch", "amp"],
                "columns": [{"key": "batch"}, {"key": "amp"}, {"key": "loom"}, {"key": "torch_tuned"},
                            {"key": "vs_tuned", "title": "loom / torch tuned", "format": ".2f",
                             "ratio_of": "loom / torch_tuned"},
                            {"key": "bf16_vs_f32", "title": "bf16 / f32", "format": ".2f",
                             "ratio_of": "loom / loom@amp=float32"},
                            {"key": "of_roof", "title": "% of roofline", "ratio_of": "100 * loom / torch_tuned"}],
                "rows": [{"batch": 128, "amp": "float32", "loom": 99.9, "torch_tuned": 58.82, "vs_tuned": vs_tuned,
                          "of_roof": 170},
                         {"batch": 128, "amp": "bf16", "loom": 114.9, "torch_tuned": 100.0, "vs_tuned": 1.15,
                          "bf16_vs_f32": bf16, "of_roof": 115},
                         {"batch": 32, "amp": "float32", "loom": 10.0, "torch_tuned": 10.0, "vs_tuned": 1.0,
                          "of_roof": 100}]}

    def test_ratios_beside_their_figures_pass(self):
        problems = []
        self.assertEqual(docs_figures.check_ratio_columns(self.results(), "r.json", problems), 7)
        self.assertEqual(problems, [])

    def test_mutation_a_ratio_that_is_not_its_rows_figures(self):
        problems = []  # benchmarks.md's AVX2 batch-32 row: 90.4 / 55.5 printed 1.49
        docs_figures.check_ratio_columns(self.results(vs_tuned=1.49), "r.json", problems)
        self.assertEqual(len(problems), 1)
        self.assertIn("99.9 / 58.82", problems[0])

    def test_mutation_a_ratio_to_another_row(self):
        problems = []  # the bf16 row against the float32 row of the same batch
        docs_figures.check_ratio_columns(self.results(bf16=1.25), "r.json", problems)
        self.assertEqual(len(problems), 1)
        self.assertIn("114.9 / 99.9", problems[0])


class QuotedFigures(unittest.TestCase):
    RESULTS = {"columns": [{"key": "isa"}, {"key": "batch"}, {"key": "vs_tuned"}, {"key": "mean"}],
               "rows": [{"isa": "native (AVX-512)", "batch": 128, "vs_tuned": 1.55, "mean": 0.164,
                         "last": "`epoch 1 loss 2.7966`"},
                        {"isa": "AVX2", "batch": 128, "vs_tuned": 1.7, "mean": 0.2}],
               "ratios": [{"name": "loom ddp / torch ddp (ratio of the medians; repeats 1.50-2.14)", "value": 1.61}]}

    def check(self, line):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "docs"))
            os.makedirs(os.path.join(root, "bench", "results"))
            with open(os.path.join(root, "bench", "results", "r.json"), "w") as f:
                json.dump(self.RESULTS, f)
            page = os.path.join(root, "docs", "p.md")
            problems = []
            count = docs_figures.check_quoted_figures(page, line + "\n", root, problems)
            return count, problems

    def test_figures_quoted_as_in_their_file_pass(self):
        page = ('loom is [1.55×](../bench/results/r.json "vs_tuned @ isa=native (AVX-512), batch=128") as fast, '
                'its bubble [16.4%](../bench/results/r.json "100 * mean @ isa=native (AVX-512), batch=128"), '
                'DDP [1.61×](../bench/results/r.json "ratio: loom ddp / torch ddp"); '
                '[the file](../bench/results/r.json) is only a link.')
        self.assertEqual(self.check(page), (3, []))

    def test_mutation_a_figure_of_another_run(self):
        count, problems = self.check('[1.56×](../bench/results/r.json "vs_tuned @ isa=native (AVX-512), batch=128")')
        self.assertEqual(len(problems), 1)
        self.assertIn("the file says 1.55", problems[0])

    def test_a_text_cell_is_quoted_by_its_figure(self):
        self.assertEqual(self.check('[2.7966](../bench/results/r.json "last @ isa=native (AVX-512)")'), (1, []))
        _, problems = self.check('[2.7996](../bench/results/r.json "last @ isa=native (AVX-512)")')
        self.assertEqual(len(problems), 1)

    def test_a_selector_that_names_no_single_row_is_a_problem(self):
        _, problems = self.check('[1.55](../bench/results/r.json "vs_tuned @ batch=128")')
        self.assertEqual(len(problems), 1)
        self.assertIn("selects 2 rows", problems[0])


class PagePaths(unittest.TestCase):
    def problems(self, text, check=docs_checks.check_private_paths):
        problems = []
        check(os.path.join("/repo", "docs/x.md"), text, "/repo", problems)
        return problems

    def test_relative_paths_pass(self):
        self.assertEqual(self.problems("`LOOM_TRACE=t.json build/examples/train_cifar10 --data data/x`\n"), [])

    def test_mutation_each_private_path(self):
        for path in ["--data ../shared/data/cifar-10-batches-bin", "--curve ~/.cache/loom/x.json",
                     "LOOM_TRACE=/tmp/t.json", "--measured /tmp/runs.json"]:
            self.assertEqual(len(self.problems(f"```\nrun {path}\n```\n")), 1, path)

    def test_mutation_history_in_a_caption(self):
        for caption in ["*Made at commit `abc` (the working tree had changes beyond it).*",
                        "<!-- results: bench/results/x.json -->\n*T.* The series resumed from the runs already made."
                        "\n<!-- end results -->", "![a chart; the uncommitted changes touched nothing](img/x.png)"]:
            self.assertEqual(len(self.problems(caption + "\n", docs_checks.check_caption_words)), 1, caption)

    def test_conditions_in_a_caption_pass(self):
        caption = "*Made at commit `abc`, 2026-12-05. A quiet machine; the run resumed nothing.*\n"
        self.assertEqual(self.problems(caption, docs_checks.check_caption_words), [])


class Refusals(unittest.TestCase):
    SECTIONS = {"checkpoints": 2, "several-machines": 0}

    def problems(self, text, rel="docs/launch.md"):
        problems = []
        docs_checks.check_refusals(os.path.join("/repo", rel), text, "/repo", problems, self.SECTIONS)
        return problems

    def test_a_refusal_linking_its_tested_entry_passes(self):
        text = ("Under `--pp`, `--checkpoint-format full` is refused\n"
                "([limitations.md](limitations.md#checkpoints)).\n")
        self.assertEqual(self.problems(text), [])

    def test_mutation_a_refusal_without_its_entry(self):
        problems = self.problems("Intro.\n\nUnder `--pp`, a full checkpoint is refused.\n")
        self.assertEqual(len(problems), 1)
        self.assertIn("docs/launch.md:3", problems[0])

    def test_mutation_an_entry_without_a_test(self):
        problems = self.problems("It cannot run on two machines ([l](limitations.md#several-machines)).\n")
        self.assertEqual(len(problems), 1)
        self.assertIn("holds no", problems[0])

    def test_code_and_the_limitations_page_are_exempt(self):
        self.assertEqual(self.problems("```\nerror: x cannot be y\n```\nSay `refused` in code.\n"), [])
        self.assertEqual(self.problems("It cannot.\n", rel="docs/limitations.md"), [])

    def test_tested_sections_count_their_blocks(self):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "docs"))
            with open(os.path.join(root, docs_checks.LIMITATIONS_PAGE), "w") as f:
                f.write("# L\n\n## Checkpoints\n\n```limitation\n$ false\nx\n```\n\n### Sub part\n\n"
                        "```limitation-test\n$ false\ny\n```\n\n## Several machines\n\nNone recorded.\n")
            self.assertEqual(docs_checks.tested_sections(root),
                             {"l": 2, "checkpoints": 2, "sub-part": 1, "several-machines": 0})


if __name__ == "__main__":
    unittest.main()
