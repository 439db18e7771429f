//! State keys, the control agents they map to, and the layout of a version atom's result
//! (`docs/FORMAT.md`, "Shared state control atoms").

use crate::error::{Error, Result};
use crate::limits::STATE_KEY_BYTES_MAX;
use crate::shared_state::StateValue;
use crate::store::CONTROL_AGENT_PREFIX;

/// A key's versions are atoms of the agent named this followed by the key.
pub const STATE_AGENT_PREFIX: &str = "continuum.state/";

/// Bytes of a version atom's result before its payload: the version and the kind.
pub(crate) const VERSION_HEADER_BYTES: usize = 9;

/// What one version of a key holds: the kind byte of its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VersionKind {
    /// The key's whole value, bytes ([`Exchange::put`](crate::channel::Exchange::put)).
    Bytes = 1,
    /// The counter's total after an addition ([`Exchange::add`](crate::channel::Exchange::add)).
    Counter = 2,
    /// One item appended to the key's list ([`Exchange::append`](crate::channel::Exchange::append)).
    Item = 3,
}

impl VersionKind {
    /// The kind a byte names, if any.
    fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(Self::Bytes),
            2 => Some(Self::Counter),
            3 => Some(Self::Item),
            _ => None,
        }
    }

    /// What a value of this kind is called in an error.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::Counter => "a counter",
            Self::Item => "a list",
        }
    }
}

/// The kind of version a value is built from.
pub(crate) fn kind_of(value: &StateValue) -> VersionKind {
    match value {
        StateValue::Bytes(_) => VersionKind::Bytes,
        StateValue::Counter(_) => VersionKind::Counter,
        StateValue::List(_) => VersionKind::Item,
    }
}

/// Refuses a state key that is empty, longer than [`STATE_KEY_BYTES_MAX`], or holds anything
/// but ASCII letters, digits and `-_.:/`.
pub(crate) fn check_key(key: &str) -> Result<()> {
    let refuse = |why: &str| Error::InvalidArgument { reason: format!("state key {key:?}: {why}") };
    if key.is_empty() {
        return Err(refuse("it is empty"));
    }
    if key.len() > STATE_KEY_BYTES_MAX {
        return Err(refuse(&format!("it is longer than {STATE_KEY_BYTES_MAX} bytes")));
    }
    if !key.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-_.:/".contains(&byte)) {
        return Err(refuse("only ASCII letters, digits and -_.:/ are allowed"));
    }
    debug_assert!(!state_agent(key).is_empty() && state_agent(key).starts_with(CONTROL_AGENT_PREFIX));
    Ok(())
}

/// The agent whose atoms are `key`'s versions.
pub(crate) fn state_agent(key: &str) -> String {
    format!("{STATE_AGENT_PREFIX}{key}")
}

/// The key of the atom holding `version` of a state key: the version in decimal, so that two
/// atoms can never hold one version (the index refuses a second atom with the same key).
pub(crate) fn version_key(version: u64) -> String {
    assert!(version > 0, "version 0 is a key's absence, never written");
    version.to_string()
}

/// A version atom's result: the version (u64 little-endian), the kind, then the payload (the
/// bytes, the counter's total as i64 little-endian, or the appended item).
pub(crate) fn encode_version(version: u64, kind: VersionKind, payload: &[u8]) -> Vec<u8> {
    assert!(version > 0, "version 0 is a key's absence, never written");
    debug_assert!(kind != VersionKind::Counter || payload.len() == 8, "a counter's total is 8 bytes");
    let mut out = Vec::with_capacity(VERSION_HEADER_BYTES + payload.len());
    out.extend_from_slice(&version.to_le_bytes());
    out.push(kind as u8);
    out.extend_from_slice(payload);
    out
}

/// Splits a version atom's result into its version, kind and payload; `None` unless the
/// version is above 0, the kind known and a counter's payload 8 bytes.
pub(crate) fn decode_version(result: &[u8]) -> Option<(u64, VersionKind, &[u8])> {
    let (header, payload) = result.split_at_checked(VERSION_HEADER_BYTES)?;
    let version = u64::from_le_bytes(header[..8].try_into().ok()?);
    let kind = VersionKind::from_byte(header[8])?;
    let valid = version > 0 && (kind != VersionKind::Counter || payload.len() == 8);
    valid.then_some((version, kind, payload))
}

/// A counter version's total.
pub(crate) fn counter_total(payload: &[u8]) -> Option<i64> {
    Some(i64::from_le_bytes(payload.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_versions_round_trip_and_bad_ones_are_refused() {
        assert!(check_key("budget/tokens:v1_x-2.y").is_ok());
        for bad in ["", "a b", "é", &"x".repeat(STATE_KEY_BYTES_MAX + 1)] {
            assert!(matches!(check_key(bad), Err(Error::InvalidArgument { .. })), "{bad:?}");
        }
        assert_eq!(state_agent("k"), "continuum.state/k");
        assert_eq!(version_key(12), "12");
        let bytes = encode_version(3, VersionKind::Bytes, b"hi");
        assert_eq!(decode_version(&bytes), Some((3, VersionKind::Bytes, &b"hi"[..])));
        let counter = encode_version(4, VersionKind::Counter, &(-5i64).to_le_bytes());
        let (_, kind, payload) = decode_version(&counter).expect("counter");
        assert_eq!((kind, counter_total(payload)), (VersionKind::Counter, Some(-5)));
        assert_eq!(decode_version(&counter[..16]), None, "a counter's total is 8 bytes");
        assert_eq!(decode_version(&bytes[..8]), None, "no kind");
        let mut unknown = bytes.clone();
        unknown[8] = 9;
        assert_eq!(decode_version(&unknown), None, "unknown kind");
        let mut zero = bytes;
        zero[..8].fill(0);
        assert_eq!(decode_version(&zero), None, "version 0 is never written");
    }
}
