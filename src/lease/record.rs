//! The result of a lease atom (`docs/FORMAT.md`, "Control atoms: leases"): what one grant,
//! renewal or release of a run's lease leaves in the log. Pure bytes; no I/O.
//!
//! ```text
//! lease event := version:u8 kind:u8 holder_len:u16le event:u64le token:u64le
//!                expires_at_unix_us:u64le holder:[u8; holder_len]
//! ```

use crate::error::{Error, Result};
use crate::limits::LEASE_HOLDER_BYTES_MAX;

/// The layout version this code writes and reads.
const VERSION: u8 = 1;

/// Bytes before the holder: version, kind, holder length, event, token, expiry.
pub(crate) const HEADER_BYTES: usize = 1 + 1 + 2 + 8 + 8 + 8;

/// What a lease atom records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventKind {
    /// A new lease with a new token.
    Grant = 1,
    /// The current lease's expiry moved.
    Renewal = 2,
    /// The current lease ended before its expiry.
    Release = 3,
}

/// One lease atom's result: the run's lease as of this atom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseEvent {
    pub kind: EventKind,
    /// 1 for the run's first lease atom, one more for each after it: the atom's key.
    pub event: u64,
    /// The fencing token (a release and a renewal repeat their grant's).
    pub token: u64,
    /// Wall-clock expiry in Unix microseconds; 0 after a release.
    pub expires_at_unix_us: u64,
    pub holder: String,
}

/// Encodes `event` ([`decode`] reads it back).
pub(crate) fn encode(event: &LeaseEvent) -> Vec<u8> {
    assert!(event.holder.len() <= LEASE_HOLDER_BYTES_MAX, "a holder's name is checked before it is encoded");
    assert!(event.event > 0, "lease events count from 1");
    let holder_len = u16::try_from(event.holder.len()).expect("a holder's name fits in u16");
    let mut out = Vec::with_capacity(HEADER_BYTES + event.holder.len());
    out.push(VERSION);
    out.push(event.kind as u8);
    out.extend_from_slice(&holder_len.to_le_bytes());
    out.extend_from_slice(&event.event.to_le_bytes());
    out.extend_from_slice(&event.token.to_le_bytes());
    out.extend_from_slice(&event.expires_at_unix_us.to_le_bytes());
    out.extend_from_slice(event.holder.as_bytes());
    assert_eq!(out.len(), HEADER_BYTES + event.holder.len());
    out
}

/// Decodes a lease atom's result; `lsn` (its start record's) goes into the error.
///
/// # Errors
/// [`Error::InconsistentLog`] for bytes that are not a lease event this version writes.
pub(crate) fn decode(bytes: &[u8], lsn: u64) -> Result<LeaseEvent> {
    let bad = |reason| Error::InconsistentLog { lsn, reason };
    let (header, holder) = bytes.split_at_checked(HEADER_BYTES).ok_or(bad("a lease event is too short"))?;
    if header[0] != VERSION {
        return Err(bad("a lease event of an unknown version"));
    }
    let kind = match header[1] {
        1 => EventKind::Grant,
        2 => EventKind::Renewal,
        3 => EventKind::Release,
        _ => return Err(bad("a lease event of an unknown kind")),
    };
    let holder_len = usize::from(u16::from_le_bytes([header[2], header[3]]));
    if holder_len != holder.len() || holder_len > LEASE_HOLDER_BYTES_MAX {
        return Err(bad("a lease event's holder length does not match its bytes"));
    }
    let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("eight bytes"));
    let (event, token, expires_at_unix_us) = (u64_at(4), u64_at(12), u64_at(20));
    if event == 0 || token == 0 {
        return Err(bad("a lease event without its event number or token"));
    }
    if (kind == EventKind::Release) != (expires_at_unix_us == 0) {
        return Err(bad("a lease event's expiry does not match its kind"));
    }
    let holder = String::from_utf8(holder.to_vec()).map_err(|_| bad("a lease event's holder is not UTF-8"))?;
    Ok(LeaseEvent { kind, event, token, expires_at_unix_us, holder })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> LeaseEvent {
        LeaseEvent { kind: EventKind::Grant, event: 3, token: 2, expires_at_unix_us: 1_000, holder: "w1".into() }
    }

    #[test]
    fn an_event_round_trips_and_its_layout_is_fixed() {
        let bytes = encode(&grant());
        assert_eq!(&bytes[..4], &[1, 1, 2, 0]);
        assert_eq!(&bytes[4..12], &3u64.to_le_bytes());
        assert_eq!(&bytes[HEADER_BYTES..], b"w1");
        assert_eq!(decode(&bytes, 7).expect("decode"), grant());
        let release = LeaseEvent { kind: EventKind::Release, expires_at_unix_us: 0, ..grant() };
        assert_eq!(decode(&encode(&release), 7).expect("decode"), release);
    }

    #[test]
    fn every_truncation_and_bad_field_is_refused() {
        let bytes = encode(&grant());
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len], 7).is_err(), "{len} bytes");
        }
        for (at, value) in [(0, 2), (1, 0), (1, 4), (2, 9), (4, 0), (12, 0), (20, 0)] {
            let mut bad = bytes.clone();
            bad[at] = value;
            if at == 4 || at == 12 || at == 20 {
                bad[at..at + 8].fill(0);
            }
            assert!(matches!(decode(&bad, 7), Err(Error::InconsistentLog { lsn: 7, .. })), "byte {at}");
        }
        let mut not_utf8 = bytes;
        not_utf8[HEADER_BYTES] = 0xff;
        assert!(decode(&not_utf8, 7).is_err());
    }
}
