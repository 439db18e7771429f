//! Run checkpoints to and from the bytes of their control atoms: bounds checked before
//! encoding, the key checked against the body after decoding. Pure.

use prost::Message;

use crate::checkpoint::types::RunCheckpoint;
use crate::codec::proto;
use crate::error::{Error, Result};
use crate::limits::{CHECKPOINT_BYTES_MAX, CHECKPOINT_ENTRIES_MAX, CHECKPOINT_NAME_BYTES_MAX};
use crate::store::{Atom, AtomId, RunId};

/// The key of checkpoint `sequence`'s control atom.
pub(crate) fn checkpoint_key(sequence: u64) -> String {
    format!("checkpoint/{sequence}")
}

/// The sequence a checkpoint atom's key names, if it is one.
pub(crate) fn key_sequence(key: &str) -> Option<u64> {
    key.strip_prefix("checkpoint/")?.parse().ok().filter(|sequence| *sequence > 0)
}

/// Refuses a name longer than [`CHECKPOINT_NAME_BYTES_MAX`].
pub(crate) fn check_name(what: &str, name: &str) -> Result<()> {
    if name.len() > CHECKPOINT_NAME_BYTES_MAX {
        return Err(Error::LimitExceeded {
            what: format!("bytes of a checkpoint's {what}"),
            limit: CHECKPOINT_NAME_BYTES_MAX as u64,
        });
    }
    Ok(())
}

/// Refuses more than [`CHECKPOINT_ENTRIES_MAX`] entries.
fn check_entries(what: &str, entries: usize) -> Result<()> {
    if entries > CHECKPOINT_ENTRIES_MAX {
        return Err(Error::LimitExceeded {
            what: format!("entries of a checkpoint's {what}"),
            limit: CHECKPOINT_ENTRIES_MAX as u64,
        });
    }
    Ok(())
}

/// Checks every bound of `checkpoint` and encodes it.
///
/// # Errors
/// [`Error::LimitExceeded`] for a name, a map or the whole above its bound.
pub(crate) fn encode(checkpoint: &proto::RunCheckpoint) -> Result<Vec<u8>> {
    for (what, name) in [
        ("pipeline", &checkpoint.pipeline),
        ("pipeline version", &checkpoint.pipeline_version),
        ("current agent", &checkpoint.current_agent),
        ("position", &checkpoint.position),
        ("resume hint", &checkpoint.resume_hint),
    ] {
        check_name(what, name)?;
    }
    check_entries("shared context", checkpoint.shared_context.len())?;
    check_entries("agent heads", checkpoint.agent_heads.len())?;
    check_entries("environment", checkpoint.environment.len())?;
    check_entries("side effects", checkpoint.side_effects_committed.len())?;
    let keys = checkpoint.shared_context.keys().chain(checkpoint.agent_heads.keys());
    for name in keys.chain(checkpoint.environment.keys()).chain(checkpoint.environment.values()) {
        check_name("key", name)?;
    }
    let bytes = checkpoint.encode_to_vec();
    if bytes.len() > CHECKPOINT_BYTES_MAX {
        return Err(Error::LimitExceeded { what: "bytes of a checkpoint".into(), limit: CHECKPOINT_BYTES_MAX as u64 });
    }
    Ok(bytes)
}

/// The checkpoint the control atom `atom` holds.
///
/// # Errors
/// [`Error::InconsistentLog`] if its result is not a checkpoint, or not the one its key names.
pub(crate) fn decode(atom: &Atom) -> Result<RunCheckpoint> {
    let lsn = atom.started_lsn.get();
    let inconsistent = |reason| Error::InconsistentLog { lsn, reason };
    let output = atom.output.as_ref().ok_or(inconsistent("a checkpoint atom has no result"))?;
    let body = proto::RunCheckpoint::decode(output.result.as_slice())
        .map_err(|_| inconsistent("a checkpoint atom's result is not a checkpoint"))?;
    if key_sequence(&atom.key) != Some(body.sequence) || body.run != atom.run.get() {
        return Err(inconsistent("a checkpoint's body disagrees with its atom"));
    }
    let mut side_effects_committed = body.side_effects_committed;
    side_effects_committed.sort_unstable();
    Ok(RunCheckpoint {
        run: RunId(body.run),
        sequence: body.sequence,
        atom: atom.id,
        pipeline: body.pipeline,
        pipeline_version: body.pipeline_version,
        current_agent: body.current_agent,
        position: body.position,
        shared_context: body.shared_context,
        agent_heads: body.agent_heads.into_iter().map(|(agent, atom)| (agent, AtomId(atom))).collect(),
        environment: body.environment,
        is_terminal: body.is_terminal,
        resume_hint: body.resume_hint,
        side_effects_committed,
        written_at_unix_us: body.written_at_unix_us,
        side_effects_from_lsn: body.side_effects_from_lsn,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_sequence_and_nothing_else_does() {
        assert_eq!(key_sequence(&checkpoint_key(7)), Some(7));
        assert_eq!(key_sequence("checkpoint/0"), None);
        assert_eq!(key_sequence("checkpoint/x"), None);
        assert_eq!(key_sequence("migration/7/v2"), None);
    }

    /// A checkpoint atom of run 1 whose result is `result`.
    fn atom(key: &str, result: Vec<u8>) -> Atom {
        Atom {
            id: AtomId(9),
            run: RunId(1),
            agent: crate::checkpoint::CHECKPOINT_AGENT.into(),
            key: key.into(),
            parents: Vec::new(),
            idempotency_key: String::new(),
            status: crate::AtomStatus::Completed,
            started_at_unix_us: 0,
            ended_at_unix_us: Some(0),
            output: Some(crate::AtomOutput { delta: crate::Delta::default(), result }),
            error: None,
            started_lsn: crate::Lsn::new(5),
            abandoned: false,
            delta_reclaimed: false,
        }
    }

    #[test]
    fn damaged_results_decode_to_a_checkpoint_or_a_typed_error() {
        let mut body = proto::RunCheckpoint { sequence: 3, run: 1, position: "step-3".into(), ..Default::default() };
        body.agent_heads.insert("planner".into(), 4);
        body.shared_context.insert("plan".into(), b"fly tuesday".to_vec());
        let bytes = encode(&body).expect("encode");
        assert_eq!(decode(&atom("checkpoint/3", bytes.clone())).expect("decode").position, "step-3");
        let refused = |result: Result<RunCheckpoint>| matches!(result, Err(Error::InconsistentLog { lsn: 5, .. }));
        assert!(refused(decode(&atom("checkpoint/4", bytes.clone()))), "the key names another sequence");
        let mut other_run = body.clone();
        other_run.run = 2;
        assert!(refused(decode(&atom("checkpoint/3", encode(&other_run).expect("encode")))));
        for cut in 0..bytes.len() {
            let _ = decode(&atom("checkpoint/3", bytes[..cut].to_vec()));
        }
        for at in 0..bytes.len() {
            for bit in 0..8 {
                let mut flipped = bytes.clone();
                flipped[at] ^= 1 << bit;
                match decode(&atom("checkpoint/3", flipped)) {
                    Ok(checkpoint) => assert_eq!((checkpoint.sequence, checkpoint.run), (3, RunId(1))),
                    Err(error) => assert!(matches!(error, Error::InconsistentLog { .. }), "{error}"),
                }
            }
        }
    }

    #[test]
    fn oversized_fields_are_refused_before_encoding() {
        let long = "x".repeat(CHECKPOINT_NAME_BYTES_MAX + 1);
        let checkpoint = proto::RunCheckpoint { position: long.clone(), ..Default::default() };
        assert!(matches!(encode(&checkpoint), Err(Error::LimitExceeded { .. })));
        let mut checkpoint = proto::RunCheckpoint::default();
        checkpoint.shared_context.insert("k".into(), vec![0; CHECKPOINT_BYTES_MAX]);
        assert!(matches!(encode(&checkpoint), Err(Error::LimitExceeded { .. })));
        let mut checkpoint = proto::RunCheckpoint::default();
        checkpoint.environment.insert("k".into(), long);
        assert!(matches!(encode(&checkpoint), Err(Error::LimitExceeded { .. })));
    }
}
