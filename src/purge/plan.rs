//! The purge plan: the one computation of what is live, from which retention and compaction
//! both act (raft-engine's purge is the model).
//!
//! From the atom DAG (every atom's parents), what the index knows of each atom, and the durable
//! snapshots, one pass decides:
//! - the **heads**: each agent's newest atom no rollback abandoned, where the agent continues;
//! - the **snapshots kept**: every held atom's (pinned, or an agent head its run's newest
//!   checkpoint names), and per agent the newest `snapshots_per_agent` of the others. A snapshot of an atom a rollback abandoned does not
//!   count, and goes;
//! - the **deltas stripped**: a completed atom's delta goes once no *target*'s rebuild needs
//!   it. Targets are the heads, the held atoms, and the atoms at or after their agent's oldest
//!   kept snapshot. A target's rebuild starts from its oldest kept usable snapshot (all of its
//!   history if it has none), so it needs the deltas of its ancestors above that snapshot;
//! - the **atoms released**: after the round (its snapshots pruned, its deltas stripped), the
//!   atoms no rebuild can reach any more. They can no longer be a parent, a rollback's target or
//!   pinned; the store records them durably before the round deletes or rewrites anything;
//! - the **messages reclaimed**: a channel's message whose every live consumer has consumed it
//!   (its offset is at or past the message) loses its payload; a channel no consumer has
//!   consumed from yet keeps every message (`purge/messages.rs`).
//!
//! A rebuild of atom `x` can start from snapshot `s` when every path down from `x` meets `s`
//! before any smaller id (`Store::rebuild_context`), and needs the delta of every completed atom
//! on those paths above `s`; with no snapshot it needs every completed ancestor's delta. The
//! plan mirrors exactly that rule, so "not released" means "rebuildable".

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::rc::Rc;

pub(crate) use crate::purge::messages::ChannelFacts;

/// What the index knows of one atom, as the plan needs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AtomFacts {
    pub agent: u32,
    /// It completed: its rebuild applies its delta.
    pub completed: bool,
    /// It completed and compaction already reclaimed its delta.
    pub reclaimed: bool,
    pub pinned: bool,
    /// The newest checkpoint of its run names it as an agent's head (`checkpoint/read.rs`).
    pub checkpointed: bool,
    pub abandoned: bool,
    /// A round already released it.
    pub released: bool,
    /// Its run was dropped: nothing of it is live.
    pub dropped: bool,
    /// A channel's message: a control atom without parents whose delta is empty, so no rebuild
    /// needs more than its start and end records; its payload (in its result) is kept by its
    /// consumers, not by rebuilds, and `reclaimed` means the payload is gone.
    pub message: bool,
}

impl AtomFacts {
    /// Pinned, or named by its run's newest checkpoint: kept rebuildable as a head is.
    pub fn held(&self) -> bool {
        self.pinned || self.checkpointed
    }
}

/// What one purge plan reads.
pub(crate) struct PurgeInputs<'a> {
    /// Every atom's parents, in id order (parents always have smaller ids).
    pub parents: &'a BTreeMap<u64, Vec<u64>>,
    /// What the index knows of each atom of `parents` (an atom it does not know is dead).
    pub facts: &'a HashMap<u64, AtomFacts>,
    /// The snapshots whose names are durable.
    pub snapshots: &'a BTreeSet<u64>,
    /// How many snapshots on its live paths each agent keeps (pinned ones aside).
    pub snapshots_per_agent: usize,
    /// Every channel of a live run, with its messages whose payload is still held and the
    /// offsets of its live consumers.
    pub channels: &'a [ChannelFacts],
}

/// What one purge plan decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PurgeDecision {
    /// The snapshots retention keeps (a subset of the inputs').
    pub snapshots_kept: BTreeSet<u64>,
    /// The snapshots retention deletes.
    pub snapshots_pruned: Vec<u64>,
    /// Completed atoms whose deltas compaction reclaims.
    pub strip: BTreeSet<u64>,
    /// Atoms of live runs, not abandoned and not released before, that no rebuild can reach
    /// once the round is done.
    pub released: Vec<u64>,
    /// Messages every live consumer of their channel has consumed: compaction drops their
    /// payloads.
    pub messages_reclaimed: BTreeSet<u64>,
}

/// The snapshot id that stands for "no snapshot: the rebuild starts from nothing".
const FROM_NOTHING: u64 = 0;

/// Decides what a round keeps, strips and releases (module docs).
pub(crate) fn decide(inputs: &PurgeInputs<'_>) -> PurgeDecision {
    let heads = heads(inputs);
    let (mut snapshots_kept, mut snapshots_pruned) = retain_snapshots(inputs);
    let mut strip = strippable(inputs, &snapshots_kept, &heads);
    let mut rebuildable = rebuildable_after(inputs, &snapshots_kept, &strip);
    let lost = lost_targets(inputs, &heads, &rebuildable);
    // What rebuilds today: computed once, when a target would be lost (or to check the plan).
    let today = (!lost.is_empty() || cfg!(debug_assertions))
        .then(|| rebuild_starts(inputs, inputs.snapshots, &BTreeSet::new()));
    if let Some(today) = today.as_ref().filter(|_| !lost.is_empty()) {
        // A target that only a pruned snapshot still rebuilds (a pinned atom a rollback
        // abandoned, resting on a snapshot of its abandoned branch) keeps that snapshot.
        let needed = snapshots_targets_need(&lost, today);
        snapshots_kept.extend(needed.iter().copied());
        snapshots_pruned.retain(|snapshot| !needed.contains(snapshot));
        strip = strippable(inputs, &snapshots_kept, &heads);
        rebuildable = rebuildable_after(inputs, &snapshots_kept, &strip);
    }
    let released: Vec<u64> = inputs
        .parents
        .keys()
        .copied()
        .filter(|id| !rebuildable.contains(id))
        .filter(|id| inputs.facts.get(id).is_some_and(|facts| !facts.abandoned && !facts.dropped && !facts.released))
        .collect();
    if let Some(today) = today.as_ref().filter(|_| cfg!(debug_assertions)) {
        assert_targets_kept(inputs, &heads, today, &rebuildable);
    }
    let messages_reclaimed = crate::purge::messages::reclaimable(inputs.channels);
    for id in &messages_reclaimed {
        assert!(!strip.contains(id), "a message's payload is reclaimed, never its (empty) delta");
        assert!(inputs.facts.get(id).is_some_and(|facts| facts.message), "only messages lose payloads");
    }
    PurgeDecision { snapshots_kept, snapshots_pruned, strip, released, messages_reclaimed }
}

/// The heads: each agent's newest live atom (not abandoned, of a live run).
fn heads(inputs: &PurgeInputs<'_>) -> HashSet<u64> {
    let mut newest: HashMap<u32, u64> = HashMap::new();
    for (id, facts) in inputs.parents.keys().filter_map(|id| Some((*id, inputs.facts.get(id)?))) {
        if !facts.abandoned && !facts.dropped {
            // Ascending ids: the last one seen is the newest.
            newest.insert(facts.agent, id);
        }
    }
    newest.into_values().collect()
}

/// Per agent, the newest K snapshots of atoms no rollback abandoned, and every pinned atom's;
/// the rest of the snapshots of known atoms go. Snapshots of atoms the plan does not know
/// (newer than its scan) are left alone, and no decision relies on them.
fn retain_snapshots(inputs: &PurgeInputs<'_>) -> (BTreeSet<u64>, Vec<u64>) {
    let mut kept = BTreeSet::new();
    let mut pruned = Vec::new();
    let mut counted: HashMap<u32, usize> = HashMap::new();
    for &snapshot in inputs.snapshots.iter().rev() {
        let Some(facts) = inputs.facts.get(&snapshot).filter(|_| inputs.parents.contains_key(&snapshot)) else {
            continue;
        };
        if facts.held() && !facts.dropped {
            kept.insert(snapshot);
            continue;
        }
        let count = counted.entry(facts.agent).or_insert(0);
        if !facts.abandoned && !facts.dropped && *count < inputs.snapshots_per_agent {
            *count += 1;
            kept.insert(snapshot);
        } else {
            pruned.push(snapshot);
        }
    }
    pruned.sort_unstable();
    (kept, pruned)
}

/// For each atom, ascending: the kept snapshots every path down from it meets before any
/// smaller id (shared along chains).
fn usable_snapshots(inputs: &PurgeInputs<'_>, kept: &BTreeSet<u64>) -> HashMap<u64, Rc<Vec<u64>>> {
    let mut usable: HashMap<u64, Rc<Vec<u64>>> = HashMap::with_capacity(inputs.parents.len());
    let empty = Rc::new(Vec::new());
    for (&id, parents) in inputs.parents {
        let mut set = intersect_parents(parents, &usable, &empty);
        if kept.contains(&id) {
            let mut with = (*set).clone();
            with.push(id);
            set = Rc::new(with);
        }
        usable.insert(id, set);
    }
    usable
}

/// The intersection of the parents' sets (empty for an atom with no parents).
fn intersect_parents(parents: &[u64], sets: &HashMap<u64, Rc<Vec<u64>>>, empty: &Rc<Vec<u64>>) -> Rc<Vec<u64>> {
    let Some((first, rest)) = parents.split_first() else { return Rc::clone(empty) };
    let mut set = sets.get(first).cloned().unwrap_or_else(|| Rc::clone(empty));
    for parent in rest {
        let other = sets.get(parent).cloned().unwrap_or_else(|| Rc::clone(empty));
        if !Rc::ptr_eq(&set, &other) {
            set = Rc::new(set.iter().copied().filter(|s| other.contains(s)).collect());
        }
    }
    set
}

/// The completed atoms whose deltas no target's rebuild needs.
fn strippable(inputs: &PurgeInputs<'_>, kept: &BTreeSet<u64>, heads: &HashSet<u64>) -> BTreeSet<u64> {
    let mut targets_from: HashMap<u32, u64> = HashMap::new();
    for snapshot in kept.iter().rev() {
        if let Some(facts) = inputs.facts.get(snapshot) {
            targets_from.insert(facts.agent, *snapshot);
        }
    }
    let usable = usable_snapshots(inputs, kept);
    // Descending: the lowest snapshot bound of any target's rebuild that passes through each
    // atom (`u64::MAX`: none does).
    let mut bound: HashMap<u64, u64> = HashMap::new();
    let mut strip = BTreeSet::new();
    for (&id, parents) in inputs.parents.iter().rev() {
        let Some(facts) = inputs.facts.get(&id) else { continue };
        let mut lowest = bound.remove(&id).unwrap_or(u64::MAX);
        let target_from = targets_from.get(&facts.agent).copied().unwrap_or(0);
        let target = !facts.dropped && (id >= target_from || facts.held() || heads.contains(&id));
        if target {
            let start = usable.get(&id).and_then(|set| set.iter().min().copied()).unwrap_or(FROM_NOTHING);
            lowest = lowest.min(start);
        }
        if lowest < id {
            for parent in parents {
                let slot = bound.entry(*parent).or_insert(u64::MAX);
                *slot = (*slot).min(lowest);
            }
        } else if facts.completed && !facts.reclaimed {
            strip.insert(id);
        }
    }
    strip
}

/// The atoms a rebuild can reach once the round is done: for each atom, ascending, the starts
/// (a kept snapshot, or [`FROM_NOTHING`]) from which every delta its rebuild applies is still
/// there; an atom with none is not rebuildable.
fn rebuildable_after(inputs: &PurgeInputs<'_>, kept: &BTreeSet<u64>, strip: &BTreeSet<u64>) -> HashSet<u64> {
    rebuild_starts(inputs, kept, strip).into_iter().filter(|(_, starts)| !starts.is_empty()).map(|(id, _)| id).collect()
}

/// For each atom, ascending: the starts its rebuild can use once `strip` is stripped and only
/// `kept` snapshots remain (empty: none).
fn rebuild_starts(inputs: &PurgeInputs<'_>, kept: &BTreeSet<u64>, strip: &BTreeSet<u64>) -> HashMap<u64, Rc<Vec<u64>>> {
    let mut starts: HashMap<u64, Rc<Vec<u64>>> = HashMap::with_capacity(inputs.parents.len());
    let empty = Rc::new(Vec::new());
    let from_nothing = Rc::new(vec![FROM_NOTHING]);
    for (&id, parents) in inputs.parents {
        // A message's delta is empty: reclaiming its payload takes nothing a rebuild applies.
        let intact = inputs
            .facts
            .get(&id)
            .is_some_and(|facts| facts.message || !facts.completed || (!facts.reclaimed && !strip.contains(&id)));
        let mut set = match (intact, parents.is_empty()) {
            (false, _) => Rc::clone(&empty),
            (true, true) => Rc::clone(&from_nothing),
            (true, false) => intersect_parents(parents, &starts, &empty),
        };
        if kept.contains(&id) {
            let mut with = (*set).clone();
            with.push(id);
            set = Rc::new(with);
        }
        starts.insert(id, set);
    }
    starts
}

/// Whether `id` is a head or a pinned atom of a live run.
fn is_target_kept_whole(inputs: &PurgeInputs<'_>, heads: &HashSet<u64>, id: u64) -> bool {
    heads.contains(&id) || inputs.facts.get(&id).is_some_and(|facts| facts.held() && !facts.dropped)
}

/// The heads and pins the round's plan would no longer rebuild.
fn lost_targets(inputs: &PurgeInputs<'_>, heads: &HashSet<u64>, after: &HashSet<u64>) -> Vec<u64> {
    inputs
        .parents
        .keys()
        .copied()
        .filter(|id| !after.contains(id) && is_target_kept_whole(inputs, heads, *id))
        .collect()
}

/// For each of `lost` that rebuilds today (`today`: every atom's starts with today's snapshots
/// and deltas), the newest snapshot it rebuilds from.
fn snapshots_targets_need(lost: &[u64], today: &HashMap<u64, Rc<Vec<u64>>>) -> BTreeSet<u64> {
    lost.iter().filter_map(|id| today.get(id)?.iter().copied().filter(|start| *start != FROM_NOTHING).max()).collect()
}

/// Every target that was rebuildable before the round still is: the round releases only what
/// no head, pin or kept time-travel window needs.
fn assert_targets_kept(
    inputs: &PurgeInputs<'_>,
    heads: &HashSet<u64>,
    today: &HashMap<u64, Rc<Vec<u64>>>,
    after: &HashSet<u64>,
) {
    for id in inputs.facts.keys() {
        let rebuilt_before = today.get(id).is_some_and(|starts| !starts.is_empty());
        assert!(
            !is_target_kept_whole(inputs, heads, *id) || !rebuilt_before || after.contains(id),
            "the purge plan releases target atom {id}, which was rebuildable before the round"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain 1..=n of agent 0, each atom completed.
    fn chain(n: u64) -> (BTreeMap<u64, Vec<u64>>, HashMap<u64, AtomFacts>) {
        let parents = (1..=n).map(|id| (id, if id == 1 { vec![] } else { vec![id - 1] })).collect();
        let facts = (1..=n).map(|id| (id, AtomFacts { completed: true, ..AtomFacts::default() })).collect();
        (parents, facts)
    }

    fn decide_with(
        parents: &BTreeMap<u64, Vec<u64>>,
        facts: &HashMap<u64, AtomFacts>,
        snapshots: &[u64],
        k: usize,
    ) -> PurgeDecision {
        let snapshots: BTreeSet<u64> = snapshots.iter().copied().collect();
        decide(&PurgeInputs { parents, facts, snapshots: &snapshots, snapshots_per_agent: k, channels: &[] })
    }

    #[test]
    fn a_chain_keeps_k_snapshots_and_strips_below_the_oldest() {
        let (parents, facts) = chain(30);
        let decision = decide_with(&parents, &facts, &[10, 20, 30], 2);
        assert_eq!(decision.snapshots_kept, BTreeSet::from([20, 30]));
        assert_eq!(decision.snapshots_pruned, vec![10]);
        assert_eq!(decision.strip, (1..=20).collect());
        assert_eq!(decision.released, (1..20).collect::<Vec<_>>());
    }

    #[test]
    fn pruning_the_snapshot_a_window_relied_on_releases_the_window() {
        // 1..=19 already reclaimed; 20 pruned by the snapshot at 40: 21..=29 cannot be rebuilt.
        let (parents, mut facts) = chain(40);
        for id in 1..=20 {
            facts.get_mut(&id).expect("atom").reclaimed = true;
        }
        let decision = decide_with(&parents, &facts, &[20, 30, 40], 2);
        assert_eq!(decision.snapshots_pruned, vec![20]);
        assert!(decision.released.contains(&25), "{decision:?}");
        assert!(!decision.released.contains(&30) && !decision.released.contains(&35), "{decision:?}");
    }

    #[test]
    fn a_snapshot_on_an_abandoned_branch_does_not_count() {
        // 1..=30, rolled back to 25 (26..=30 abandoned), then 31..=50 from 25.
        let mut parents: BTreeMap<u64, Vec<u64>> =
            (1..=30).map(|id| (id, if id == 1 { vec![] } else { vec![id - 1] })).collect();
        parents.insert(31, vec![25]);
        for id in 32..=50 {
            parents.insert(id, vec![id - 1]);
        }
        let mut facts: HashMap<u64, AtomFacts> =
            (1..=50).map(|id| (id, AtomFacts { completed: true, ..AtomFacts::default() })).collect();
        for id in 26..=30 {
            facts.get_mut(&id).expect("atom").abandoned = true;
        }
        let decision = decide_with(&parents, &facts, &[10, 20, 30, 40, 50], 2);
        assert_eq!(decision.snapshots_kept, BTreeSet::from([40, 50]));
        assert!(decision.snapshots_pruned.contains(&30));
        assert!(!decision.released.contains(&45));
    }

    #[test]
    fn a_pinned_atom_a_rollback_abandoned_keeps_the_snapshot_it_rests_on() {
        // 1..=9 reclaimed below the snapshot at 10; 12 pinned; a rollback to 5 abandons 6..=12.
        let (parents, mut facts) = chain(12);
        for id in 1..=9 {
            facts.get_mut(&id).expect("atom").reclaimed = true;
        }
        for id in 6..=12 {
            facts.get_mut(&id).expect("atom").abandoned = true;
        }
        facts.get_mut(&12).expect("atom").pinned = true;
        let decision = decide_with(&parents, &facts, &[10], 2);
        assert!(decision.snapshots_kept.contains(&10), "{decision:?}");
        assert!(!decision.strip.contains(&11), "{decision:?}");
    }

    #[test]
    fn a_checkpointed_head_is_held_as_a_pin_is() {
        // 1..=30 with snapshots at 20 and 30: an atom at 15 that a checkpoint names keeps the
        // deltas below it, and is not released; unnamed, it goes.
        let (parents, mut facts) = chain(30);
        let without = decide_with(&parents, &facts, &[20, 30], 1);
        assert!(without.released.contains(&15) && without.strip.contains(&15), "{without:?}");
        facts.get_mut(&15).expect("atom").checkpointed = true;
        let with = decide_with(&parents, &facts, &[20, 30], 1);
        assert!(!with.released.contains(&15), "{with:?}");
        assert!((1..=15).all(|id| !with.strip.contains(&id)), "{with:?}");
    }

    #[test]
    fn a_rolled_back_head_below_every_snapshot_keeps_its_history() {
        // The agent continues from 5; the snapshots at 10 and 20 are on the abandoned branch.
        let (parents, mut facts) = chain(20);
        for id in 6..=20 {
            facts.get_mut(&id).expect("atom").abandoned = true;
        }
        let decision = decide_with(&parents, &facts, &[10, 20], 2);
        assert!(decision.snapshots_kept.is_empty(), "{decision:?}");
        assert!(decision.strip.iter().all(|id| *id > 5), "{decision:?}");
        assert!(decision.released.is_empty(), "{decision:?}");
    }

    #[test]
    fn consumed_messages_lose_their_payloads_and_are_never_released() {
        // Agent 0 sends from 1..=10; its messages 11..=20 are parentless atoms of agent 1.
        let (mut parents, mut facts) = chain(10);
        for id in 11..=20 {
            parents.insert(id, vec![]);
            facts.insert(id, AtomFacts { agent: 1, completed: true, message: true, ..AtomFacts::default() });
        }
        let channels = [ChannelFacts { messages: (11..=20).collect(), offsets: vec![20, 15] }];
        let snapshots = BTreeSet::from([10]);
        let inputs = PurgeInputs {
            parents: &parents,
            facts: &facts,
            snapshots: &snapshots,
            snapshots_per_agent: 1,
            channels: &channels,
        };
        let decision = decide(&inputs);
        assert_eq!(decision.messages_reclaimed, (11..=15).collect(), "{decision:?}");
        assert!(decision.strip.iter().all(|id| *id <= 10), "a message's delta is not stripped: {decision:?}");
        assert!(decision.released.iter().all(|id| *id < 10), "no message is released: {decision:?}");
        // A later round: 11..=20 reclaimed, the head 20 among them; still nothing of them released.
        for id in 11..=20 {
            facts.get_mut(&id).expect("message").reclaimed = true;
        }
        let inputs = PurgeInputs {
            parents: &parents,
            facts: &facts,
            snapshots: &snapshots,
            snapshots_per_agent: 1,
            channels: &[],
        };
        let decision = decide(&inputs);
        assert!(decision.messages_reclaimed.is_empty() && decision.released.iter().all(|id| *id < 10), "{decision:?}");
    }

    #[test]
    fn a_fork_keeps_both_branches_heads_rebuildable() {
        // 1..=20, and a fork 21..=25 from 5: both 20 and 25 are heads.
        let (mut parents, mut facts) = chain(20);
        parents.insert(21, vec![5]);
        for id in 21..=25 {
            if id > 21 {
                parents.insert(id, vec![id - 1]);
            }
            facts.insert(id, AtomFacts { completed: true, ..AtomFacts::default() });
        }
        let decision = decide_with(&parents, &facts, &[10, 20], 1);
        assert!(!decision.released.contains(&25) && !decision.released.contains(&20), "{decision:?}");
        assert!((1..=5).all(|id| !decision.strip.contains(&id)), "the fork's history stays: {decision:?}");
    }
}
