//! The atoms every engine stores: deterministic, realistic agent deltas.

use continuum::synthetic::Transcript;
use continuum::{AtomOutput, Delta};
use prost::Message;

/// Messages an agent's context holds before each new atom drops its oldest one.
const CONTEXT_MESSAGES_MAX: u64 = 40;
/// Tool-call ids recycle after this many, as an agent's bounded context does.
const TOOL_CALL_IDS: u64 = 1000;

/// A deterministic stream of realistic agent deltas (chat messages with tool calls, JSON tool
/// outputs, intermediate results, state changes), each about [`Deltas::TARGET_BYTES`] when
/// encoded. The same seed gives the same stream, so every engine stores the same bytes.
///
/// As in continuum's replay benchmark, the agent keeps a bounded window (each atom past the
/// 40th drops the oldest message) and recycles tool-call ids and intermediate-result names, so
/// that rebuilding a million atoms builds a context of realistic size rather than one of a
/// million messages or results.
#[derive(Debug, Clone)]
pub struct Deltas {
    transcript: Transcript,
    count: u64,
}

impl Deltas {
    /// The size the synthetic transcript is asked for; encoded deltas average about 510 bytes.
    pub const TARGET_BYTES: usize = 410;

    /// A stream for `seed`.
    pub fn new(seed: u64) -> Self {
        Self { transcript: Transcript::new(seed), count: 0 }
    }

    /// The next delta, with its protobuf encoding.
    pub fn next_encoded(&mut self) -> Encoded {
        let mut delta = self.transcript.next_delta(Self::TARGET_BYTES);
        delta.drop_oldest_messages = u32::from(self.count >= CONTEXT_MESSAGES_MAX);
        let call_id = format!("call-{}", self.count % TOOL_CALL_IDS);
        for output in &mut delta.tool_outputs {
            output.tool_call_id.clone_from(&call_id);
        }
        for message in &mut delta.messages {
            if let Some(call) = &mut message.tool_call {
                call.id.clone_from(&call_id);
            }
        }
        for result in &mut delta.intermediate_results {
            result.name = format!("step-{}.summary", self.count % TOOL_CALL_IDS);
        }
        self.count += 1;
        Encoded::new(delta)
    }
}

/// A delta as the store takes it (an [`AtomOutput`]) and as the peers take it (its bytes).
#[derive(Debug, Clone)]
pub struct Encoded {
    /// The atom's output: the delta, and an empty result.
    pub output: AtomOutput,
    /// The delta's protobuf encoding.
    pub bytes: Vec<u8>,
}

impl Encoded {
    /// Encodes `delta`.
    pub fn new(delta: Delta) -> Self {
        let bytes = delta.encode_to_vec();
        Self { output: AtomOutput { delta, result: Vec::new() }, bytes }
    }

    /// This delta as atom `atom_id` of `agent`.
    pub fn atom(&self, agent: u32, atom_id: u64) -> AtomRef<'_> {
        AtomRef { agent, atom_id, output: &self.output, encoded: &self.bytes }
    }
}

/// One completed atom to store.
#[derive(Debug, Clone, Copy)]
pub struct AtomRef<'a> {
    /// The agent (each agent is its own run).
    pub agent: u32,
    /// The atom's number within its agent, from 1, increasing.
    pub atom_id: u64,
    /// The atom's output, for the continuum store.
    pub output: &'a AtomOutput,
    /// The delta's protobuf encoding, for every other engine.
    pub encoded: &'a [u8],
}

/// Bytes of the header the log-style engines (continuum's raw log, okaywal) put before the
/// delta: agent (`u32` little-endian) and atom id (`u64` little-endian).
pub const HEADER_BYTES: usize = 12;

/// The header and the delta, as one record.
pub(crate) fn framed(atom: &AtomRef<'_>) -> Vec<u8> {
    let mut record = Vec::with_capacity(HEADER_BYTES + atom.encoded.len());
    record.extend_from_slice(&atom.agent.to_le_bytes());
    record.extend_from_slice(&atom.atom_id.to_le_bytes());
    record.extend_from_slice(atom.encoded);
    record
}

/// The agent of a record written by [`framed`], or `None` if it is too short.
pub(crate) fn framed_agent(record: &[u8]) -> Option<u32> {
    let agent: [u8; 4] = record.get(..4)?.try_into().ok()?;
    Some(u32::from_le_bytes(agent))
}

/// Decodes the delta of a record written by [`framed`].
pub(crate) fn decode_framed(engine: &'static str, record: &[u8]) -> crate::Result<Delta> {
    let delta =
        record.get(HEADER_BYTES..).ok_or(crate::Error::Malformed { engine, reason: "shorter than its header" })?;
    Ok(Delta::decode(delta)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_average_about_511_bytes_and_repeat_with_their_seed() {
        let mut deltas = Deltas::new(7);
        let sizes: Vec<usize> = (0..10_000).map(|_| deltas.next_encoded().bytes.len()).collect();
        let mean = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
        eprintln!("mean encoded delta: {mean:.1} bytes, min {:?} max {:?}", sizes.iter().min(), sizes.iter().max());
        assert!((490.0..=530.0).contains(&mean), "mean delta size {mean}");
        assert_eq!(Deltas::new(7).next_encoded().bytes, Deltas::new(7).next_encoded().bytes);
    }

    #[test]
    fn framed_records_keep_agent_and_delta() {
        let encoded = Deltas::new(1).next_encoded();
        let record = framed(&encoded.atom(9, 3));
        assert_eq!(framed_agent(&record), Some(9));
        assert_eq!(decode_framed("test", &record).expect("decodes"), encoded.output.delta);
        assert!(decode_framed("test", &record[..5]).is_err());
    }
}
