//! Re-running an atom whose commit lost a race: [`Store::execute_retrying`].

use crate::channel::{Exchange, Exchanged};
use crate::error::{Error, Result};
use crate::store::{AtomFailure, AtomId, AtomOutput, RunId, Store};

impl Store {
    /// [`Store::execute_with`] that runs `work` again, with fresh reads, when the atom's commit
    /// is refused because another atom changed what it read: a shared-state key
    /// ([`Error::Conflict`]) or a consumer's offset ([`Error::ConsumerConflict`]). At most
    /// `attempts` runs of `work` (at least 1); the last refusal is returned when all of them
    /// lose. Each attempt is the same atom, left running by the refused commit.
    ///
    /// ```
    /// # fn main() -> continuum::Result<()> {
    /// use continuum::shared_state::StateValue;
    /// use continuum::{AtomOutput, RunSpec, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path())?;
    /// let run = store.create_run(RunSpec::new("team"))?;
    /// store.execute_retrying(run, "writer", "draft-1", &[], 5, |exchange| {
    ///     let words = match exchange.read("budget")? {
    ///         Some(read) => read.value,
    ///         None => StateValue::Bytes(b"1000".to_vec()),
    ///     };
    ///     assert_eq!(words, StateValue::Bytes(b"1000".to_vec()));
    ///     exchange.put("budget", b"900".to_vec())?; // committed only if "budget" is unchanged
    ///     exchange.add("drafts", 1)?; // a merge: never conflicts
    ///     Ok(AtomOutput::default())
    /// })?;
    /// let budget = store.read_state(run, "budget")?.expect("written");
    /// assert_eq!((budget.version, budget.value), (1, StateValue::Bytes(b"900".to_vec())));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Store::execute_with`]; [`Error::InvalidArgument`] for `attempts` of 0.
    pub fn execute_retrying(
        &self,
        run: RunId,
        agent: &str,
        key: &str,
        parents: &[AtomId],
        attempts: u32,
        mut work: impl FnMut(&mut Exchange<'_>) -> std::result::Result<AtomOutput, AtomFailure>,
    ) -> Result<Exchanged> {
        if attempts == 0 {
            return Err(Error::InvalidArgument { reason: "execute_retrying needs at least one attempt".into() });
        }
        let mut attempt = 1;
        loop {
            match self.execute_with(run, agent, key, parents, &mut work) {
                Err(error) if attempt < attempts && lost_a_race(&error) => attempt += 1,
                other => return other,
            }
        }
    }
}

/// Whether `error` is a commit refused because another atom changed what the atom read.
fn lost_a_race(error: &Error) -> bool {
    match error {
        Error::OutputNotRecorded { source, .. } => {
            matches!(**source, Error::Conflict { .. } | Error::ConsumerConflict { .. })
        }
        _ => false,
    }
}
