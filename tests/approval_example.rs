//! `examples/approval.rs` as it is meant to run: each phase in a process of its own (this test
//! binary run again as a child), the store reopened between them; the nested continuation is in
//! the store after the first, the decision after the second, and the approved tool runs exactly
//! once over two resumes.

#[allow(dead_code, reason = "the example's `main` is not called here")]
#[path = "../examples/approval.rs"]
mod approval;

use std::path::Path;
use std::process::Command;

use continuum::continuation::{ReasonKind, Verdict};
use continuum::{RunStatus, Store};

const PHASE_ENV: &str = "CONTINUUM_APPROVAL_PHASE";
const DIR_ENV: &str = "CONTINUUM_APPROVAL_DIR";

/// The child: runs the phase the parent names on the store it names.
#[test]
fn approval_phase_child() {
    let (Ok(phase), Ok(dir)) = (std::env::var(PHASE_ENV), std::env::var(DIR_ENV)) else { return };
    let dir = Path::new(&dir);
    match phase.as_str() {
        "start" => approval::start(dir),
        "approve" => approval::approve(dir, "it-lead"),
        "resume" => approval::resume(dir, &approval::world_of(dir)),
        other => panic!("unknown phase {other}"),
    }
    .expect("phase");
}

/// Runs `phase` in a child process and waits for it to exit successfully.
fn run_phase(phase: &str, dir: &Path) {
    let status = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "approval_phase_child", "--nocapture", "--test-threads=1"])
        .env(PHASE_ENV, phase)
        .env(DIR_ENV, dir)
        .status()
        .expect("spawn");
    assert!(status.success(), "phase {phase}: {status}");
}

#[test]
fn the_approved_tool_runs_once_across_three_processes() {
    let temp = tempfile::tempdir().expect("dir");
    let dir = temp.path().join("store");
    run_phase("start", &dir);
    {
        let store = Store::open_read_only(&dir).expect("open");
        let run = store.run_id(approval::RUN).expect("run");
        assert!(matches!(store.run_status(run).expect("status"), RunStatus::Suspended { .. }));
        let waiting = store.suspension(run).expect("read").expect("suspended");
        assert_eq!(waiting.reason.kind(), ReasonKind::Approval);
        assert_eq!((waiting.root.agent.as_str(), waiting.root.children[0].agent.as_str()), ("hr", "account"));
        assert_eq!(waiting.pending.len(), 1);
        assert_eq!(
            (waiting.pending[0].tool_call_id.as_str(), &waiting.pending[0].path),
            (approval::CALL, &vec!["hr".to_owned(), "account".to_owned()])
        );
    }
    run_phase("approve", &dir);
    {
        let store = Store::open_read_only(&dir).expect("open");
        let run = store.run_id(approval::RUN).expect("run");
        let waiting = store.suspension(run).expect("read").expect("still suspended until resumed");
        assert!(waiting.pending.is_empty());
        assert_eq!(waiting.decided.len(), 1);
        assert_eq!(
            (waiting.decided[0].decision.verdict, waiting.decided[0].decision.decided_by.as_str()),
            (Verdict::Approve, "it-lead")
        );
    }
    assert_eq!(approval::tool_runs(&approval::world_of(&dir)), 0, "nothing ran before the resume");
    run_phase("resume", &dir);
    run_phase("resume", &dir);
    assert_eq!(approval::tool_runs(&approval::world_of(&dir)), 1, "the approved tool ran exactly once");
    let store = Store::open_read_only(&dir).expect("open");
    let run = store.run_id(approval::RUN).expect("run");
    assert!(matches!(store.run_status(run).expect("status"), RunStatus::Finished { success: true, .. }));
    let resumed = store.resumed(run).expect("read").expect("resumed");
    assert_eq!(resumed.levels.len(), 2, "both levels of the tree come back");
}
