// Supervisor: starts loomrun's workers and watches them until the job ends.
//
// Note [How loomrun stops a job]
// Each worker runs in its own process group, so a signal sent to the group reaches the
// worker and anything it started. loomrun blocks SIGCHLD, SIGINT, SIGTERM and SIGHUP and
// reads them from a signalfd in the same poll() loop that copies worker output, so a
// signal is handled between two steps, never in the middle of one. Then:
//  - a worker exits non-zero or is killed: it is the failure; the others get SIGTERM
//    and, after --grace_period seconds, SIGKILL; loomrun exits with that worker's code;
//  - SIGINT/SIGTERM/SIGHUP reach loomrun: forwarded to every worker, same grace period;
//    a second SIGINT kills at once;
//  - every worker that exits has its process group killed, so nothing it started
//    outlives it; workers die with loomrun (PR_SET_PDEATHSIG) even if loomrun is
//    killed with SIGKILL.
// loomrun is a child subreaper: descendants orphaned by a dying worker are re-parented
// to it rather than to init, so it kills and reaps them as well. Every one is reaped
// before loomrun returns: no process, not even a zombie, is left.
//
// Note [How loomrun restarts a job]
// With --max-restarts N (torchrun's flag), a failed attempt -- stopped as above -- is
// followed by a new one: every worker of this node starts again, with the attempt
// number in LOOM_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT (0 for the first), up to
// N times. The whole group restarts, not only the failed worker: a DDP group cannot
// take a rank back mid-step, so the training script instead resumes from its last
// checkpoint (loom's trainer does when the count is above 0: Note [Resuming after a
// restart], train/checkpoint.h). An
// interrupt (SIGINT/SIGTERM/SIGHUP) and a worker that cannot be started end the job
// at once. On several nodes each node's loomrun restarts its own workers: a rank that
// fails makes its peers' collectives fail, so every node's workers fail and restart,
// and the store refuses ranks of an older attempt (Note [Restart generations] in
// parallel/comm/launch_env.h).
#pragma once

#include "parallel/launcher/options.h"

namespace loom::launcher {

// Runs the job described by `options`; returns loomrun's exit status: 0 when every
// worker of the last attempt exited 0, else the failed worker's exit status (128 +
// signal when killed), or 128 + signal when loomrun itself was interrupted.
int run_workers(const LaunchOptions& options);

}  // namespace loom::launcher
