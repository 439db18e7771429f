//! [`LogView`]: a read-only view of a store's log. The store's index describes every record
//! in its log, so nothing outside the store may append to it (a record the index cannot take
//! makes every later open fail); the view offers the reads and the facts about the log, and no
//! way to change it.

use std::path::Path;

use bytes::Bytes;

use crate::config::Config;
use crate::error::Result;
use crate::log::{Log, LogIter, Lsn, RecordRef, RecoveryReport, SegmentInfo};
use crate::metrics::MetricsSnapshot;

/// A read-only view of a log: what [`Store::log`](crate::Store::log) hands out. It has no
/// append, sync, truncation or close (the store's own [`Store::sync`](crate::Store::sync)
/// makes its atoms durable):
///
/// ```compile_fail
/// # let dir = tempfile::tempdir().unwrap();
/// let store = continuum::Store::open(dir.path()).unwrap();
/// store.log().append(b"a record the store's index does not know");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct LogView<'a> {
    log: &'a Log,
}

impl<'a> From<&'a Log> for LogView<'a> {
    /// A view of a bare log (for code that reads both bare logs and stores' logs).
    fn from(log: &'a Log) -> Self {
        LogView { log }
    }
}

impl<'a> LogView<'a> {
    /// The record at `lsn`, if the log holds it; see [`Log::read`].
    ///
    /// # Errors
    /// As [`Log::read`].
    pub fn read(&self, lsn: Lsn) -> Result<Option<Bytes>> {
        self.log.read(lsn)
    }

    /// Calls `visit` with each record in `from..=to`, in order; see [`Log::visit`].
    ///
    /// # Errors
    /// As [`Log::visit`].
    pub fn visit(&self, from: Lsn, to: Lsn, visit: impl FnMut(u64, RecordRef<'_>) -> Result<bool>) -> Result<()> {
        self.log.visit(from, to, visit)
    }

    /// Calls `visit` with the record at each of `lsns` (ascending) that the log holds; see
    /// [`Log::visit_lsns`].
    ///
    /// # Errors
    /// As [`Log::visit_lsns`].
    pub fn visit_lsns(&self, lsns: &[u64], visit: impl FnMut(u64, RecordRef<'_>) -> Result<bool>) -> Result<usize> {
        self.log.visit_lsns(lsns, visit)
    }

    /// Iterates over the records from `lsn`; see [`Log::iter_from`].
    ///
    /// # Errors
    /// As [`Log::iter_from`].
    pub fn iter_from(&self, lsn: Lsn) -> Result<LogIter> {
        self.log.iter_from(lsn)
    }

    /// LSN of the oldest record the log holds (or of the next one, if it is empty).
    pub fn first_lsn(&self) -> Lsn {
        self.log.first_lsn()
    }

    /// LSN the next appended record will receive, as far as readers can see.
    pub fn next_lsn(&self) -> Lsn {
        self.log.next_lsn()
    }

    /// Every segment, oldest first.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.log.segments()
    }

    /// What recovery found and did when the log was opened.
    pub fn recovery_report(&self) -> &'a RecoveryReport {
        self.log.recovery_report()
    }

    /// A copy of the log's counters and latency histograms (see [`crate::metrics`]).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.log.metrics()
    }

    /// The log's directory.
    pub fn dir(&self) -> &'a Path {
        self.log.dir()
    }

    /// The configuration the log was opened with.
    pub fn config(&self) -> &'a Config {
        self.log.config()
    }
}

#[cfg(test)]
mod tests {
    use crate::{AtomOutput, Lsn, RunSpec, Store};

    /// What the view offers works on a store's log; that it offers no way to append is checked
    /// by the compiler (it has no such method: `store.log().append(..)` does not build).
    #[test]
    fn a_stores_log_view_reads_and_reports() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::builder(dir.path()).background(false).open().expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let output = AtomOutput { result: b"done".to_vec(), ..AtomOutput::default() };
        store.record_atom(run, "a", "k", &[], "", &output).expect("record");
        let log = store.log();
        let next = log.next_lsn().get();
        assert_eq!(next, 4, "a run and an atom's two records");
        assert_eq!(log.iter_from(Lsn::FIRST).expect("iter").count(), 3);
        assert!(log.read(Lsn::new(next - 1)).expect("read").is_some());
        let mut visited = 0;
        log.visit(Lsn::FIRST, Lsn::new(next - 1), |_, _| {
            visited += 1;
            Ok(true)
        })
        .expect("visit");
        assert_eq!(visited, 3);
        assert_eq!(log.segments().len(), 1);
        assert!(log.metrics().records >= 2);
        assert_eq!(log.dir(), dir.path());
        drop(store);
        Store::open(dir.path()).expect("the store opens again");
    }
}
