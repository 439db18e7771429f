//! Round trips of every record kind with random deltas, and malformed input.

use proptest::prelude::*;

use super::proto::*;
use super::*;
use crate::ids::AtomId;
use crate::synthetic::Transcript;

fn sample_records(seed: u64) -> Vec<StoreRecord> {
    let mut transcript = Transcript::new(seed);
    vec![
        StoreRecord::RunCreated(RunCreated {
            run: 1,
            run_name: "run-1".into(),
            pipeline: "research".into(),
            pipeline_version: "1.2".into(),
            environment: [("host".to_owned(), "node-7".to_owned()), ("model".to_owned(), "gpt-x".to_owned())].into(),
            created_at_unix_us: 17,
            snapshot_every_atoms: Some(10),
            snapshot_every_ms: None,
        }),
        StoreRecord::AtomStarted(AtomStarted {
            atom: 3,
            run: 1,
            agent: "planner/researcher".into(),
            key: "step-3".into(),
            parents: vec![1, 2],
            idempotency_key: "k".into(),
            started_at_unix_us: 5,
        }),
        StoreRecord::AtomCompleted(AtomCompleted {
            atom: 3,
            delta: Some(transcript.next_delta(500)),
            result: b"ok".to_vec(),
            ended_at_unix_us: 9,
        }),
        StoreRecord::AtomFailed(AtomFailed { atom: 4, error: "timeout".into(), retryable: true, ended_at_unix_us: 2 }),
        StoreRecord::RunTerminal(RunTerminal {
            run: 1,
            success: false,
            resume_hint: "approve step 9".into(),
            ended_at_unix_us: 3,
        }),
        StoreRecord::GuardStarted(GuardStarted {
            key: "g".into(),
            atom: 3,
            operation: "send_email".into(),
            started_at_unix_us: 1,
        }),
        StoreRecord::GuardCompleted(GuardCompleted { key: "g".into(), result: vec![1, 2, 3], ended_at_unix_us: 4 }),
        StoreRecord::GuardFailed(crate::codec::proto::GuardFailed {
            key: "g".into(),
            error: "HTTP 503".into(),
            retryable: true,
            ended_at_unix_us: 5,
        }),
        StoreRecord::Dictionary(CompressionDictionary { id: 1, dictionary: vec![7; 100] }),
        StoreRecord::AtomsAbandoned(AtomsAbandoned {
            after_atom: 2,
            run: 1,
            agent: "a".into(),
            reason: "reviewer".into(),
            at_unix_us: 8,
        }),
        StoreRecord::AtomReclaimed(AtomCompleted { atom: 3, delta: None, result: b"ok".to_vec(), ended_at_unix_us: 9 }),
        StoreRecord::RunDropped(RunDropped { run: 1, next_atom: 5, dropped_at_unix_us: 10 }),
        StoreRecord::AtomPinned(AtomPinned { atom: 3, pinned: true, at_unix_us: 11 }),
    ]
}

#[test]
fn every_kind_round_trips_with_and_without_a_dictionary() {
    let codec = Codec::compressing_from(64);
    for record in sample_records(1) {
        assert_eq!(codec.decode(&codec.encode(&record)).as_ref(), Ok(&record));
    }
    let mut transcript = Transcript::new(9);
    let samples: Vec<Vec<u8>> = (0..500).map(|_| transcript.next_delta(500).encode_to_vec()).collect();
    let dictionary = train_dictionary(&samples, limits::DICTIONARY_BYTES).expect("train");
    codec.add_dictionary(1, &dictionary);
    for record in sample_records(2) {
        let bytes = codec.encode(&record);
        assert_eq!(codec.decode(&bytes).as_ref(), Ok(&record));
    }
}

#[test]
fn a_record_needing_an_unknown_dictionary_is_a_typed_error() {
    let trained = Codec::compressing_from(64);
    let mut transcript = Transcript::new(3);
    let samples: Vec<Vec<u8>> = (0..500).map(|_| transcript.next_delta(500).encode_to_vec()).collect();
    trained.add_dictionary(7, &train_dictionary(&samples, limits::DICTIONARY_BYTES).expect("train"));
    let record = StoreRecord::AtomCompleted(AtomCompleted {
        atom: 1,
        delta: Some(transcript.next_delta(500)),
        ..Default::default()
    });
    let bytes = trained.encode(&record);
    assert_eq!(Codec::default().decode(&bytes), Err(CodecError::UnknownDictionary(7)));
}

#[test]
fn malformed_envelopes_are_typed_errors() {
    let codec = Codec::compressing_from(64);
    assert_eq!(codec.decode(&[]), Err(CodecError::Truncated));
    assert_eq!(codec.decode(&[99, 1, 0, 0, 0]), Err(CodecError::UnknownKind(99)));
    assert!(matches!(codec.decode(&[2, 9, 0, 0, 0]), Err(CodecError::UnsupportedVersion { version: 9, .. })));
    assert!(matches!(codec.decode(&[2, 1, 7, 0, 0]), Err(CodecError::Malformed(_))));
    // An absurd declared length is refused before any allocation.
    assert!(matches!(
        codec.decode(&[3, 1, 1, 0, 5, 0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2]),
        Err(CodecError::TooLarge { .. })
    ));
    // A length that lies about the frame is refused.
    let good = codec.encode(&sample_records(4)[2]);
    let mut lying = good.clone();
    assert_eq!(lying[2], 1, "a 500-byte delta is compressed");
    // Byte 5 is the first byte of the declared length (after the one-byte subject).
    lying[5] ^= 0x01;
    assert_eq!(codec.decode(&lying), Err(CodecError::Decompress));
}

#[test]
fn every_truncation_and_bit_flip_decodes_or_errs_without_panicking() {
    let codec = Codec::compressing_from(64);
    for record in sample_records(5) {
        let bytes = codec.encode(&record);
        for cut in 0..bytes.len() {
            let _ = codec.decode(&bytes[..cut]);
        }
        for at in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x10;
            let _ = codec.decode(&flipped);
        }
    }
}

/// Random deltas of every shape, shared with the context tests.
pub(crate) fn arb_delta() -> impl Strategy<Value = Delta> {
    let message =
        (any::<String>(), any::<String>(), proptest::option::of((any::<String>(), any::<String>(), any::<String>())))
            .prop_map(|(role, content, call)| ChatMessage {
                role,
                content,
                tool_call: call.map(|(id, name, arguments)| ToolCall { id, name, arguments }),
            });
    let output = (any::<String>(), proptest::collection::vec(any::<u8>(), 0..300))
        .prop_map(|(tool_call_id, output)| ToolOutput { tool_call_id, output });
    let result = (any::<String>(), proptest::collection::vec(any::<u8>(), 0..64))
        .prop_map(|(name, value)| IntermediateResult { name, value });
    let change = (any::<String>(), proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64))).prop_map(
        |(key, set)| StateChange {
            key,
            change: Some(match set {
                Some(value) => state_change::Change::Set(value),
                None => state_change::Change::Delete(Delete {}),
            }),
        },
    );
    let summarization = (0u32..8, 0u32..8, any::<String>(), any::<String>())
        .prop_map(|(from, to, role, summary)| Summarization { from, to, role, summary });
    (
        proptest::collection::vec(message, 0..4),
        proptest::collection::vec(output, 0..3),
        proptest::collection::vec(result, 0..3),
        proptest::collection::vec(change, 0..6),
        0u32..4,
        proptest::collection::vec(summarization, 0..2),
    )
        .prop_map(
            |(messages, tool_outputs, intermediate_results, state_changes, drop_oldest_messages, summarizations)| {
                Delta {
                    messages,
                    tool_outputs,
                    intermediate_results,
                    state_changes,
                    drop_oldest_messages,
                    summarizations,
                }
            },
        )
}

proptest! {
    #[test]
    fn random_deltas_round_trip(delta in arb_delta(), result in proptest::collection::vec(any::<u8>(), 0..100), atom in 1u64..u64::MAX) {
        let codec = Codec::compressing_from(64);
        let record = StoreRecord::AtomCompleted(AtomCompleted { atom, delta: Some(delta), result, ended_at_unix_us: atom / 3 });
        prop_assert_eq!(codec.decode(&codec.encode(&record)), Ok(record));
    }

    #[test]
    fn the_borrowed_start_encoding_equals_the_owned_one(
        atom in prop_oneof![Just(0u64), 1u64..300, any::<u64>()],
        run in prop_oneof![Just(0u64), 1u64..300, any::<u64>()],
        agent in ".{0,12}",
        key in ".{0,40}",
        parents in proptest::collection::vec(prop_oneof![0u64..300, any::<u64>()], 0..6),
        idempotency_key in ".{0,12}",
        started in prop_oneof![Just(0u64), 1u64..300, any::<u64>()],
    ) {
        // Written straight into its envelope with the default codec, through `wrap` (and
        // compressed when that pays) with the other.
        for codec in [Codec::compressing_from(64), Codec::default()] {
            let ids: Vec<AtomId> = parents.iter().map(|parent| AtomId(*parent)).collect();
            let parts = StartParts { atom, run, agent: &agent, key: &key, parents: &ids, idempotency_key: &idempotency_key, started_at_unix_us: started };
            let borrowed = codec.encode_start(&parts);
            let owned = StoreRecord::AtomStarted(AtomStarted { atom, run, agent: agent.clone(), key: key.clone(), parents: parents.clone(), idempotency_key: idempotency_key.clone(), started_at_unix_us: started });
            prop_assert_eq!(&borrowed, &codec.encode(&owned));
            prop_assert_eq!(codec.decode(&borrowed), Ok(owned));
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Codec::default().decode(&bytes);
    }
}

#[test]
fn the_borrowed_completion_encoding_equals_the_owned_one() {
    // Bodies below the default codec's threshold are written straight into their envelope;
    // the others (all of them with the first codec, the 4 KB one with the second) go through
    // `wrap` and are compressed.
    let cases = [
        (1u64, b"ok".to_vec(), 5u64, 500),
        (0, Vec::new(), 0, 500),
        (u64::MAX, vec![0; 300], 1, 500),
        (7, vec![1; 3], u64::MAX, 4_000),
        (1 << 20, Vec::new(), 9, 100),
    ];
    for codec in [Codec::compressing_from(64), Codec::default()] {
        let mut transcript = Transcript::new(11);
        for (atom, result, ended, delta_bytes) in cases.clone() {
            let delta = transcript.next_delta(delta_bytes);
            let owned = StoreRecord::AtomCompleted(AtomCompleted {
                atom,
                delta: Some(delta.clone()),
                result: result.clone(),
                ended_at_unix_us: ended,
            });
            let borrowed = codec.encode_completion(atom, &delta, &result, ended);
            assert_eq!(borrowed, codec.encode(&owned));
            assert_eq!(codec.decode(&borrowed), Ok(owned));
        }
    }
}

#[test]
fn frames_with_or_without_their_own_dictionary_id_and_length_decode() {
    let codec = Codec::compressing_from(64);
    let mut transcript = Transcript::new(5);
    let samples: Vec<Vec<u8>> = (0..500).map(|_| transcript.next_delta(500).encode_to_vec()).collect();
    let dictionary = train_dictionary(&samples, limits::DICTIONARY_BYTES).expect("train");
    codec.add_dictionary(3, &dictionary);
    let record = StoreRecord::AtomCompleted(AtomCompleted {
        atom: 9,
        delta: Some(transcript.next_delta(500)),
        ..Default::default()
    });
    let body = record.encode_body();
    // As stores wrote records before the frames dropped these fields (zstd's defaults).
    let mut older = zstd::bulk::Compressor::with_dictionary(limits::COMPRESSION_LEVEL, &dictionary).expect("zstd");
    let frame = older.compress(&body).expect("compress");
    let mut old_bytes = Vec::new();
    let uncompressed_len = u32::try_from(body.len()).expect("small");
    let compression = Compression::ZstdDictionary { dictionary_id: 3, uncompressed_len };
    envelope::write_header(&mut old_bytes, record.kind(), SCHEMA_VERSION, record.subject(), compression);
    old_bytes.extend_from_slice(&frame);
    assert_eq!(codec.decode(&old_bytes), Ok(record.clone()));
    let new_bytes = codec.encode(&record);
    assert_eq!(codec.decode(&new_bytes), Ok(record));
    // The new frame omits the 4-byte dictionary id and the content size.
    assert!(new_bytes.len() + 4 <= old_bytes.len(), "{} against {}", new_bytes.len(), old_bytes.len());
}

#[test]
fn the_default_codec_compresses_only_bodies_of_two_kib_and_more() {
    let codec = Codec::default();
    let mut transcript = Transcript::new(21);
    let small = StoreRecord::AtomCompleted(AtomCompleted {
        atom: 1,
        delta: Some(transcript.next_delta(500)),
        ..Default::default()
    });
    let large = StoreRecord::AtomCompleted(AtomCompleted {
        atom: 2,
        delta: Some(transcript.next_delta(8000)),
        ..Default::default()
    });
    assert!(small.encode_body().len() < limits::COMPRESSION_MIN_BYTES);
    assert!(large.encode_body().len() >= limits::COMPRESSION_MIN_BYTES);
    let (small_bytes, large_bytes) = (codec.encode(&small), codec.encode(&large));
    assert_eq!(small_bytes[2], 0, "a 500-byte delta is stored plain");
    assert_eq!(large_bytes[2], 1, "a delta of several KiB is compressed");
    assert!(large_bytes.len() < large.encode_body().len() / 2);
    assert_eq!(codec.decode(&small_bytes), Ok(small));
    assert_eq!(codec.decode(&large_bytes), Ok(large));
}

/// One way of damaging an encoded delta.
#[derive(Clone, Debug)]
enum Damage {
    Flip { at: usize, bits: u8 },
    Truncate { at: usize },
    Insert { at: usize, bytes: Vec<u8> },
    Remove { at: usize, len: usize },
}

impl Damage {
    fn apply(&self, bytes: &mut Vec<u8>) {
        let at = |at: &usize, len: usize| if len == 0 { 0 } else { at % (len + 1) };
        match self {
            Damage::Flip { at: i, bits } if !bytes.is_empty() => {
                let i = i % bytes.len();
                bytes[i] ^= bits.max(&1);
            }
            Damage::Flip { .. } => {}
            Damage::Truncate { at: i } => bytes.truncate(at(i, bytes.len())),
            Damage::Insert { at: i, bytes: new } => {
                let i = at(i, bytes.len());
                bytes.splice(i..i, new.iter().copied());
            }
            Damage::Remove { at: i, len } => {
                let i = at(i, bytes.len());
                let end = (i + len).min(bytes.len());
                bytes.drain(i..end);
            }
        }
    }
}

fn arb_damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, bits)| Damage::Flip { at, bits }),
        any::<usize>().prop_map(|at| Damage::Truncate { at }),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..6))
            .prop_map(|(at, bytes)| Damage::Insert { at, bytes }),
        (any::<usize>(), 1usize..6).prop_map(|(at, len)| Damage::Remove { at, len }),
    ]
}

/// The encodings random damage seldom makes: each is taken exactly when prost decodes it, and
/// the in-place check never takes one prost refuses.
#[test]
fn the_encoded_delta_check_agrees_with_prost_on_rare_encodings() {
    // A state change: key "k" (field 1), then `delete` (field 3) with these bytes.
    let delete = |inner: &[u8]| {
        let mut change = vec![0x0a, 1, b'k', 0x1a, inner.len() as u8];
        change.extend_from_slice(inner);
        let mut delta = vec![0x22, change.len() as u8];
        delta.extend_from_slice(&change);
        delta
    };
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("a delete with a well-formed unknown field", delete(&[0x08, 0x01]), true),
        ("a delete with a truncated varint", delete(&[0x08]), false),
        ("a delete with a length past its end", delete(&[0x0a, 0x05, b'x']), false),
        ("drop_oldest_messages as a varint", vec![0x28, 0x03], true),
        ("drop_oldest_messages length-delimited", vec![0x2a, 0x00], false),
        ("drop_oldest_messages as fixed32", vec![0x2d, 0, 0, 0, 0], false),
        ("a set value as a varint", vec![0x22, 0x05, 0x0a, 0x01, b'k', 0x10, 0x01], false),
        ("a message's role as a varint", vec![0x0a, 0x02, 0x08, 0x01], false),
        ("a tool call as a varint", vec![0x0a, 0x02, 0x18, 0x01], false),
        ("an unknown varint field in a message", vec![0x0a, 0x02, 0x20, 0x01], true),
        ("a message given twice", vec![0x0a, 0x03, 0x0a, 0x01, b'a', 0x0a, 0x03, 0x12, 0x01, b'b'], true),
        ("a role given twice, the second not UTF-8", vec![0x0a, 0x06, 0x0a, 0x01, b'a', 0x0a, 0x01, 0xff], false),
        ("a state change without a change", vec![0x22, 0x03, 0x0a, 0x01, b'k'], true),
        ("an unknown fixed64 field", vec![0x39, 1, 2, 3, 4, 5, 6, 7, 8], true),
        ("a summary's `to` length-delimited", vec![0x32, 0x02, 0x12, 0x00], false),
        ("a tool call's arguments not UTF-8", vec![0x0a, 0x05, 0x1a, 0x03, 0x1a, 0x01, 0xc0], false),
    ];
    for (what, bytes, decodes) in cases {
        assert_eq!(Delta::decode(bytes.as_slice()).is_ok(), decodes, "prost on {what}");
        assert_eq!(check_encoded_delta(&bytes), decodes, "{what}");
        if !decodes {
            assert!(delta_check::check_delta(&bytes).is_err(), "checked in place: {what}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// `check_encoded_delta` (`Store::record_atom_encoded`'s check) takes exactly the bytes
    /// prost decodes as a `Delta`, and its in-place check alone never takes bytes prost would
    /// refuse: deltas as encoded (which it always takes in place), then damaged, and random
    /// bytes.
    #[test]
    fn the_encoded_delta_check_takes_what_prost_decodes(
        delta in arb_delta(),
        damages in proptest::collection::vec(arb_damage(), 0..4),
        random in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = delta.encode_to_vec();
        prop_assert!(delta_check::check_delta(&bytes).is_ok(), "an encoded delta is checked in place");
        prop_assert!(check_encoded_delta(&bytes));
        for damage in &damages {
            damage.apply(&mut bytes);
            let prost = Delta::decode(bytes.as_slice()).is_ok();
            prop_assert_eq!(check_encoded_delta(&bytes), prost, "{:?}", damage);
            if delta_check::check_delta(&bytes).is_ok() {
                prop_assert!(prost, "checked in place, refused by prost after {:?}", damage);
            }
        }
        let prost = Delta::decode(random.as_slice()).is_ok();
        prop_assert_eq!(check_encoded_delta(&random), prost);
        if delta_check::check_delta(&random).is_ok() {
            prop_assert!(prost, "random bytes checked in place, refused by prost");
        }
    }

    /// A completion encoded from a delta's bytes is the record encoded from the delta.
    #[test]
    fn the_completion_from_encoded_bytes_equals_the_one_from_the_delta(
        delta in arb_delta(),
        result in proptest::collection::vec(any::<u8>(), 0..100),
        atom in 1u64..u64::MAX,
    ) {
        for codec in [Codec::compressing_from(64), Codec::default()] {
            let from_bytes = codec.encode_completion_bytes(atom, &delta.encode_to_vec(), &result, 7);
            prop_assert_eq!(&from_bytes, &codec.encode_completion(atom, &delta, &result, 7));
        }
    }
}
