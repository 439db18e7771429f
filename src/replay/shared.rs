//! Rebuilds that share their reads of the log: the atoms of a round of policy snapshots, or
//! the heads given to [`Store::rebuild_contexts`]. Each rebuild is planned as the replayer
//! plans one (`Store::plan_scan`); plans whose LSN ranges overlap are scanned in one pass, each
//! record given to the plans of its run, and each fold then runs as an ordinary rebuild's
//! does. See `docs/ARCHITECTURE.md`, "A round of policy snapshots reads the log once".

use rayon::prelude::*;

use super::{Reading, Rebuilt, RunScan, ScanPart, ScanPlan, apply_deltas, scan_part_count};
use crate::codec::context::Context;
use crate::error::{Error, Result};
use crate::log::Lsn;
use crate::store::Store;
use crate::store::types::AtomId;

/// Which plans of a shared scan an atom's records go to: the plans grouped by run (runs share
/// no atom), and each atom id of the plans' members mapped to its run's group, so that a record
/// is offered to the plans of its run only, not to every plan.
struct PlanRouter {
    /// The smallest member id; `owner[id - first]` is the id's group plus one (0: no plan's).
    first: u64,
    owner: Vec<u8>,
    /// Per group, the indices of its plans.
    groups: Vec<Vec<usize>>,
}

impl PlanRouter {
    /// The router of `plans`, or `None` if their members span too many ids for a table of a
    /// byte per id (the scan then offers each record to every plan).
    fn new(plans: &[&ScanPlan]) -> Option<Self> {
        let first = plans.iter().filter_map(|plan| plan.in_run.ids().next()).min()?;
        let last = plans.iter().filter_map(|plan| plan.in_run.ids().next_back()).max()?;
        let span = usize::try_from(last - first + 1).ok().filter(|span| *span <= PLAN_ROUTER_IDS_MAX)?;
        let mut runs: Vec<u32> = Vec::new();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut owner = vec![0u8; span];
        for (index, plan) in plans.iter().enumerate() {
            let group = match runs.iter().position(|run| *run == plan.run) {
                Some(group) => group,
                None => {
                    runs.push(plan.run);
                    groups.push(Vec::new());
                    runs.len() - 1
                }
            };
            groups[group].push(index);
            let mark = u8::try_from(group + 1).ok()?;
            for id in plan.in_run.ids() {
                owner[(id - first) as usize] = mark;
            }
        }
        Some(Self { first, owner, groups })
    }

    /// The indices of the plans atom `id` may belong to.
    fn plans_of(&self, id: u64) -> &[usize] {
        let group =
            id.checked_sub(self.first).and_then(|at| usize::try_from(at).ok()).and_then(|at| self.owner.get(at));
        match group {
            Some(&mark) if mark > 0 => &self.groups[usize::from(mark) - 1],
            _ => &[],
        }
    }
}

/// The most atom ids a [`PlanRouter`]'s table spans (a byte each).
const PLAN_ROUTER_IDS_MAX: usize = 1 << 24;

/// A planned rebuild: its atom's position in the batch, the snapshot it starts from (`None`:
/// the log's start), and its scan's plan.
type Planned = (usize, Option<u64>, ScanPlan);

/// What a targeted read of one LSN costs, in LSNs of a scan of the whole range: measured
/// (`cargo bench --bench replay -- interleaved`, 2026-12-01) at 1.8x faster than the whole
/// range at one record in 128, 3.1x at one in 256 and 5.6x at one in 512, i.e. 70-90 LSNs.
const TARGETED_READ_COST_LSNS: u64 = 80;

/// Whether the targeted reads of `plans` cost more than one scan of the union of their
/// ranges (many runs each sparse in the same stretch of the log: one agent in hundreds,
/// all of them rebuilt together).
fn targeted_reads_cost_more(plans: &[Planned]) -> bool {
    let reads: u64 = plans
        .iter()
        .map(|(_, _, plan)| plan.targeted.as_ref().map_or(0, |(lsns, _)| lsns.len() as u64))
        .sum::<u64>()
        .saturating_mul(TARGETED_READ_COST_LSNS);
    let mut ranges: Vec<(u64, u64)> = plans.iter().map(|(_, _, plan)| (plan.from_lsn, plan.to_lsn)).collect();
    ranges.sort_unstable();
    let (mut union, mut reach) = (0u64, 0u64);
    for (from, to) in ranges {
        let from = from.max(reach);
        if to >= from {
            union += to - from + 1;
            reach = to + 1;
        }
    }
    plans.len() > 1 && reads >= union
}

/// At most this many rebuilds share one pass over the log (fewer than 256, so that a
/// [`PlanRouter`] numbers their runs in a byte), and no more are planned once their membership
/// tables (a byte per atom id of each plan's span) hold this many ids: 16 MB at most, while
/// the larger tables of a fold (about 17 bytes per id) are built for one plan at a time.
const SHARED_SCAN_PLANS_MAX: usize = 128;
const SHARED_SCAN_IDS_MAX: usize = 1 << 24;

impl Store {
    /// Rebuilds `atoms` on `pool` (`None`: on this thread, as policy snapshots do), handing
    /// each result to `done` (with the atom's position in `atoms`) as soon as it is ready, so
    /// that at most one rebuilt context is held at a time. Each result is what [`Store::rebuild_context`]
    /// returns for its atom. Each rebuild starts from its atom's newest snapshot (or the
    /// log's start); the scans of rebuilds whose LSN ranges overlap, agents writing side by
    /// side, are one pass over the log ([`Store::scan_shared`]) instead of one each. A rebuild
    /// that would read only its run's records (`TARGETED_RANGE_RATIO`) joins them only when
    /// enough of them do that one read of their ranges costs less than all of theirs
    /// (`targeted_reads_cost_more`). A rebuild that does not join, or whose shared scan cannot
    /// start it (its snapshot failed verification or is not on its path, or the pass failed),
    /// is done on its own, the ordinary way.
    pub(crate) fn rebuild_several(
        &self,
        atoms: &[AtomId],
        pool: Option<&rayon::ThreadPool>,
        mut done: impl FnMut(usize, Result<Rebuilt>),
    ) {
        let mut alone = Vec::new();
        let mut next = 0;
        while next < atoms.len() {
            // Plan the next atoms until their tables reach the budget.
            let mut planned: Vec<Planned> = Vec::new();
            let mut targeted: Vec<Planned> = Vec::new();
            let mut ids = 0;
            while next < atoms.len()
                && planned.len() + targeted.len() < SHARED_SCAN_PLANS_MAX
                && ids < SHARED_SCAN_IDS_MAX
            {
                let (at, atom) = (next, atoms[next]);
                next += 1;
                let candidate = self.snapshot_candidates(atom).first().copied();
                match self.plan_scan(atom, candidate) {
                    Ok(plan) => {
                        ids += plan.in_run.slots.len();
                        match plan.targeted {
                            Some(_) => targeted.push((at, candidate, plan)),
                            None => planned.push((at, candidate, plan)),
                        }
                    }
                    Err(_) => alone.push(at),
                }
            }
            // Plans that would read only their run's records do so alone, unless there are so
            // many that reading their ranges once costs less than all their targeted reads.
            if targeted_reads_cost_more(&targeted) {
                planned.append(&mut targeted);
            } else {
                alone.extend(targeted.iter().map(|(at, _, _)| *at));
            }
            // Plans whose ranges overlap (or touch) share a pass: the union of their ranges
            // is then one interval, every LSN of which some plan needs.
            planned.sort_by_key(|(_, _, plan)| plan.from_lsn);
            let mut planned = planned.into_iter().peekable();
            while let Some(first) = planned.next() {
                let mut to_lsn = first.2.to_lsn;
                let mut group = vec![first];
                while let Some(joining) = planned.next_if(|(_, _, plan)| plan.from_lsn <= to_lsn.saturating_add(1)) {
                    to_lsn = to_lsn.max(joining.2.to_lsn);
                    group.push(joining);
                }
                let started = std::time::Instant::now();
                let plans: Vec<&ScanPlan> = group.iter().map(|(_, _, plan)| plan).collect();
                let Ok(parts) = self.scan_shared(&plans, pool) else {
                    alone.extend(group.iter().map(|(at, _, _)| *at));
                    continue;
                };
                let (rebuilds, mut finished) = (group.len() as u64, 0);
                for ((at, candidate, plan), part) in group.into_iter().zip(parts) {
                    match self.rebuild_from_parts(atoms[at], candidate, plan, part, pool) {
                        Some(rebuilt) => {
                            finished += 1;
                            self.record_rebuild(&rebuilt, started);
                            done(at, rebuilt);
                        }
                        None => alone.push(at),
                    }
                }
                if rebuilds > 1 {
                    self.shared.log.metrics_handle().record_shared_scan(finished);
                }
            }
        }
        for at in alone {
            done(at, self.rebuild_recorded(atoms[at], pool));
        }
    }

    /// The rebuild of `atom` from the snapshot `candidate` (the log's start for `None`), given
    /// what the scan planned by `plan` found (`parts`, in LSN order), its deltas decoded on
    /// `pool`; `None` if the snapshot cannot start it (not on its path, or it failed
    /// verification: the ordinary rebuild then falls back and reports it).
    fn rebuild_from_parts(
        &self,
        atom: AtomId,
        candidate: Option<u64>,
        plan: ScanPlan,
        parts: Vec<ScanPart>,
        pool: Option<&rayon::ThreadPool>,
    ) -> Option<Result<Rebuilt>> {
        let scan = match RunScan::assemble(plan.in_run.slots, parts.into_iter().map(Ok).collect()) {
            Ok(scan) => scan,
            Err(error) => return Some(Err(error)),
        };
        let (mut context, pending) = match candidate {
            Some(candidate) => {
                let pending = scan.after_snapshot(atom.0, candidate)?;
                match self.load_snapshot(candidate) {
                    Ok(Ok(context)) => (context, pending),
                    Ok(Err(_)) => return None,
                    Err(error) => return Some(Err(error)),
                }
            }
            None => match scan.ancestry(atom.0) {
                Ok(pending) => (Context::new(), pending),
                Err(error) => return Some(Err(error)),
            },
        };
        Some(apply_deltas(self, &scan, &mut context, &pending, pool).map(|atoms_applied| Rebuilt {
            context,
            snapshot: candidate.map(AtomId),
            fallbacks: Vec::new(),
            atoms_applied,
        }))
    }

    /// The scans of several plans' ranges in one pass: over the union of the ranges, split
    /// evenly over `pool`'s threads when it is long enough, each atom record given to every
    /// plan whose run it is of and whose range holds it. Returns each plan's parts, in LSN
    /// order: together, what [`Store::scan_range`] of its range alone finds. Where the plans'
    /// runs interleave in the log (agents writing side by side), the log is read once instead
    /// of once per plan.
    fn scan_shared(&self, plans: &[&ScanPlan], pool: Option<&rayon::ThreadPool>) -> Result<Vec<Vec<ScanPart>>> {
        let Some(from) = plans.iter().map(|plan| plan.from_lsn).min() else { return Ok(Vec::new()) };
        let to = plans.iter().map(|plan| plan.to_lsn).max().unwrap_or(from);
        let len = to - from + 1;
        let parts = scan_part_count(pool, len);
        let step = len.div_ceil(parts as u64);
        let router = if plans.len() > 1 { PlanRouter::new(plans) } else { None };
        let scan_part = |i: usize| {
            let start = from + i as u64 * step;
            self.scan_shared_range(plans, router.as_ref(), start, (start + step - 1).min(to))
        };
        let found: Vec<Result<Vec<ScanPart>>> = match pool {
            Some(pool) if parts > 1 => pool.install(|| (0..parts).into_par_iter().map(scan_part).collect()),
            _ => (0..parts).map(scan_part).collect(),
        };
        let mut per_plan: Vec<Vec<ScanPart>> = plans.iter().map(|_| Vec::with_capacity(parts)).collect();
        for found in found {
            for (plan, part) in per_plan.iter_mut().zip(found?) {
                plan.push(part);
            }
        }
        Ok(per_plan)
    }

    /// One part of [`Store::scan_shared`]: the LSNs `from..=to` (none if `from > to`), one
    /// part for each plan; each record offered to the plans `router` gives for its atom (to
    /// every plan without one).
    fn scan_shared_range(
        &self,
        plans: &[&ScanPlan],
        router: Option<&PlanRouter>,
        from: u64,
        to: u64,
    ) -> Result<Vec<ScanPart>> {
        let mut parts: Vec<ScanPart> = plans
            .iter()
            .map(|plan| {
                let overlap = to.min(plan.to_lsn).saturating_add(1).saturating_sub(from.max(plan.from_lsn));
                ScanPart::for_span(overlap, &plan.in_run)
            })
            .collect();
        if from > to {
            return Ok(parts);
        }
        let mut reading = Reading::new(self);
        self.shared.log.visit(Lsn::new(from), Lsn::new(to), |lsn, record| {
            let Some((kind, subject)) = reading.peek_atom(lsn, &record)? else { return Ok(true) };
            let mut offer = |index: usize| {
                let (plan, part) = (plans[index], &mut parts[index]);
                if (plan.from_lsn..=plan.to_lsn).contains(&lsn) && plan.in_run.contains(subject) {
                    reading.keep(part, kind, subject, lsn, &record)?;
                }
                Ok::<(), Error>(())
            };
            match router {
                Some(router) => router.plans_of(subject).iter().try_for_each(|index| offer(*index))?,
                None => (0..plans.len()).try_for_each(&mut offer)?,
            }
            Ok(true)
        })?;
        Ok(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::RunMembers;
    use crate::replay::tests::interleaved_store;
    use crate::snapshot;
    use crate::{AtomOutput, RunSpec, SnapshotPolicy};

    /// A rebuild's result, or its error, as text to compare.
    fn describe(rebuilt: Result<Rebuilt>) -> String {
        match rebuilt {
            Ok(r) => format!("{:?} {:?} {} {:?}", r.snapshot, r.fallbacks, r.atoms_applied, r.context.encode()),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn rebuilds_that_share_a_scan_give_what_each_gives_alone() {
        // The interleaved store's atoms rebuilt together (the runs' ranges overlap, so most
        // share a pass) and one by one must agree exactly, with scans targeted where they pay
        // (run 0's, which then go alone unless many) and with none targeted (run
        // 0's then share too, and its forks from before its snapshot cannot start from it).
        // One snapshot of another run is damaged: the rebuilds it would start go alone and
        // report the fallback.
        let dir = tempfile::tempdir().expect("dir");
        let (store, run_0, others) = interleaved_store(dir.path());
        let run_of = |atom: u64| store.shared.index.read().atom(AtomId(atom)).map(|e| e.run);
        let damaged = *store
            .snapshots()
            .iter()
            .filter(|snapshot| run_of(snapshot.get()) != run_of(run_0[0].get()))
            .nth(4)
            .expect("a snapshot of another run");
        let path = snapshot::path(dir.path(), damaged.get());
        let mut bytes = std::fs::read(&path).expect("read the snapshot");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        std::fs::write(&path, bytes).expect("damage the snapshot");
        // Run 0's atoms, every other one of the others' (several of each run), one atom twice.
        let others: Vec<AtomId> = others.iter().step_by(2).copied().collect();
        let mut atoms: Vec<AtomId> = run_0.iter().chain(&others).copied().collect();
        atoms.push(others[3]);
        let check = |store: &Store, when: &str, modes: &[bool]| {
            for &targeted in modes {
                store.set_targeted_scans(targeted);
                let alone: Vec<String> = atoms.iter().map(|atom| describe(store.rebuild_context(*atom))).collect();
                let before = store.log().metrics().rebuild_shared_scans;
                let mut together = vec![None; atoms.len()];
                store.rebuild_several(&atoms, None, |at, rebuilt| {
                    assert!(together[at].is_none(), "{when}: atom {at} handed over twice");
                    together[at] = Some(describe(rebuilt));
                });
                let shared = store.log().metrics().rebuild_shared_scans - before;
                // The same on the replay pool, the shared scans in parallel parts.
                let on_pool: Vec<String> = store.rebuild_contexts(&atoms).into_iter().map(describe).collect();
                for (((alone, together), on_pool), atom) in alone.iter().zip(&together).zip(&on_pool).zip(&atoms) {
                    assert_eq!(Some(alone), together.as_ref(), "{when}, targeted {targeted}: atom {atom:?}");
                    assert_eq!(alone, on_pool, "{when}, targeted {targeted}, on the pool: atom {atom:?}");
                }
                let fell_back = alone.iter().filter(|r| r.contains("SnapshotFallback")).count();
                assert!(fell_back >= 1, "{when}: the damaged snapshot is met");
                let least = others.len() + 1 - fell_back + if targeted { 0 } else { run_0.len() / 2 };
                assert!(shared as usize >= least, "{when}, targeted {targeted}: {shared} shared, want {least}");
            }
            store.set_targeted_scans(true);
        };
        check(&store, "as appended", &[true, false]);
        store.compact().expect("compact");
        check(&store, "compressed", &[false]);
        drop(store);
        let store = Store::builder(dir.path()).segment_bytes(64 * 1024).background(false).open().expect("reopen");
        check(&store, "reopened", &[true]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..proptest::prelude::ProptestConfig::default() })]

        /// Random runs written side by side (forks from any earlier atom of the run, failures,
        /// atoms left running, snapshots here and there, small segments): rebuilding all of
        /// them together gives, atom for atom, what each rebuild alone gives, with scans
        /// targeted where they pay and with none targeted. Over `SHARED_SCAN_PLANS_MAX` atoms
        /// (about half the cases), the plans come in several batches.
        #[test]
        fn rebuilds_together_agree_with_rebuilds_alone_on_random_histories(
            seed in proptest::prelude::any::<u64>(),
            runs in 1usize..5,
            count in 20usize..220,
        ) {
            let storage = crate::storage::sim::SimStorage::new(seed);
            let store = Store::builder(std::path::Path::new("/store"))
                .storage(std::sync::Arc::new(storage))
                .segment_bytes(32 * 1024)
                .snapshot_policy(SnapshotPolicy::NEVER)
                .background(false)
                .open()
                .expect("open");
            let run_ids: Vec<_> =
                (0..runs).map(|r| store.create_run(RunSpec::new(format!("r{r}"))).expect("run")).collect();
            let mut random = crate::synthetic::SplitMix64::new(seed);
            let mut transcript = crate::synthetic::Transcript::new(seed);
            let mut completed: Vec<Vec<AtomId>> = vec![Vec::new(); runs];
            let mut atoms = Vec::new();
            for i in 0..count {
                // Skewed: run 0 writes most, so that the others are sparse in its ranges.
                let r = if random.next_u64().is_multiple_of(4) { (random.next_u64() % runs as u64) as usize } else { 0 };
                let done = &completed[r];
                let parents: Vec<AtomId> = match (done.len(), random.next_u64() % 8) {
                    (0, _) => Vec::new(),
                    (n, 0) => vec![done[(random.next_u64() % n as u64) as usize]],
                    (n, _) => vec![done[n - 1]],
                };
                let atom = store.begin_atom(run_ids[r], "agent", &i.to_string(), &parents, "").expect("begin");
                match random.next_u64() % 16 {
                    0 => {}
                    1 => store
                        .fail_atom(atom, &crate::AtomFailure { message: "no".into(), retryable: false })
                        .expect("fail"),
                    _ => {
                        let output = AtomOutput { delta: transcript.next_delta(120), result: Vec::new() };
                        store.complete_atom(atom, &output).expect("complete");
                        completed[r].push(atom);
                        if random.next_u64().is_multiple_of(13) {
                            store.snapshot_now(atom).expect("snapshot");
                        }
                    }
                }
                atoms.push(atom);
            }
            for targeted in [true, false] {
                store.set_targeted_scans(targeted);
                let alone: Vec<String> = atoms.iter().map(|atom| describe(store.rebuild_context(*atom))).collect();
                let mut together = vec![None; atoms.len()];
                store.rebuild_several(&atoms, None, |at, rebuilt| together[at] = Some(describe(rebuilt)));
                let on_pool: Vec<String> = store.rebuild_contexts(&atoms).into_iter().map(describe).collect();
                for (((alone, together), on_pool), atom) in alone.iter().zip(&together).zip(&on_pool).zip(&atoms) {
                    proptest::prop_assert_eq!(Some(alone), together.as_ref(), "targeted {}: atom {:?}", targeted, atom);
                    proptest::prop_assert_eq!(alone, on_pool, "targeted {}, on the pool: atom {:?}", targeted, atom);
                }
            }
        }
    }

    #[test]
    fn targeted_plans_share_a_scan_only_when_their_reads_would_cost_more() {
        // `count` plans, each reading `lsns` LSNs within the same range of `range` LSNs.
        let plans = |count: usize, lsns: u64, range: u64| -> Vec<Planned> {
            (0..count)
                .map(|i| {
                    let read: Vec<u64> = (0..lsns).map(|n| 1 + n * (range / lsns)).collect();
                    let plan = ScanPlan {
                        run: 1,
                        in_run: RunMembers::sparse(Vec::new()),
                        from_lsn: 1,
                        to_lsn: range,
                        targeted: Some((read.clone(), read)),
                    };
                    (i, None, plan)
                })
                .collect()
        };
        // Two agents among hundreds: their reads (2 x 100 x 80) are far below the range.
        assert!(!targeted_reads_cost_more(&plans(2, 100, 100_000)));
        // Hundreds of them: one pass over the range is cheaper.
        assert!(targeted_reads_cost_more(&plans(300, 100, 100_000)));
        // One alone never shares.
        assert!(!targeted_reads_cost_more(&plans(1, 10_000, 100_000)));
        // Ranges apart do not add up: twenty plans over twenty separate stretches.
        let mut apart = plans(20, 10, 10_000);
        for (i, (_, _, plan)) in apart.iter_mut().enumerate() {
            plan.from_lsn += i as u64 * 10_000;
            plan.to_lsn += i as u64 * 10_000;
        }
        assert!(!targeted_reads_cost_more(&apart));
        // The same twenty over one stretch: 16,000 LSNs of reads against 10,000 of range (the
        // union of the ranges, not their 200,000 sum).
        assert!(targeted_reads_cost_more(&plans(20, 10, 10_000)));
    }
}
