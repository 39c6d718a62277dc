"""Checks bench/timeline.py's numbers on hand-made traces whose answers are known.

    python3 bench/test_timeline.py        (no matplotlib needed; not part of ./test.sh's C++ suite)
"""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timeline  # noqa: E402


def span(name, pid, tid, ts, dur, **args):
    e = {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if args:
        e["args"] = args
    return e


def thread(pid, tid, name):
    return {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def write(events):
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump({"traceEvents": events}, f)
    f.close()
    return f.name


class Timeline(unittest.TestCase):
    def ddp_rank(self, pid):
        # A 100 us step: forward 0-30, backward 30-90 with a wait 80-90, optimizer 90-100;
        # bucket 0 at 40-50 (under backward), bucket 1 at 82-88 (inside the wait: exposed).
        return [thread(pid, 1, "train"), thread(pid, 2, f"comm (rank {pid})"),
                span("step 2", pid, 1, 0, 100), span("forward", pid, 1, 0, 30), span("backward", pid, 1, 30, 60),
                span("wait for buckets", pid, 1, 80, 10), span("optimizer step", pid, 1, 90, 10),
                span("all_reduce bucket 0", pid, 2, 40, 10, params=5, bytes=1024),
                span("all_reduce bucket 1", pid, 2, 82, 6)]

    def test_ddp_busy_bubble_and_hidden(self):
        rows, windows, _ = timeline.analyse(timeline.merge([write(self.ddp_rank(0)), write(self.ddp_rank(1))]), 2)
        self.assertEqual(len(windows), 2)  # two ranks of one run
        by = {r["label"]: r for r in rows}
        self.assertEqual(set(by), {"rank 0: train", "comm (rank 0)", "rank 1: train", "comm (rank 1)"})
        self.assertAlmostEqual(by["rank 0: train"]["busy"], 0.9)  # the 10 us wait is not work
        self.assertAlmostEqual(by["rank 0: train"]["bubble"], 0.1)
        self.assertAlmostEqual(by["comm (rank 0)"]["busy"], 0.16)
        self.assertAlmostEqual(by["comm (rank 0)"]["hidden"], 10 / 16)  # bucket 1 sat in the wait
        self.assertIsNone(by["comm (rank 0)"]["bubble"])
        text = timeline.draw_text(rows, windows, _, 2)
        self.assertIn("comm (rank 1): all_reduce bucket 0: launched at +0 ms, took 0 ms, 5 parameters", text)

    def test_separate_runs_are_renumbered_and_aligned(self):
        a = [thread(0, 1, "train"), span("step 1", 0, 1, 1000, 50), span("forward", 0, 1, 1000, 50)]
        b = [thread(0, 1, "train"), span("step 1", 0, 1, 9000, 80), span("forward", 0, 1, 9000, 40)]
        rows, windows, offsets = timeline.analyse(timeline.merge([write(a), write(b)]), 1)
        self.assertEqual(len(windows), 2)  # pid 0 twice: the second file's is renumbered
        self.assertEqual(sorted(offsets.values()), [1000, 9000])  # each run from its own step start
        self.assertAlmostEqual(sorted(r["busy"] for r in rows)[0], 0.5)

    def test_pipeline_bubble_against_the_formula(self):
        # 2 stages, 2 micro-batches, unit-time F and B: GPipe's clock has 6 ticks, each stage busy 4.
        ev = [thread(0, 1, "train"), thread(0, 2, "stage 1"), span("step 1", 0, 1, 0, 60),
              span("pipeline forward and backward", 0, 1, 0, 60)]
        for s, times in [(0, [("F0", 0), ("F1", 10), ("B0", 40), ("B1", 50)]),
                         (1, [("F0", 10), ("F1", 20), ("B0", 30), ("B1", 40)])]:
            ev += [span(f"{n} stage {s}", 0, 1 + s, t, 10) for n, t in times]
        rows, windows, _ = timeline.analyse(timeline.merge([write(ev)]), 1)
        self.assertEqual(timeline.pipeline_formula(rows), {0: (2, 2, 1 / 3)})  # run key: its start
        for r in rows:
            self.assertAlmostEqual(r["pipeline_bubble"], 1 / 3)  # as (S-1)/(M+S-1)

    def test_interleaved_formula_counts_the_virtual_stages(self):
        # 2 stages x 2 virtual stages each (0-3), 4 micro-batches: (S-1)/(V*M+S-1) = 1/9.
        ev = [thread(0, 1, "train"), thread(0, 2, "stage 1"), span("step 1", 0, 1, 0, 100)]
        for s in (0, 1):
            for c in (s, s + 2):
                ev += [span(f"F{m} stage {s} virtual stage {c}", 0, 1 + s, 10 * m, 5) for m in range(4)]
        rows, _, _ = timeline.analyse(timeline.merge([write(ev)]), 1)
        self.assertEqual(timeline.pipeline_formula(rows), {0: (2, 4, 1 / 9)})

    def test_stages_as_processes_are_one_pipeline(self):
        # Two ranks, a stage each; stage 1 waits 10 of its 40 us inside its F0 for the activation.
        r0 = [thread(0, 1, "train"), span("step 1", 0, 1, 0, 40), span("pipeline forward and backward", 0, 1, 0, 40),
              span("F0 stage 0", 0, 1, 0, 10), span("B0 stage 0", 0, 1, 30, 10)]
        r1 = [thread(1, 1, "train"), span("step 1", 1, 1, 0, 40), span("pipeline forward and backward", 1, 1, 0, 40),
              span("F0 stage 1", 1, 1, 0, 20), span("wait for activation", 1, 1, 0, 10), span("B0 stage 1", 1, 1, 20, 10)]
        rows, _, _ = timeline.analyse(timeline.merge([write(r0), write(r1)]), 1)
        self.assertEqual(timeline.pipeline_formula(rows), {0: (2, 1, 1 / 2)})
        self.assertEqual([round(r["pipeline_bubble"], 3) for r in rows], [0.5, 0.5])

    def test_stage_bubbles_share_one_window_and_average_the_steps(self):
        # The window is the run's first action to its last (0-40 us in step 1), not each
        # process's "pipeline forward and backward" span: rank 1's starts late, at 10, and
        # its idle 0-10 still counts. Step 2 repeats step 1 with both stages busy throughout.
        r0 = [thread(0, 1, "train"), span("step 1", 0, 1, 0, 50), span("pipeline forward and backward", 0, 1, 0, 45),
              span("F0 stage 0", 0, 1, 0, 10), span("B0 stage 0", 0, 1, 30, 10),
              span("step 2", 0, 1, 100, 50), span("F0 stage 0", 0, 1, 100, 20), span("B0 stage 0", 0, 1, 120, 20)]
        r1 = [thread(1, 1, "train"), span("step 1", 1, 1, 0, 50), span("pipeline forward and backward", 1, 1, 10, 20),
              span("F0 stage 1", 1, 1, 10, 10), span("B0 stage 1", 1, 1, 20, 10),
              span("step 2", 1, 1, 100, 50), span("F0 stage 1", 1, 1, 100, 20), span("B0 stage 1", 1, 1, 120, 20)]
        events = timeline.merge([write(r0), write(r1)])
        rows, _, _ = timeline.analyse(events, 1)
        self.assertEqual({r["stage"]: r["pipeline_bubble"] for r in rows}, {0: 0.5, 1: 0.5})
        self.assertEqual(timeline.stage_bubbles(events, [1, 2]), {0: 0.25, 1: 0.25})

    def test_kinds_by_name(self):
        for name, k in [("forward", "forward"), ("forward layer1", "forward"), ("F3 stage 1", "forward"),
                        ("B0 stage 0", "backward"), ("recompute", "recompute"), ("optimizer step", "optimizer"),
                        ("wait for buckets", "waiting"), ("all_reduce bucket 2", "all-reduce"),
                        ("all_gather layer2", "all-gather"), ("reduce_scatter fc", "reduce-scatter"),
                        ("broadcast buffers", "broadcast"), ("step 12", "step"),
                        ("pipeline forward and backward", "group"), ("gradient hooks", "group")]:
            self.assertEqual(timeline.kind(name), k, name)

    def test_a_missing_step_names_the_steps_there_are(self):
        with self.assertRaises(SystemExit) as e:
            timeline.analyse(timeline.merge([write(self.ddp_rank(0))]), 7)
        self.assertIn("no span 'step 7'", str(e.exception))
        self.assertIn("[2]", str(e.exception))


if __name__ == "__main__":
    unittest.main()
