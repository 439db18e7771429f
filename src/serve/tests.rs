//! Unit tests of the socket protocol and its server in one process: every message round
//! trips, no prefix of a message decodes, hostile frames (a length above the limit, a
//! truncated frame, garbage, another version) get typed errors while the server goes on
//! serving its other clients, and a leased atom across the socket records what its client's
//! work did, or nothing when the client goes away inside it.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use crate::channel::Exchanged;
use crate::error::Error;
use crate::lease::Lease;
use crate::limits::{SERVE_CLIENTS_MAX, SERVE_FRAME_BYTES_MAX, SERVE_SOCKET_PATH_BYTES_MAX};
use crate::serve::frame::{Frame, read_frame, write_frame};
use crate::serve::protocol::{PROTOCOL_VERSION, Request, Response};
use crate::serve::{Client, SOCKET_FILE_NAME, Server};
use crate::shared_state::{StateKey, StateValue};
use crate::store::{AtomFailure, AtomId, AtomOutput, AtomStatus, RunId, RunSpec, Store};

const LONG: Duration = Duration::from_secs(60);

fn output(text: &str) -> AtomOutput {
    AtomOutput { result: text.as_bytes().to_vec(), ..AtomOutput::default() }
}

/// A store in a temporary directory, served on its default socket.
fn served() -> (tempfile::TempDir, Arc<Store>, Server) {
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(Store::open(dir.path()).expect("open"));
    let server = store.serve(None).expect("serve");
    assert_eq!(server.path(), dir.path().join(SOCKET_FILE_NAME));
    (dir, store, server)
}

/// A raw connection that has said hello.
fn raw(server: &Server) -> UnixStream {
    let mut stream = UnixStream::connect(server.path()).expect("connect");
    let hello = Request::Hello { version: PROTOCOL_VERSION }.encode().expect("encode");
    write_frame(&mut stream, &hello).expect("hello");
    assert!(matches!(response(&mut stream), Response::Hello { version: PROTOCOL_VERSION }));
    stream
}

fn response(stream: &mut UnixStream) -> Response {
    match read_frame(stream).expect("a frame") {
        Frame::Message(message) => Response::decode(&message).expect("a response"),
        Frame::Closed => panic!("the server closed the connection"),
    }
}

/// Reads until the server closes the connection (a close with our bytes unread resets it);
/// the bytes it sent on the way.
fn until_closed(stream: &mut UnixStream) -> usize {
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(error) => assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "read to the end"),
    }
    rest.len()
}

/// The server still serves a new client.
fn assert_serving(server: &Server) {
    let mut client = Client::connect(server.path()).expect("connect");
    assert_eq!(client.run_id("no such run").expect("run_id"), None);
}

fn requests() -> Vec<Request> {
    let lease = Lease { run: RunId::from_raw(3), holder: "w".into(), token: 9, expires_at_unix_us: 77 };
    let mut environment = BTreeMap::new();
    environment.insert("host".to_owned(), "a".to_owned());
    let (key, store_key) = (StateKey::run("k"), StateKey::store("s"));
    vec![
        Request::Hello { version: PROTOCOL_VERSION },
        Request::CreateRun { name: "r".into(), pipeline: "p".into(), pipeline_version: "1".into(), environment },
        Request::RunId { name: "r".into() },
        Request::AcquireLease { run: RunId::from_raw(3), holder: "w".into(), ttl_us: 5 },
        Request::RenewLease { lease: lease.clone(), ttl_us: 6 },
        Request::ReleaseLease { lease: lease.clone() },
        Request::LeaseOf { run: RunId::from_raw(3) },
        Request::RecordAtom {
            run: RunId::from_raw(3),
            agent: "a".into(),
            key: "k".into(),
            parents: vec![AtomId::from_raw(1), AtomId::from_raw(2)],
            output: output("out"),
        },
        Request::Atom { atom: AtomId::from_raw(4) },
        Request::ReadState { run: RunId::from_raw(3), key: store_key.clone() },
        Request::ExecuteLeased { lease, agent: "a".into(), key: "k".into(), parents: vec![AtomId::from_raw(1)] },
        Request::Send { channel: "c".into(), payload: b"m".to_vec() },
        Request::Receive { channel: "c".into(), consumer: "x".into(), max: 3 },
        Request::Read { key: key.clone() },
        Request::Put { key: key.clone(), value: b"v".to_vec() },
        Request::Add { key: store_key, amount: -4 },
        Request::Append { key, item: b"i".to_vec() },
        Request::Complete { output: output("done") },
        Request::Fail { failure: AtomFailure { message: "no".into(), retryable: true } },
    ]
}

#[test]
fn every_request_round_trips_and_no_prefix_of_one_decodes() {
    for request in requests() {
        let frame = request.encode().expect("encode");
        let message = &frame[4..];
        assert_eq!(u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) as usize, message.len());
        assert_eq!(Request::decode(message).expect("decode"), request);
        for cut in 0..message.len() {
            assert!(
                matches!(Request::decode(&message[..cut]), Err(Error::Protocol { .. })),
                "{request:?} cut at {cut}"
            );
        }
        let mut longer = message.to_vec();
        longer.push(0);
        assert!(matches!(Request::decode(&longer), Err(Error::Protocol { .. })), "a trailing byte is refused");
    }
}

#[test]
fn errors_keep_their_variant_and_facts_across_the_socket() {
    let stale = Error::StaleLease { run: 1, token: 2, current: 3 };
    let errors = [
        Error::LeaseHeld { run: 1, holder: "h".into(), token: 2, expires_at_unix_us: 3 },
        Error::Conflict { key: "k".into(), expected: 1, found: 2 },
        Error::ConsumerConflict { channel: "c".into(), consumer: "x".into(), expected: 1, found: 2 },
        Error::OutputNotRecorded { atom: 5, output: Box::new(output("o")), source: Box::new(stale) },
        Error::UnknownRun { run: "r".into() },
        Error::InvalidArgument { reason: "why".into() },
        Error::LimitExceeded { what: "what".into(), limit: 7 },
        Error::AtomFailed { atom: 5, message: "m".into(), retryable: true },
        Error::ProtocolVersion { client: 1, server: 2 },
    ];
    for error in errors {
        let frame = Response::Error(error.replicate()).encode().expect("encode");
        let Response::Error(decoded) = Response::decode(&frame[4..]).expect("decode") else { panic!("an error") };
        assert_eq!(format!("{decoded:?}"), format!("{error:?}"));
    }
    let frame = Response::Error(Error::Closed).encode().expect("encode");
    let Response::Error(decoded) = Response::decode(&frame[4..]).expect("decode") else { panic!("an error") };
    assert!(matches!(decoded, Error::Remote { message } if message == Error::Closed.to_string()));
}

#[test]
fn a_length_above_the_limit_is_refused_unallocated_and_the_server_serves_on() {
    let (_dir, _store, server) = served();
    let mut stream = raw(&server);
    stream.write_all(&(SERVE_FRAME_BYTES_MAX + 1).to_le_bytes()).expect("length");
    stream.write_all(&u32::MAX.to_le_bytes()).expect("more bytes");
    assert!(matches!(response(&mut stream), Response::Error(Error::Protocol { .. })));
    assert_eq!(until_closed(&mut stream), 0, "the connection is closed after the refusal");
    let mut reader: &[u8] = &u32::MAX.to_le_bytes();
    assert!(matches!(read_frame(&mut reader), Err(Error::Protocol { .. })));
    assert_serving(&server);
}

#[test]
fn a_truncated_frame_closes_its_connection_only() {
    let (_dir, _store, server) = served();
    let mut stream = raw(&server);
    stream.write_all(&100u32.to_le_bytes()).expect("length");
    stream.write_all(&[tag_of(&Request::RunId { name: String::new() }); 10]).expect("10 of 100 bytes");
    stream.shutdown(Shutdown::Write).expect("end the frame early");
    assert!(matches!(response(&mut stream), Response::Error(Error::Protocol { .. })));
    assert_eq!(until_closed(&mut stream), 0);
    let mut half: &[u8] = &[1, 0];
    assert!(matches!(read_frame(&mut half), Err(Error::Protocol { .. })), "a length cut short");
    assert_serving(&server);
}

fn tag_of(request: &Request) -> u8 {
    request.encode().expect("encode")[4]
}

#[test]
fn garbage_gets_a_protocol_error_before_and_after_the_hello() {
    let (_dir, _store, server) = served();
    for hello_first in [false, true] {
        let mut stream = if hello_first { raw(&server) } else { UnixStream::connect(server.path()).expect("connect") };
        stream.write_all(&[5, 0, 0, 0, 250, 1, 2, 3, 4]).expect("an unknown tag");
        assert!(matches!(response(&mut stream), Response::Error(Error::Protocol { .. })));
        assert_eq!(until_closed(&mut stream), 0);
    }
    let mut stream = UnixStream::connect(server.path()).expect("connect");
    write_frame(&mut stream, &Request::RunId { name: "r".into() }.encode().expect("encode")).expect("write");
    assert!(matches!(response(&mut stream), Response::Error(Error::Protocol { .. })), "a hello comes first");
    let mut stream = raw(&server);
    let atom_call = Request::Add { key: "k".into(), amount: 1 }.encode().expect("encode");
    write_frame(&mut stream, &atom_call).expect("write");
    assert!(matches!(response(&mut stream), Response::Error(Error::Protocol { .. })), "no atom is running");
    assert_serving(&server);
}

#[test]
fn a_client_of_another_version_is_refused_clearly() {
    let (_dir, _store, server) = served();
    let mut stream = UnixStream::connect(server.path()).expect("connect");
    let hello = Request::Hello { version: PROTOCOL_VERSION + 1 }.encode().expect("encode");
    write_frame(&mut stream, &hello).expect("hello");
    let Response::Error(Error::ProtocolVersion { client, server: version }) = response(&mut stream) else {
        panic!("a version refusal")
    };
    assert_eq!((client, version), (PROTOCOL_VERSION + 1, PROTOCOL_VERSION));
    assert_eq!(until_closed(&mut stream), 0);
    assert_serving(&server);
}

#[test]
fn a_leased_atom_across_the_socket_records_what_its_work_did_and_replays() {
    let (_dir, store, server) = served();
    let mut client = Client::connect(server.path()).expect("connect");
    let run = client.create_run(RunSpec::new("team")).expect("run");
    assert_eq!(client.run_id("team").expect("run_id"), Some(run));
    let lease = client.acquire_lease(run, "w1", LONG).expect("lease");
    assert_eq!(client.lease_of(run).expect("lease_of"), Some(lease.clone()));
    assert!(matches!(client.record_atom(run, "a", "plain", &[], &output("x")), Err(Error::LeaseHeld { .. })));
    let sent = client
        .execute_leased(&lease, "planner", "plan", &[], |exchange| {
            exchange.send("tasks", b"fly".to_vec())?;
            exchange.put("plan", b"p1".to_vec())?;
            exchange.add(StateKey::store("steps"), 2)?;
            exchange.append("log", b"planned".to_vec())?;
            let read = exchange.read("plan")?.expect("the atom sees its own put");
            assert_eq!(read.value, StateValue::Bytes(b"p1".to_vec()));
            Ok(output("planned"))
        })
        .expect("leased atom");
    assert!(!sent.executed.replayed);
    let work = |exchange: &mut crate::serve::RemoteExchange<'_>| {
        let tasks = exchange.receive("tasks", "researcher", 10)?;
        Ok(AtomOutput { result: tasks[0].payload.clone(), ..AtomOutput::default() })
    };
    let first = client.execute_leased(&lease, "researcher", "r1", &[], work).expect("receive");
    assert_eq!(first.executed.output.result, b"fly");
    let again = client.execute_leased(&lease, "researcher", "r1", &[], |_| panic!("replayed")).expect("replay");
    assert!(again.executed.replayed);
    assert_eq!(again.received, first.received, "a replay returns what the atom consumed");
    let local: Exchanged =
        store.execute_leased(&lease, "researcher", "r1", &[], |_| panic!("replayed")).expect("local");
    assert_eq!(local, again, "the same Exchanged as the store's");
    let steps = client.read_state(run, StateKey::store("steps")).expect("read_state").expect("written");
    assert_eq!(steps.value, StateValue::Counter(2));
    assert_eq!(
        store.read_state(run, "log").expect("read").expect("list").value,
        StateValue::List(vec![b"planned".to_vec()])
    );
    let atom = client.atom(sent.executed.atom).expect("atom");
    assert_eq!((atom.status, atom.output), (AtomStatus::Completed, Some(output("planned"))));
    let failed = client.execute_leased(&lease, "planner", "broken", &[], |_| {
        Err(AtomFailure { message: "no plan".into(), retryable: false })
    });
    assert!(matches!(failed, Err(Error::AtomFailed { retryable: false, .. })));
    client.release_lease(lease.clone()).expect("release");
    assert!(matches!(client.release_lease(lease), Err(Error::StaleLease { .. })));
    assert!(matches!(client.atom(AtomId::from_raw(1_000_000)), Err(Error::UnknownAtom { .. })));
    client.record_atom(run, "a", "plain", &[], &output("x")).expect("no lease now");
}

#[test]
fn a_client_gone_inside_an_atom_leaves_it_to_the_next_execution() {
    let (_dir, store, server) = served();
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let lease = store.acquire_lease(run, "w1", LONG).expect("lease");
    let mut stream = raw(&server);
    let begin = Request::ExecuteLeased { lease: lease.clone(), agent: "a".into(), key: "k".into(), parents: vec![] };
    write_frame(&mut stream, &begin.encode().expect("encode")).expect("write");
    let Response::Begun { atom } = response(&mut stream) else { panic!("begun") };
    let put = Request::Put { key: "half".into(), value: b"done".to_vec() };
    write_frame(&mut stream, &put.encode().expect("encode")).expect("write");
    assert!(matches!(response(&mut stream), Response::Done));
    drop(stream);
    let mut client = Client::connect(server.path()).expect("connect");
    let mut ran = false;
    let done = client
        .execute_leased(&lease, "a", "k", &[], |_| {
            ran = true;
            Ok(output("second"))
        })
        .expect("executed again");
    assert!(ran, "the work runs again");
    assert_eq!(done.executed.atom, atom, "in the same atom");
    assert_eq!(store.atom(atom).expect("atom").output, Some(output("second")));
    assert_eq!(store.read_state(run, "half").expect("read"), None, "nothing of the first attempt is recorded");
}

#[test]
fn a_client_whose_work_unwinds_breaks_off_and_its_atom_runs_again() {
    let (_dir, store, server) = served();
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let lease = store.acquire_lease(run, "w1", LONG).expect("lease");
    let mut client = Client::connect(server.path()).expect("connect");
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = client.execute_leased(&lease, "a", "k", &[], |_| panic!("the work panics"));
    }));
    assert!(unwound.is_err());
    assert!(matches!(client.lease_of(run), Err(Error::Disconnected { .. })), "the connection is broken off");
    let mut client = Client::connect(server.path()).expect("connect");
    let done = client.execute_leased(&lease, "a", "k", &[], |_| Ok(output("again"))).expect("again");
    assert!(!done.executed.replayed);
}

#[test]
fn a_stale_lease_completing_across_the_socket_records_nothing() {
    let (_dir, store, server) = served();
    let run = store.create_run(RunSpec::new("r")).expect("run");
    let old = store.acquire_lease(run, "w1", Duration::from_millis(1)).expect("lease");
    while store.lease_of(run).expect("lease_of").is_some() {
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut client = Client::connect(server.path()).expect("connect");
    assert!(matches!(client.renew_lease(&old, LONG), Err(Error::StaleLease { .. })));
    let new = client.acquire_lease(run, "w2", LONG).expect("taken over");
    assert!(new.token > old.token);
    let refused = client.execute_leased(&old, "a", "k", &[], |_| Ok(output("stale")));
    assert!(matches!(refused, Err(Error::StaleLease { .. })), "refused at the start: {refused:?}");
    let mut atom = None;
    let late = client.execute_leased(&new, "a", "k", &[], |exchange| {
        atom = Some(exchange.atom());
        // The lease is taken over while the work runs.
        store.release_lease(new.clone()).expect("release");
        store.acquire_lease(run, "w3", LONG).expect("w3");
        Ok(output("late"))
    });
    let Err(Error::OutputNotRecorded { output: kept, source, .. }) = late else { panic!("refused: {late:?}") };
    assert!(matches!(*source, Error::StaleLease { .. }));
    assert_eq!(*kept, output("late"), "the output comes back");
    let atom = store.atom(atom.expect("begun")).expect("atom");
    assert_eq!((atom.status, atom.output), (AtomStatus::Running, None), "nothing of its end is recorded");
}

#[test]
fn clients_beyond_the_limit_are_refused_with_a_typed_error() {
    let (_dir, _store, server) = served();
    let clients: Vec<Client> =
        (0..SERVE_CLIENTS_MAX).map(|_| Client::connect(server.path()).expect("within the limit")).collect();
    assert!(matches!(Client::connect(server.path()), Err(Error::LimitExceeded { .. })));
    drop(clients);
    // The freed threads end on their own; a client is served again once one has.
    let mut served_again = false;
    for _ in 0..1000 {
        match Client::connect(server.path()) {
            Ok(_) => {
                served_again = true;
                break;
            }
            Err(Error::LimitExceeded { .. }) => std::thread::sleep(Duration::from_millis(5)),
            Err(error) => panic!("connect: {error}"),
        }
    }
    assert!(served_again);
}

#[test]
fn a_stopped_server_disconnects_its_clients_and_removes_its_socket() {
    let (dir, store, server) = served();
    let mut client = Client::connect(server.path()).expect("connect");
    let run = client.create_run(RunSpec::new("r")).expect("run");
    server.stop();
    assert!(!dir.path().join(SOCKET_FILE_NAME).exists());
    assert!(matches!(client.lease_of(run), Err(Error::Disconnected { .. })));
    assert!(matches!(client.lease_of(run), Err(Error::Disconnected { .. })), "and stays so");
    assert!(matches!(Client::connect(dir.path().join(SOCKET_FILE_NAME)), Err(Error::Io { .. })));
    let server = store.serve(None).expect("serve again");
    let mut client = Client::connect(server.path()).expect("reconnect");
    assert_eq!(client.run_id("r").expect("run_id"), Some(run));
}

#[test]
fn a_stale_socket_file_is_replaced_and_bad_paths_are_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(Store::open(dir.path()).expect("open"));
    let path = dir.path().join("other.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).expect("a dead server's socket"));
    assert!(path.exists());
    let server = store.serve(Some(&path)).expect("replaces the stale socket");
    assert_serving(&server);
    drop(server);
    let long = dir.path().join("x".repeat(SERVE_SOCKET_PATH_BYTES_MAX));
    assert!(matches!(store.serve(Some(&long)), Err(Error::InvalidArgument { .. })));
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"not a socket").expect("write");
    assert!(matches!(store.serve(Some(&file)), Err(Error::InvalidArgument { .. })));
    assert_eq!(std::fs::read(&file).expect("read"), b"not a socket", "left as it was");
}

#[test]
fn every_response_round_trips_and_no_prefix_of_one_decodes() {
    let lease = Lease { run: RunId::from_raw(3), holder: "w".into(), token: 9, expires_at_unix_us: 77 };
    let message =
        crate::channel::Message { id: AtomId::from_raw(8), sender: AtomId::from_raw(7), payload: b"m".to_vec() };
    let received = crate::channel::Received {
        run: RunId::from_raw(3),
        channel: "c".into(),
        consumer: "x".into(),
        messages: vec![message.clone()],
    };
    let executed = crate::store::Executed {
        atom: AtomId::from_raw(4),
        output: output("o"),
        replayed: true,
        delta_reclaimed: false,
    };
    let atom = crate::store::Atom {
        id: AtomId::from_raw(4),
        run: RunId::from_raw(3),
        agent: "a".into(),
        key: "k".into(),
        parents: vec![AtomId::from_raw(1)],
        idempotency_key: String::new(),
        status: AtomStatus::Failed { retryable: true },
        started_at_unix_us: 5,
        ended_at_unix_us: Some(6),
        output: None,
        error: Some("no".into()),
        started_lsn: crate::log::Lsn::new(12),
        abandoned: false,
        delta_reclaimed: true,
    };
    let list =
        crate::shared_state::Versioned { version: 2, value: StateValue::List(vec![b"a".to_vec(), b"b".to_vec()]) };
    let responses = [
        Response::Hello { version: PROTOCOL_VERSION },
        Response::Done,
        Response::Run(RunId::from_raw(3)),
        Response::MaybeRun(Some(RunId::from_raw(3))),
        Response::Lease(lease.clone()),
        Response::MaybeLease(None),
        Response::MaybeLease(Some(lease)),
        Response::AtomId(AtomId::from_raw(4)),
        Response::Atom(Box::new(atom)),
        Response::State(Some(list)),
        Response::State(None),
        Response::Messages(vec![message]),
        Response::Begun { atom: AtomId::from_raw(4) },
        Response::Exchanged(Box::new(Exchanged { executed, received: vec![received] })),
        Response::Error(Error::StaleLease { run: 1, token: 2, current: 3 }),
    ];
    for response in responses {
        let frame = response.encode().expect("encode");
        let message = &frame[4..];
        let decoded = Response::decode(message).expect("decode");
        assert_eq!(format!("{decoded:?}"), format!("{response:?}"));
        for cut in 0..message.len() {
            assert!(
                matches!(Response::decode(&message[..cut]), Err(Error::Protocol { .. })),
                "{response:?} cut at {cut}"
            );
        }
    }
}
