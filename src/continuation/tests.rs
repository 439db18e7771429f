//! Unit tests of continuations: events round-trip through their encoding, and stored events
//! that break their bounds are refused with a typed error, at open and on read.

use prost::Message;

use super::encode::{self, ContinuationEvent, StoredDecision, StoredSuspension};
use super::types::{ContinuationLevel, Decision, SuspendReason};
use super::{CONTINUATION_AGENT, suspension_key};
use crate::codec::proto;
use crate::error::Error;
use crate::store::{RunSpec, Store};

fn tree() -> ContinuationLevel {
    let mut root = ContinuationLevel::new("hr").child(
        ContinuationLevel::new("account").child(ContinuationLevel::new("authorize_account").request(
            "call-1",
            "authorize_account",
            "{}",
        )),
    );
    encode::fill_paths(&mut root, &mut Vec::new());
    root
}

#[test]
fn events_round_trip_and_paths_come_from_the_tree() {
    let reasons = [
        SuspendReason::Approval,
        SuspendReason::Timer { resume_at_unix_us: 7 },
        SuspendReason::Budget { what: "tokens".into() },
        SuspendReason::Requested { by: "ops".into() },
        SuspendReason::Deadline { at_unix_us: 9 },
    ];
    for reason in reasons {
        let event =
            ContinuationEvent::Suspension(StoredSuspension { number: 3, reason, since_unix_us: 5, root: tree() });
        assert_eq!(encode::decode(&encode::encode(&event), 1).expect("decode"), event);
    }
    let ContinuationEvent::Suspension(suspension) = encode::decode(
        &encode::encode(&ContinuationEvent::Suspension(StoredSuspension {
            number: 1,
            reason: SuspendReason::Approval,
            since_unix_us: 1,
            root: tree(),
        })),
        1,
    )
    .expect("decode") else {
        panic!("a suspension");
    };
    let leaf = &suspension.root.children[0].children[0];
    assert_eq!(leaf.resume_request[0].path, ["hr", "account", "authorize_account"]);
    let decision = ContinuationEvent::Decision(StoredDecision {
        suspension: 1,
        tool_call_id: "call-1".into(),
        decision: Decision::approve("ada").message("ok").edited_arguments("{\"a\":1}"),
    });
    assert_eq!(encode::decode(&encode::encode(&decision), 1).expect("decode"), decision);
    let resumption = ContinuationEvent::Resumption { suspension: 1, resumed_at_unix_us: 2 };
    assert_eq!(encode::decode(&encode::encode(&resumption), 1).expect("decode"), resumption);
}

#[test]
fn stored_events_that_break_their_bounds_are_refused() {
    let inconsistent = |bytes: &[u8]| matches!(encode::decode(bytes, 42), Err(Error::InconsistentLog { lsn: 42, .. }));
    assert!(inconsistent(b"\xff\xff"), "bytes that do not decode");
    assert!(inconsistent(&proto::ContinuationEvent::default().encode_to_vec()), "an empty event");
    let with_root = |root: proto::ContinuationLevel| {
        let suspension = proto::Suspension {
            number: 1,
            reason: Some(proto::SuspendReason {
                reason: Some(proto::suspend_reason::Reason::Approval(proto::ApprovalReason {})),
            }),
            since_unix_us: 1,
            root: Some(root),
        };
        proto::ContinuationEvent { event: Some(proto::continuation_event::Event::Suspension(suspension)) }
            .encode_to_vec()
    };
    let call = |id: &str, arguments: String| proto::PendingToolCall {
        tool_call_id: id.into(),
        tool_name: "t".into(),
        arguments,
    };
    let nameless = proto::ContinuationLevel { resume_request: vec![call("a", "{}".into())], ..Default::default() };
    assert!(inconsistent(&with_root(nameless)), "a level without an agent");
    let huge = proto::ContinuationLevel {
        agent: "a".into(),
        resume_request: vec![call("a", "x".repeat(crate::limits::CONTINUATION_TEXT_BYTES_MAX + 1))],
        ..Default::default()
    };
    assert!(inconsistent(&with_root(huge)), "arguments past their bound");
    let twice = proto::ContinuationLevel {
        agent: "a".into(),
        resume_request: vec![call("a", "{}".into()), call("a", "{}".into())],
        ..Default::default()
    };
    assert!(inconsistent(&with_root(twice)), "a request id twice");
    let mut deep = proto::ContinuationLevel {
        agent: "a".into(),
        resume_request: vec![call("a", "{}".into())],
        ..Default::default()
    };
    for _ in 0..crate::limits::CONTINUATION_DEPTH_MAX {
        deep = proto::ContinuationLevel { agent: "a".into(), children: vec![deep], ..Default::default() };
    }
    assert!(inconsistent(&with_root(deep)), "a tree past its depth");
}

#[test]
fn a_store_holding_a_broken_suspension_refuses_to_open_with_a_typed_error() {
    let dir = tempfile::tempdir().expect("dir");
    {
        let store = Store::open(dir.path()).expect("open");
        let run = store.create_run(RunSpec::new("r")).expect("run");
        let _control = store.control_lock();
        store
            .record_control(run, CONTINUATION_AGENT, &suspension_key(1), &[], b"\x0a\x02\xff\xff".to_vec())
            .expect("record");
    }
    assert!(matches!(Store::open(dir.path()), Err(Error::InconsistentLog { .. })));
    assert!(matches!(Store::open_read_only(dir.path()), Err(Error::InconsistentLog { .. })));
}

#[test]
fn every_byte_flip_and_truncation_of_a_stored_suspension_decodes_or_is_refused() {
    let event = ContinuationEvent::Suspension(StoredSuspension {
        number: 2,
        reason: SuspendReason::Budget { what: "tokens".into() },
        since_unix_us: 11,
        root: tree(),
    });
    let bytes = encode::encode(&event);
    for cut in 0..bytes.len() {
        check_decodes_or_refused(&bytes[..cut]);
    }
    for at in 0..bytes.len() {
        for bit in 0..8 {
            let mut flipped = bytes.clone();
            flipped[at] ^= 1 << bit;
            check_decodes_or_refused(&flipped);
        }
    }
}

/// `bytes` decode to an event that round-trips, or are refused with `InconsistentLog`.
fn check_decodes_or_refused(bytes: &[u8]) {
    match encode::decode(bytes, 5) {
        Ok(event) => assert_eq!(encode::decode(&encode::encode(&event), 5).expect("round trip"), event),
        Err(Error::InconsistentLog { lsn: 5, .. }) => {}
        Err(error) => panic!("an untyped refusal: {error}"),
    }
}
