//! The messages on a store's socket and their encoding (`docs/FORMAT.md`, "Local socket
//! protocol"): a client sends one [`Request`] and reads one [`Response`]; inside a leased atom
//! the server speaks first ([`Response::Begun`]) and the client's exchange requests follow
//! until it completes or fails the atom. Pure byte code.

use std::collections::BTreeMap;
use std::path::PathBuf;

use prost::Message as _;

use crate::channel::{Exchanged, Message, Received};
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::log::Lsn;
use crate::serve::frame::{Reader, Writer, protocol};
use crate::shared_state::{StateKey, StateValue, Versioned};
use crate::store::{Atom, AtomFailure, AtomId, AtomOutput, AtomStatus, Executed, RunId};

/// The protocol's version, in each side's hello: a client and a server of different versions
/// refuse each other.
pub const PROTOCOL_VERSION: u32 = 1;

/// What a client asks of the server, one frame each.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Request {
    /// The first message of a connection.
    Hello {
        version: u32,
    },
    CreateRun {
        name: String,
        pipeline: String,
        pipeline_version: String,
        environment: BTreeMap<String, String>,
    },
    RunId {
        name: String,
    },
    AcquireLease {
        run: RunId,
        holder: String,
        ttl_us: u64,
    },
    RenewLease {
        lease: Lease,
        ttl_us: u64,
    },
    ReleaseLease {
        lease: Lease,
    },
    LeaseOf {
        run: RunId,
    },
    RecordAtom {
        run: RunId,
        agent: String,
        key: String,
        parents: Vec<AtomId>,
        output: AtomOutput,
    },
    Atom {
        atom: AtomId,
    },
    ReadState {
        run: RunId,
        key: StateKey,
    },
    /// Begins (or replays) a leased atom: answered with [`Response::Begun`] or the outcome.
    ExecuteLeased {
        lease: Lease,
        agent: String,
        key: String,
        parents: Vec<AtomId>,
    },
    // Inside a leased atom, between `Begun` and its end.
    Send {
        channel: String,
        payload: Vec<u8>,
    },
    Receive {
        channel: String,
        consumer: String,
        max: u32,
    },
    Read {
        key: StateKey,
    },
    Put {
        key: StateKey,
        value: Vec<u8>,
    },
    Add {
        key: StateKey,
        amount: i64,
    },
    Append {
        key: StateKey,
        item: Vec<u8>,
    },
    Complete {
        output: AtomOutput,
    },
    Fail {
        failure: AtomFailure,
    },
}

/// What the server answers, one frame each.
#[derive(Debug)]
pub(crate) enum Response {
    Hello {
        version: u32,
    },
    Done,
    Run(RunId),
    MaybeRun(Option<RunId>),
    Lease(Lease),
    MaybeLease(Option<Lease>),
    AtomId(AtomId),
    Atom(Box<Atom>),
    State(Option<Versioned>),
    Messages(Vec<Message>),
    /// The leased atom began: the client runs its work now.
    Begun {
        atom: AtomId,
    },
    /// A leased atom's outcome: recorded now, or replayed.
    Exchanged(Box<Exchanged>),
    Error(Error),
}

mod tag {
    pub(super) const HELLO: u8 = 1;
    pub(super) const CREATE_RUN: u8 = 2;
    pub(super) const RUN_ID: u8 = 3;
    pub(super) const ACQUIRE_LEASE: u8 = 4;
    pub(super) const RENEW_LEASE: u8 = 5;
    pub(super) const RELEASE_LEASE: u8 = 6;
    pub(super) const LEASE_OF: u8 = 7;
    pub(super) const RECORD_ATOM: u8 = 8;
    pub(super) const ATOM: u8 = 9;
    pub(super) const READ_STATE: u8 = 10;
    pub(super) const EXECUTE_LEASED: u8 = 11;
    pub(super) const SEND: u8 = 20;
    pub(super) const RECEIVE: u8 = 21;
    pub(super) const READ: u8 = 22;
    pub(super) const PUT: u8 = 23;
    pub(super) const ADD: u8 = 24;
    pub(super) const APPEND: u8 = 25;
    pub(super) const COMPLETE: u8 = 26;
    pub(super) const FAIL: u8 = 27;

    pub(super) const R_HELLO: u8 = 101;
    pub(super) const R_DONE: u8 = 102;
    pub(super) const R_RUN: u8 = 103;
    pub(super) const R_MAYBE_RUN: u8 = 104;
    pub(super) const R_LEASE: u8 = 105;
    pub(super) const R_MAYBE_LEASE: u8 = 106;
    pub(super) const R_ATOM_ID: u8 = 107;
    pub(super) const R_ATOM: u8 = 108;
    pub(super) const R_STATE: u8 = 109;
    pub(super) const R_MESSAGES: u8 = 110;
    pub(super) const R_BEGUN: u8 = 111;
    pub(super) const R_EXCHANGED: u8 = 112;
    pub(super) const R_ERROR: u8 = 113;
}

impl Request {
    /// The request as one frame.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] above [`SERVE_FRAME_BYTES_MAX`](crate::limits::SERVE_FRAME_BYTES_MAX).
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let mut w;
        match self {
            Request::Hello { version } => {
                w = Writer::new(tag::HELLO);
                w.u32(*version);
            }
            Request::CreateRun { name, pipeline, pipeline_version, environment } => {
                w = Writer::new(tag::CREATE_RUN);
                for field in [name, pipeline, pipeline_version] {
                    w.str(field);
                }
                w.count(environment.len());
                for (key, value) in environment {
                    w.str(key);
                    w.str(value);
                }
            }
            Request::RunId { name } => {
                w = Writer::new(tag::RUN_ID);
                w.str(name);
            }
            Request::AcquireLease { run, holder, ttl_us } => {
                w = Writer::new(tag::ACQUIRE_LEASE);
                w.u64(run.get());
                w.str(holder);
                w.u64(*ttl_us);
            }
            Request::RenewLease { lease, ttl_us } => {
                w = Writer::new(tag::RENEW_LEASE);
                put_lease(&mut w, lease);
                w.u64(*ttl_us);
            }
            Request::ReleaseLease { lease } => {
                w = Writer::new(tag::RELEASE_LEASE);
                put_lease(&mut w, lease);
            }
            Request::LeaseOf { run } => {
                w = Writer::new(tag::LEASE_OF);
                w.u64(run.get());
            }
            Request::RecordAtom { run, agent, key, parents, output } => {
                w = Writer::new(tag::RECORD_ATOM);
                w.u64(run.get());
                w.str(agent);
                w.str(key);
                put_atoms(&mut w, parents);
                put_output(&mut w, output);
            }
            Request::Atom { atom } => {
                w = Writer::new(tag::ATOM);
                w.u64(atom.get());
            }
            Request::ReadState { run, key } => {
                w = Writer::new(tag::READ_STATE);
                w.u64(run.get());
                put_key(&mut w, key);
            }
            Request::ExecuteLeased { lease, agent, key, parents } => {
                w = Writer::new(tag::EXECUTE_LEASED);
                put_lease(&mut w, lease);
                w.str(agent);
                w.str(key);
                put_atoms(&mut w, parents);
            }
            Request::Send { .. }
            | Request::Receive { .. }
            | Request::Read { .. }
            | Request::Put { .. }
            | Request::Add { .. }
            | Request::Append { .. }
            | Request::Complete { .. }
            | Request::Fail { .. } => w = self.encode_in_atom(),
        }
        w.finish()
    }

    /// The frame of a request made inside a leased atom, before its length is filled in.
    fn encode_in_atom(&self) -> Writer {
        match self {
            Request::Send { channel, payload } => {
                let mut w = Writer::new(tag::SEND);
                w.str(channel);
                w.bytes(payload);
                w
            }
            Request::Receive { channel, consumer, max } => {
                let mut w = Writer::new(tag::RECEIVE);
                w.str(channel);
                w.str(consumer);
                w.u32(*max);
                w
            }
            Request::Read { key } => {
                let mut w = Writer::new(tag::READ);
                put_key(&mut w, key);
                w
            }
            Request::Put { key, value } | Request::Append { key, item: value } => {
                let mut w = Writer::new(if matches!(self, Request::Put { .. }) { tag::PUT } else { tag::APPEND });
                put_key(&mut w, key);
                w.bytes(value);
                w
            }
            Request::Add { key, amount } => {
                let mut w = Writer::new(tag::ADD);
                put_key(&mut w, key);
                w.i64(*amount);
                w
            }
            Request::Complete { output } => {
                let mut w = Writer::new(tag::COMPLETE);
                put_output(&mut w, output);
                w
            }
            Request::Fail { failure } => {
                let mut w = Writer::new(tag::FAIL);
                w.str(&failure.message);
                w.bool(failure.retryable);
                w
            }
            _ => unreachable!("only a request inside an atom is encoded here"),
        }
    }

    /// Decodes a request from a frame's message.
    ///
    /// # Errors
    /// [`Error::Protocol`] for bytes that are no request.
    pub(crate) fn decode(message: &[u8]) -> Result<Self> {
        let mut r = Reader::new(message);
        let request = match r.u8()? {
            tag::HELLO => Request::Hello { version: r.u32()? },
            tag::CREATE_RUN => {
                let (name, pipeline, pipeline_version) = (r.string()?, r.string()?, r.string()?);
                let mut environment = BTreeMap::new();
                for _ in 0..r.count(8)? {
                    environment.insert(r.string()?, r.string()?);
                }
                Request::CreateRun { name, pipeline, pipeline_version, environment }
            }
            tag::RUN_ID => Request::RunId { name: r.string()? },
            tag::ACQUIRE_LEASE => {
                Request::AcquireLease { run: RunId::from_raw(r.u64()?), holder: r.string()?, ttl_us: r.u64()? }
            }
            tag::RENEW_LEASE => Request::RenewLease { lease: get_lease(&mut r)?, ttl_us: r.u64()? },
            tag::RELEASE_LEASE => Request::ReleaseLease { lease: get_lease(&mut r)? },
            tag::LEASE_OF => Request::LeaseOf { run: RunId::from_raw(r.u64()?) },
            tag::RECORD_ATOM => Request::RecordAtom {
                run: RunId::from_raw(r.u64()?),
                agent: r.string()?,
                key: r.string()?,
                parents: get_atoms(&mut r)?,
                output: get_output(&mut r)?,
            },
            tag::ATOM => Request::Atom { atom: AtomId::from_raw(r.u64()?) },
            tag::READ_STATE => Request::ReadState { run: RunId::from_raw(r.u64()?), key: get_key(&mut r)? },
            tag::EXECUTE_LEASED => Request::ExecuteLeased {
                lease: get_lease(&mut r)?,
                agent: r.string()?,
                key: r.string()?,
                parents: get_atoms(&mut r)?,
            },
            tag::SEND => Request::Send { channel: r.string()?, payload: r.bytes()? },
            tag::RECEIVE => Request::Receive { channel: r.string()?, consumer: r.string()?, max: r.u32()? },
            tag::READ => Request::Read { key: get_key(&mut r)? },
            tag::PUT => Request::Put { key: get_key(&mut r)?, value: r.bytes()? },
            tag::ADD => Request::Add { key: get_key(&mut r)?, amount: r.i64()? },
            tag::APPEND => Request::Append { key: get_key(&mut r)?, item: r.bytes()? },
            tag::COMPLETE => Request::Complete { output: get_output(&mut r)? },
            tag::FAIL => Request::Fail { failure: AtomFailure { message: r.string()?, retryable: r.bool()? } },
            other => return Err(protocol(format!("{other} is no request's tag"))),
        };
        r.end()?;
        Ok(request)
    }
}

impl Response {
    /// The response as one frame.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] above [`SERVE_FRAME_BYTES_MAX`](crate::limits::SERVE_FRAME_BYTES_MAX).
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let mut w;
        match self {
            Response::Hello { version } => {
                w = Writer::new(tag::R_HELLO);
                w.u32(*version);
            }
            Response::Done => w = Writer::new(tag::R_DONE),
            Response::Run(run) => {
                w = Writer::new(tag::R_RUN);
                w.u64(run.get());
            }
            Response::MaybeRun(run) => {
                w = Writer::new(tag::R_MAYBE_RUN);
                put_option(&mut w, run.as_ref(), |w, run| w.u64(run.get()));
            }
            Response::Lease(lease) => {
                w = Writer::new(tag::R_LEASE);
                put_lease(&mut w, lease);
            }
            Response::MaybeLease(lease) => {
                w = Writer::new(tag::R_MAYBE_LEASE);
                put_option(&mut w, lease.as_ref(), put_lease);
            }
            Response::AtomId(atom) => {
                w = Writer::new(tag::R_ATOM_ID);
                w.u64(atom.get());
            }
            Response::Atom(atom) => {
                w = Writer::new(tag::R_ATOM);
                put_atom(&mut w, atom);
            }
            Response::State(state) => {
                w = Writer::new(tag::R_STATE);
                put_option(&mut w, state.as_ref(), put_versioned);
            }
            Response::Messages(messages) => {
                w = Writer::new(tag::R_MESSAGES);
                put_messages(&mut w, messages);
            }
            Response::Begun { atom } => {
                w = Writer::new(tag::R_BEGUN);
                w.u64(atom.get());
            }
            Response::Exchanged(exchanged) => {
                w = Writer::new(tag::R_EXCHANGED);
                put_exchanged(&mut w, exchanged);
            }
            Response::Error(error) => {
                w = Writer::new(tag::R_ERROR);
                put_error(&mut w, error, true);
            }
        }
        w.finish()
    }

    /// The response's name, for an error that says which came out of turn.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Response::Hello { .. } => "hello",
            Response::Done => "done",
            Response::Run(_) => "run",
            Response::MaybeRun(_) => "run id",
            Response::Lease(_) => "lease",
            Response::MaybeLease(_) => "lease of",
            Response::AtomId(_) => "atom id",
            Response::Atom(_) => "atom",
            Response::State(_) => "state",
            Response::Messages(_) => "messages",
            Response::Begun { .. } => "begun",
            Response::Exchanged(_) => "exchanged",
            Response::Error(_) => "error",
        }
    }

    /// Decodes a response from a frame's message.
    ///
    /// # Errors
    /// [`Error::Protocol`] for bytes that are no response.
    pub(crate) fn decode(message: &[u8]) -> Result<Self> {
        let mut r = Reader::new(message);
        let response = match r.u8()? {
            tag::R_HELLO => Response::Hello { version: r.u32()? },
            tag::R_DONE => Response::Done,
            tag::R_RUN => Response::Run(RunId::from_raw(r.u64()?)),
            tag::R_MAYBE_RUN => Response::MaybeRun(get_option(&mut r, |r| Ok(RunId::from_raw(r.u64()?)))?),
            tag::R_LEASE => Response::Lease(get_lease(&mut r)?),
            tag::R_MAYBE_LEASE => Response::MaybeLease(get_option(&mut r, get_lease)?),
            tag::R_ATOM_ID => Response::AtomId(AtomId::from_raw(r.u64()?)),
            tag::R_ATOM => Response::Atom(Box::new(get_atom(&mut r)?)),
            tag::R_STATE => Response::State(get_option(&mut r, get_versioned)?),
            tag::R_MESSAGES => Response::Messages(get_messages(&mut r)?),
            tag::R_BEGUN => Response::Begun { atom: AtomId::from_raw(r.u64()?) },
            tag::R_EXCHANGED => Response::Exchanged(Box::new(get_exchanged(&mut r)?)),
            tag::R_ERROR => Response::Error(get_error(&mut r, true)?),
            other => return Err(protocol(format!("{other} is no response's tag"))),
        };
        r.end()?;
        Ok(response)
    }
}

fn put_option<T: ?Sized>(w: &mut Writer, value: Option<&T>, put: impl FnOnce(&mut Writer, &T)) {
    w.bool(value.is_some());
    if let Some(value) = value {
        put(w, value);
    }
}

fn get_option<T>(r: &mut Reader<'_>, get: impl FnOnce(&mut Reader<'_>) -> Result<T>) -> Result<Option<T>> {
    match r.bool()? {
        true => get(r).map(Some),
        false => Ok(None),
    }
}

fn put_lease(w: &mut Writer, lease: &Lease) {
    w.u64(lease.run.get());
    w.str(&lease.holder);
    w.u64(lease.token);
    w.u64(lease.expires_at_unix_us);
}

fn get_lease(r: &mut Reader<'_>) -> Result<Lease> {
    Ok(Lease { run: RunId::from_raw(r.u64()?), holder: r.string()?, token: r.u64()?, expires_at_unix_us: r.u64()? })
}

fn put_atoms(w: &mut Writer, atoms: &[AtomId]) {
    w.count(atoms.len());
    for atom in atoms {
        w.u64(atom.get());
    }
}

fn get_atoms(r: &mut Reader<'_>) -> Result<Vec<AtomId>> {
    (0..r.count(8)?).map(|_| Ok(AtomId::from_raw(r.u64()?))).collect()
}

fn put_output(w: &mut Writer, output: &AtomOutput) {
    w.bytes(&output.delta.encode_to_vec());
    w.bytes(&output.result);
}

fn get_output(r: &mut Reader<'_>) -> Result<AtomOutput> {
    let delta = r.bytes()?;
    let delta = crate::Delta::decode(delta.as_slice()).map_err(|_| protocol("an atom's delta does not decode"))?;
    Ok(AtomOutput { delta, result: r.bytes()? })
}

fn put_key(w: &mut Writer, key: &StateKey) {
    w.bool(key.is_store_wide());
    w.str(key.name());
}

fn get_key(r: &mut Reader<'_>) -> Result<StateKey> {
    let store_wide = r.bool()?;
    let name = r.string()?;
    Ok(if store_wide { StateKey::store(name) } else { StateKey::run(name) })
}

fn put_versioned(w: &mut Writer, versioned: &Versioned) {
    w.u64(versioned.version);
    match &versioned.value {
        StateValue::Bytes(bytes) => {
            w.u8(0);
            w.bytes(bytes);
        }
        StateValue::Counter(total) => {
            w.u8(1);
            w.i64(*total);
        }
        StateValue::List(items) => {
            w.u8(2);
            w.count(items.len());
            for item in items {
                w.bytes(item);
            }
        }
    }
}

fn get_versioned(r: &mut Reader<'_>) -> Result<Versioned> {
    let version = r.u64()?;
    let value = match r.u8()? {
        0 => StateValue::Bytes(r.bytes()?),
        1 => StateValue::Counter(r.i64()?),
        2 => StateValue::List((0..r.count(4)?).map(|_| r.bytes()).collect::<Result<_>>()?),
        other => return Err(protocol(format!("{other} is no state value's kind"))),
    };
    Ok(Versioned { version, value })
}

fn put_messages(w: &mut Writer, messages: &[Message]) {
    w.count(messages.len());
    for message in messages {
        w.u64(message.id.get());
        w.u64(message.sender.get());
        w.bytes(&message.payload);
    }
}

fn get_messages(r: &mut Reader<'_>) -> Result<Vec<Message>> {
    (0..r.count(20)?)
        .map(|_| {
            let (id, sender) = (AtomId::from_raw(r.u64()?), AtomId::from_raw(r.u64()?));
            Ok(Message { id, sender, payload: r.bytes()? })
        })
        .collect()
}

fn put_exchanged(w: &mut Writer, exchanged: &Exchanged) {
    let executed = &exchanged.executed;
    w.u64(executed.atom.get());
    put_output(w, &executed.output);
    w.bool(executed.replayed);
    w.bool(executed.delta_reclaimed);
    w.count(exchanged.received.len());
    for received in &exchanged.received {
        w.u64(received.run.get());
        w.str(&received.channel);
        w.str(&received.consumer);
        put_messages(w, &received.messages);
    }
}

fn get_exchanged(r: &mut Reader<'_>) -> Result<Exchanged> {
    let atom = AtomId::from_raw(r.u64()?);
    let executed = Executed { atom, output: get_output(r)?, replayed: r.bool()?, delta_reclaimed: r.bool()? };
    let received = (0..r.count(20)?)
        .map(|_| {
            let run = RunId::from_raw(r.u64()?);
            Ok(Received { run, channel: r.string()?, consumer: r.string()?, messages: get_messages(r)? })
        })
        .collect::<Result<_>>()?;
    Ok(Exchanged { executed, received })
}

fn put_atom(w: &mut Writer, atom: &Atom) {
    w.u64(atom.id.get());
    w.u64(atom.run.get());
    w.str(&atom.agent);
    w.str(&atom.key);
    put_atoms(w, &atom.parents);
    w.str(&atom.idempotency_key);
    match atom.status {
        AtomStatus::Running => w.u8(0),
        AtomStatus::Completed => w.u8(1),
        AtomStatus::Failed { retryable } => w.u8(2 + u8::from(retryable)),
    }
    w.u64(atom.started_at_unix_us);
    put_option(w, atom.ended_at_unix_us.as_ref(), |w, at| w.u64(*at));
    put_option(w, atom.output.as_ref(), put_output);
    put_option(w, atom.error.as_deref(), Writer::str);
    w.u64(atom.started_lsn.get());
    w.bool(atom.abandoned);
    w.bool(atom.delta_reclaimed);
}

fn get_atom(r: &mut Reader<'_>) -> Result<Atom> {
    let (id, run) = (AtomId::from_raw(r.u64()?), RunId::from_raw(r.u64()?));
    let (agent, key, parents, idempotency_key) = (r.string()?, r.string()?, get_atoms(r)?, r.string()?);
    let status = match r.u8()? {
        0 => AtomStatus::Running,
        1 => AtomStatus::Completed,
        2 => AtomStatus::Failed { retryable: false },
        3 => AtomStatus::Failed { retryable: true },
        other => return Err(protocol(format!("{other} is no atom status"))),
    };
    Ok(Atom {
        id,
        run,
        agent,
        key,
        parents,
        idempotency_key,
        status,
        started_at_unix_us: r.u64()?,
        ended_at_unix_us: get_option(r, |r| r.u64())?,
        output: get_option(r, get_output)?,
        error: get_option(r, |r| r.string())?,
        started_lsn: Lsn::new(r.u64()?),
        abandoned: r.bool()?,
        delta_reclaimed: r.bool()?,
    })
}

mod error_tag {
    pub(super) const REMOTE: u8 = 0;
    pub(super) const LEASE_HELD: u8 = 1;
    pub(super) const STALE_LEASE: u8 = 2;
    pub(super) const CONFLICT: u8 = 3;
    pub(super) const CONSUMER_CONFLICT: u8 = 4;
    pub(super) const OUTPUT_NOT_RECORDED: u8 = 5;
    pub(super) const UNKNOWN_RUN: u8 = 6;
    pub(super) const UNKNOWN_ATOM: u8 = 7;
    pub(super) const INVALID_ARGUMENT: u8 = 8;
    pub(super) const LIMIT_EXCEEDED: u8 = 9;
    pub(super) const ATOM_FAILED: u8 = 10;
    pub(super) const ATOM_EXISTS: u8 = 11;
    pub(super) const RUN_FINISHED: u8 = 12;
    pub(super) const STOPPING: u8 = 13;
    pub(super) const PROTOCOL: u8 = 14;
    pub(super) const PROTOCOL_VERSION: u8 = 15;
}

/// Writes an error: the variants a caller handles with their facts, any other as
/// [`Error::Remote`] with its message. `nest` allows one [`Error::OutputNotRecorded`] level.
fn put_error(w: &mut Writer, error: &Error, nest: bool) {
    match error {
        Error::LeaseHeld { run, holder, token, expires_at_unix_us } => {
            w.u8(error_tag::LEASE_HELD);
            w.u64(*run);
            w.str(holder);
            w.u64(*token);
            w.u64(*expires_at_unix_us);
        }
        Error::StaleLease { run, token, current } => {
            w.u8(error_tag::STALE_LEASE);
            for value in [run, token, current] {
                w.u64(*value);
            }
        }
        Error::Conflict { key, expected, found } => {
            w.u8(error_tag::CONFLICT);
            w.str(key);
            w.u64(*expected);
            w.u64(*found);
        }
        Error::ConsumerConflict { channel, consumer, expected, found } => {
            w.u8(error_tag::CONSUMER_CONFLICT);
            w.str(channel);
            w.str(consumer);
            w.u64(*expected);
            w.u64(*found);
        }
        Error::OutputNotRecorded { atom, output, source } if nest => {
            w.u8(error_tag::OUTPUT_NOT_RECORDED);
            w.u64(*atom);
            put_output(w, output);
            put_error(w, source, false);
        }
        Error::UnknownRun { run } => {
            w.u8(error_tag::UNKNOWN_RUN);
            w.str(run);
        }
        Error::UnknownAtom { atom } | Error::AtomExists { atom } => {
            let is_unknown = matches!(error, Error::UnknownAtom { .. });
            w.u8(if is_unknown { error_tag::UNKNOWN_ATOM } else { error_tag::ATOM_EXISTS });
            w.u64(*atom);
        }
        Error::InvalidArgument { reason } | Error::Protocol { reason } => {
            let is_argument = matches!(error, Error::InvalidArgument { .. });
            w.u8(if is_argument { error_tag::INVALID_ARGUMENT } else { error_tag::PROTOCOL });
            w.str(reason);
        }
        Error::LimitExceeded { what, limit } => {
            w.u8(error_tag::LIMIT_EXCEEDED);
            w.str(what);
            w.u64(*limit);
        }
        Error::AtomFailed { atom, message, retryable } => {
            w.u8(error_tag::ATOM_FAILED);
            w.u64(*atom);
            w.str(message);
            w.bool(*retryable);
        }
        Error::RunFinished { run } | Error::Stopping { run } => {
            let is_finished = matches!(error, Error::RunFinished { .. });
            w.u8(if is_finished { error_tag::RUN_FINISHED } else { error_tag::STOPPING });
            w.u64(*run);
        }
        Error::ProtocolVersion { client, server } => {
            w.u8(error_tag::PROTOCOL_VERSION);
            w.u32(*client);
            w.u32(*server);
        }
        other => {
            w.u8(error_tag::REMOTE);
            w.str(&other.to_string());
        }
    }
}

fn get_error(r: &mut Reader<'_>, nest: bool) -> Result<Error> {
    Ok(match r.u8()? {
        error_tag::REMOTE => Error::Remote { message: r.string()? },
        error_tag::LEASE_HELD => {
            Error::LeaseHeld { run: r.u64()?, holder: r.string()?, token: r.u64()?, expires_at_unix_us: r.u64()? }
        }
        error_tag::STALE_LEASE => Error::StaleLease { run: r.u64()?, token: r.u64()?, current: r.u64()? },
        error_tag::CONFLICT => Error::Conflict { key: r.string()?, expected: r.u64()?, found: r.u64()? },
        error_tag::CONSUMER_CONFLICT => {
            Error::ConsumerConflict { channel: r.string()?, consumer: r.string()?, expected: r.u64()?, found: r.u64()? }
        }
        error_tag::OUTPUT_NOT_RECORDED if nest => Error::OutputNotRecorded {
            atom: r.u64()?,
            output: Box::new(get_output(r)?),
            source: Box::new(get_error(r, false)?),
        },
        error_tag::UNKNOWN_RUN => Error::UnknownRun { run: r.string()? },
        error_tag::UNKNOWN_ATOM => Error::UnknownAtom { atom: r.u64()? },
        error_tag::ATOM_EXISTS => Error::AtomExists { atom: r.u64()? },
        error_tag::INVALID_ARGUMENT => Error::InvalidArgument { reason: r.string()? },
        error_tag::PROTOCOL => Error::Protocol { reason: r.string()? },
        error_tag::LIMIT_EXCEEDED => Error::LimitExceeded { what: r.string()?, limit: r.u64()? },
        error_tag::ATOM_FAILED => Error::AtomFailed { atom: r.u64()?, message: r.string()?, retryable: r.bool()? },
        error_tag::RUN_FINISHED => Error::RunFinished { run: r.u64()? },
        error_tag::STOPPING => Error::Stopping { run: r.u64()? },
        error_tag::PROTOCOL_VERSION => Error::ProtocolVersion { client: r.u32()?, server: r.u32()? },
        other => return Err(protocol(format!("{other} is no error's tag"))),
    })
}

/// The [`Error::Disconnected`] of the socket at `path`.
pub(crate) fn disconnected(path: &std::path::Path) -> Error {
    Error::Disconnected { path: PathBuf::from(path) }
}
