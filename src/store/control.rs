//! Control atoms: the records the store itself keeps in a run, as atoms of agents whose names
//! start with [`CONTROL_AGENT_PREFIX`] (`continuum.`), for the features built on atoms
//! (continuations, run checkpoints). They are ordinary atoms (one batch with start and
//! completion, durable on return, replayed, kept by retention while their run lives), so they
//! need no storage path of their own; the prefix keeps a caller's agents from colliding with
//! them: [`Store::begin_atom`], [`Store::record_atom`], [`Store::record_atom_encoded`] and
//! [`Store::execute`] refuse an agent name that starts with it.
//!
//! A feature that checks the control atoms of a run and then records one (the next checkpoint
//! sequence, a decision not yet taken) holds [`Store::control_lock`] across both, so that two
//! threads of the process cannot both pass the check; other processes cannot write the store.

use parking_lot::MutexGuard;

use crate::error::{Error, Result};
use crate::store::Store;
use crate::store::types::{AtomId, AtomOutput, RunId};

/// Agent names that start with this are the store's own ([`is_control_agent`]).
pub const CONTROL_AGENT_PREFIX: &str = "continuum.";

/// Whether `agent` names one of the store's own agents.
pub fn is_control_agent(agent: &str) -> bool {
    agent.starts_with(CONTROL_AGENT_PREFIX)
}

/// Refuses a caller's agent name that the store keeps for its own agents.
pub(crate) fn check_caller_agent(agent: &str) -> Result<()> {
    if is_control_agent(agent) {
        return Err(Error::InvalidArgument {
            reason: format!("agent names starting with {CONTROL_AGENT_PREFIX:?} are the store's own: {agent:?}"),
        });
    }
    Ok(())
}

/// Which of `stripes` locks guards the control agent `agent` of `run` (FNV-1a of both): the
/// features whose commits check and advance a control agent's newest atom (a consumer's
/// offset, a state key's version) serialize those commits on it.
pub(crate) fn stripe_of(run: RunId, agent: &str, stripes: usize) -> usize {
    assert!(stripes > 0, "at least one lock");
    let hash = run
        .0
        .to_le_bytes()
        .iter()
        .chain(agent.as_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3));
    (hash % stripes as u64) as usize
}

impl Store {
    /// Records a control atom of `run`: agent `agent` (which must start with
    /// [`CONTROL_AGENT_PREFIX`]), `key`, `parents`, and `result` as its output (an empty
    /// delta), durable on return as [`Store::record_atom`] is.
    ///
    /// # Errors
    /// As [`Store::record_atom`].
    pub(crate) fn record_control(
        &self,
        run: RunId,
        agent: &str,
        key: &str,
        parents: &[AtomId],
        result: Vec<u8>,
    ) -> Result<AtomId> {
        assert!(is_control_agent(agent), "a control atom's agent is one of the store's own");
        let output = AtomOutput { delta: crate::Delta::default(), result };
        self.record_unchecked(run, (agent, key, parents, ""), &output)
    }

    /// Serializes the check-then-record sequences of control atoms within this process.
    pub(crate) fn control_lock(&self) -> MutexGuard<'_, ()> {
        self.shared.control.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RunSpec;

    #[test]
    fn callers_cannot_write_the_store_s_own_agents_and_the_store_can() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let output = AtomOutput::default();
        let agent = "continuum.checkpoint";
        let refused = |result: Result<AtomId>| matches!(result, Err(Error::InvalidArgument { .. }));
        assert!(refused(store.record_atom(run, agent, "k", &[], "", &output)));
        assert!(refused(store.record_atom_encoded(run, agent, "k", &[], "", b"", b"")));
        assert!(refused(store.begin_atom(run, agent, "k", &[], "")));
        assert!(refused(store.execute(run, agent, "k", &[], |_| Ok(AtomOutput::default())).map(|e| e.atom)));
        assert!(store.run_atoms(run).is_empty(), "nothing was recorded");

        let guard = store.control_lock();
        let atom = store.record_control(run, agent, "k", &[], b"state".to_vec()).expect("control atom");
        let read = store.atom(atom).expect("read");
        assert_eq!((read.agent.as_str(), read.output.map(|o| o.result)), (agent, Some(b"state".to_vec())));
        drop(guard);
        assert!(store.record_atom(run, "continuum-user", "k", &[], "", &output).is_ok(), "only the prefix is kept");
    }
}
