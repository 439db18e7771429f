//! [`Client`]: a process's connection to a store's [`Server`](crate::serve::Server). Its
//! methods mirror the [`Store`](crate::Store)'s; each is one request frame and one response
//! frame, and a leased atom's work runs here, its exchange forwarded by [`RemoteExchange`].

use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::channel::{Exchanged, Message};
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::serve::frame::{Frame, protocol, read_frame, write_frame};
use crate::serve::protocol::{PROTOCOL_VERSION, Request, Response, disconnected};
use crate::serve::server::check_receive_max;
use crate::shared_state::{StateKey, Versioned};
use crate::store::{Atom, AtomFailure, AtomId, AtomOutput, RunId, RunSpec};

/// A connection to a store's server: create runs, take leases and execute leased atoms in a
/// store another process holds open. One caller at a time (`&mut self`); a process opens as
/// many as it has workers.
///
/// Once the server stops or dies every call returns [`Error::Disconnected`]; connect again
/// (to a new server of the store) with [`Client::connect`].
pub struct Client {
    stream: UnixStream,
    path: PathBuf,
    /// A call broke the connection: every later call is [`Error::Disconnected`].
    broken: bool,
    /// A leased atom's work is running (or unwound before its atom's end was sent): only its
    /// exchange's calls may use the connection.
    in_atom: bool,
}

impl Client {
    /// Connects to the server at `path` (by default `<store dir>/continuum.sock`) and greets
    /// it.
    ///
    /// ```no_run
    /// # fn main() -> continuum::Result<()> {
    /// use std::time::Duration;
    /// use continuum::serve::Client;
    /// use continuum::{AtomOutput, RunSpec};
    ///
    /// let mut client = Client::connect("/var/lib/agents/continuum.sock")?;
    /// let run = client.create_run(RunSpec::new("trip-42"))?;
    /// let lease = client.acquire_lease(run, "worker-1", Duration::from_secs(30))?;
    /// let step = client.execute_leased(&lease, "planner", "step-1", &[], |exchange| {
    ///     exchange.add("steps", 1)?; // forwarded to the server, applied when the atom completes
    ///     Ok(AtomOutput { result: b"fly on tuesday".to_vec(), ..AtomOutput::default() })
    /// })?;
    /// assert_eq!(step.executed.output.result, b"fly on tuesday");
    /// client.release_lease(lease)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::Io`] when nothing serves at `path`; [`Error::ProtocolVersion`] when the server
    /// speaks another version; [`Error::LimitExceeded`] when it serves
    /// [`SERVE_CLIENTS_MAX`](crate::limits::SERVE_CLIENTS_MAX) clients already.
    pub fn connect(path: impl AsRef<Path>) -> Result<Client> {
        let path = path.as_ref().to_path_buf();
        let stream = UnixStream::connect(&path).map_err(|error| Error::io("connect to the socket", &path, error))?;
        let mut client = Client { stream, path, broken: false, in_atom: false };
        match client.call(&Request::Hello { version: PROTOCOL_VERSION })? {
            Response::Hello { version: PROTOCOL_VERSION } => Ok(client),
            Response::Hello { version } => Err(Error::ProtocolVersion { client: PROTOCOL_VERSION, server: version }),
            other => Err(client.unexpected(&other)),
        }
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// [`Store::create_run`](crate::Store::create_run) on the server's store.
    ///
    /// # Errors
    /// As `Store::create_run`; [`Error::InvalidArgument`] for a spec with a snapshot policy
    /// (the protocol does not carry one); [`Error::Disconnected`].
    pub fn create_run(&mut self, spec: RunSpec) -> Result<RunId> {
        if spec.snapshot_policy.is_some() {
            let reason = "a run's snapshot policy is not carried over the socket".into();
            return Err(Error::InvalidArgument { reason });
        }
        let RunSpec { name, pipeline, pipeline_version, environment, .. } = spec;
        match self.call(&Request::CreateRun { name, pipeline, pipeline_version, environment })? {
            Response::Run(run) => Ok(run),
            other => Err(self.unexpected(&other)),
        }
    }

    /// [`Store::run_id`](crate::Store::run_id) on the server's store.
    ///
    /// # Errors
    /// [`Error::Disconnected`].
    pub fn run_id(&mut self, name: &str) -> Result<Option<RunId>> {
        match self.call(&Request::RunId { name: name.to_owned() })? {
            Response::MaybeRun(run) => Ok(run),
            other => Err(self.unexpected(&other)),
        }
    }

    /// [`Store::acquire_lease`](crate::Store::acquire_lease) on the server's store.
    ///
    /// # Errors
    /// As `Store::acquire_lease` ([`Error::LeaseHeld`]); [`Error::Disconnected`].
    pub fn acquire_lease(&mut self, run: RunId, holder: &str, ttl: Duration) -> Result<Lease> {
        let request = Request::AcquireLease { run, holder: holder.to_owned(), ttl_us: micros(ttl) };
        self.call_lease(&request)
    }

    /// [`Store::renew_lease`](crate::Store::renew_lease) on the server's store.
    ///
    /// # Errors
    /// As `Store::renew_lease` ([`Error::StaleLease`]); [`Error::Disconnected`].
    pub fn renew_lease(&mut self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.call_lease(&Request::RenewLease { lease: lease.clone(), ttl_us: micros(ttl) })
    }

    /// [`Store::release_lease`](crate::Store::release_lease) on the server's store.
    ///
    /// # Errors
    /// As `Store::release_lease` ([`Error::StaleLease`]); [`Error::Disconnected`].
    pub fn release_lease(&mut self, lease: Lease) -> Result<()> {
        match self.call(&Request::ReleaseLease { lease })? {
            Response::Done => Ok(()),
            other => Err(self.unexpected(&other)),
        }
    }

    /// [`Store::lease_of`](crate::Store::lease_of) on the server's store.
    ///
    /// # Errors
    /// As `Store::lease_of`; [`Error::Disconnected`].
    pub fn lease_of(&mut self, run: RunId) -> Result<Option<Lease>> {
        match self.call(&Request::LeaseOf { run })? {
            Response::MaybeLease(lease) => Ok(lease),
            other => Err(self.unexpected(&other)),
        }
    }

    /// [`Store::record_atom`](crate::Store::record_atom) (without an idempotency key) on the
    /// server's store: refused with [`Error::LeaseHeld`] in a run with a live lease.
    ///
    /// # Errors
    /// As `Store::record_atom`; [`Error::Disconnected`].
    pub fn record_atom(
        &mut self,
        run: RunId,
        agent: &str,
        key: &str,
        parents: &[AtomId],
        output: &AtomOutput,
    ) -> Result<AtomId> {
        let (agent, key) = (agent.to_owned(), key.to_owned());
        let request = Request::RecordAtom { run, agent, key, parents: parents.to_vec(), output: output.clone() };
        match self.call(&request)? {
            Response::AtomId(atom) => Ok(atom),
            other => Err(self.unexpected(&other)),
        }
    }

    /// [`Store::atom`](crate::Store::atom) on the server's store.
    ///
    /// # Errors
    /// As `Store::atom` ([`Error::UnknownAtom`]); [`Error::Disconnected`].
    pub fn atom(&mut self, atom: AtomId) -> Result<Atom> {
        match self.call(&Request::Atom { atom })? {
            Response::Atom(atom) => Ok(*atom),
            other => Err(self.unexpected(&other)),
        }
    }

    /// [`Store::read_state`](crate::Store::read_state) on the server's store.
    ///
    /// # Errors
    /// As `Store::read_state`; [`Error::Disconnected`].
    pub fn read_state(&mut self, run: RunId, key: impl Into<StateKey>) -> Result<Option<Versioned>> {
        match self.call(&Request::ReadState { run, key: key.into() })? {
            Response::State(state) => Ok(state),
            other => Err(self.unexpected(&other)),
        }
    }

    /// [`Store::execute_leased`](crate::Store::execute_leased) with `work` run here: the
    /// server begins the atom under `lease`, `work` runs in this process with a
    /// [`RemoteExchange`] whose sends, receives and state reads and writes the server applies
    /// to the atom's exchange, and the server ends the atom under the lease's fence. A
    /// completed atom replays without calling `work`.
    ///
    /// If this process dies or the connection breaks inside the atom, the server fails it
    /// retryably: none of its output, messages or state writes is recorded, and the run's next
    /// holder executes it again.
    ///
    /// # Errors
    /// As `Store::execute_leased`: [`Error::StaleLease`] (inside
    /// [`Error::OutputNotRecorded`] once `work` ran), [`Error::AtomFailed`] when `work` failed;
    /// [`Error::Disconnected`].
    pub fn execute_leased(
        &mut self,
        lease: &Lease,
        agent: &str,
        key: &str,
        parents: &[AtomId],
        work: impl FnOnce(&mut RemoteExchange<'_>) -> std::result::Result<AtomOutput, AtomFailure>,
    ) -> Result<Exchanged> {
        let (agent, key) = (agent.to_owned(), key.to_owned());
        let request = Request::ExecuteLeased { lease: lease.clone(), agent, key, parents: parents.to_vec() };
        let atom = match self.call(&request)? {
            Response::Exchanged(exchanged) => return Ok(*exchanged),
            Response::Begun { atom } => atom,
            other => return Err(self.unexpected(&other)),
        };
        // Until the atom's end is sent, the connection is inside the atom: a `work` that
        // unwinds leaves it so, the next call breaks it off, and the server fails the atom.
        self.in_atom = true;
        let outcome = work(&mut RemoteExchange { client: self, atom });
        self.in_atom = false;
        let end = match outcome {
            Ok(output) => Request::Complete { output },
            Err(failure) => Request::Fail { failure },
        };
        match self.call(&end)? {
            Response::Exchanged(exchanged) => Ok(*exchanged),
            other => Err(self.unexpected(&other)),
        }
    }

    fn call_lease(&mut self, request: &Request) -> Result<Lease> {
        match self.call(request)? {
            Response::Lease(lease) => Ok(lease),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Sends `request` and reads its response, outside an atom's work.
    fn call(&mut self, request: &Request) -> Result<Response> {
        if self.in_atom {
            self.break_off();
        }
        self.call_inside(request)
    }

    /// Sends `request` and reads its response; an error response is returned as the error.
    fn call_inside(&mut self, request: &Request) -> Result<Response> {
        let frame = request.encode()?;
        if self.broken {
            return Err(disconnected(&self.path));
        }
        let response = write_frame(&mut self.stream, &frame).and_then(|()| read_frame(&mut self.stream));
        let response = match response {
            Ok(Frame::Message(message)) => Response::decode(&message),
            Ok(Frame::Closed) | Err(Error::Io { .. }) => Err(disconnected(&self.path)),
            Err(error) => Err(error),
        };
        match response {
            Ok(Response::Error(error)) => Err(error),
            Ok(response) => Ok(response),
            Err(error) => {
                self.break_off();
                Err(error)
            }
        }
    }

    /// [`Error::Protocol`] for a response that does not answer the request; the connection
    /// is broken off.
    fn unexpected(&mut self, response: &Response) -> Error {
        self.break_off();
        protocol(format!("an unexpected response: {}", response.name()))
    }

    fn break_off(&mut self) {
        self.broken = true;
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// A leased atom's exchange in a client process ([`Client::execute_leased`]): each call is
/// forwarded to the server, which applies it to the atom's
/// [`Exchange`](crate::channel::Exchange); sends and writes are recorded when the atom
/// completes, and never if it does not.
pub struct RemoteExchange<'a> {
    client: &'a mut Client,
    atom: AtomId,
}

impl RemoteExchange<'_> {
    /// The atom this exchange belongs to.
    pub fn atom(&self) -> AtomId {
        self.atom
    }

    /// [`Exchange::send`](crate::channel::Exchange::send).
    ///
    /// # Errors
    /// As `Exchange::send`; [`Error::Disconnected`].
    pub fn send(&mut self, channel: &str, payload: impl Into<Vec<u8>>) -> Result<()> {
        self.call_done(&Request::Send { channel: channel.to_owned(), payload: payload.into() })
    }

    /// [`Exchange::receive`](crate::channel::Exchange::receive), at most
    /// [`SERVE_RECEIVE_MESSAGES_MAX`](crate::limits::SERVE_RECEIVE_MESSAGES_MAX) messages.
    ///
    /// # Errors
    /// As `Exchange::receive`; [`Error::InvalidArgument`] for `max` above that bound;
    /// [`Error::Disconnected`].
    pub fn receive(&mut self, channel: &str, consumer: &str, max: usize) -> Result<Vec<Message>> {
        let max = check_receive_max(u32::try_from(max).unwrap_or(u32::MAX))?;
        let max = u32::try_from(max).expect("a checked receive's max fits a u32");
        let request = Request::Receive { channel: channel.to_owned(), consumer: consumer.to_owned(), max };
        match self.forward(&request)? {
            Response::Messages(messages) => Ok(messages),
            other => Err(self.client.unexpected(&other)),
        }
    }

    /// [`Exchange::read`](crate::channel::Exchange::read).
    ///
    /// # Errors
    /// As `Exchange::read`; [`Error::Disconnected`].
    pub fn read(&mut self, key: impl Into<StateKey>) -> Result<Option<Versioned>> {
        match self.forward(&Request::Read { key: key.into() })? {
            Response::State(state) => Ok(state),
            other => Err(self.client.unexpected(&other)),
        }
    }

    /// [`Exchange::put`](crate::channel::Exchange::put).
    ///
    /// # Errors
    /// As `Exchange::put`; [`Error::Disconnected`].
    pub fn put(&mut self, key: impl Into<StateKey>, value: impl Into<Vec<u8>>) -> Result<()> {
        self.call_done(&Request::Put { key: key.into(), value: value.into() })
    }

    /// [`Exchange::add`](crate::channel::Exchange::add).
    ///
    /// # Errors
    /// As `Exchange::add`; [`Error::Disconnected`].
    pub fn add(&mut self, key: impl Into<StateKey>, amount: i64) -> Result<()> {
        self.call_done(&Request::Add { key: key.into(), amount })
    }

    /// [`Exchange::append`](crate::channel::Exchange::append).
    ///
    /// # Errors
    /// As `Exchange::append`; [`Error::Disconnected`].
    pub fn append(&mut self, key: impl Into<StateKey>, item: impl Into<Vec<u8>>) -> Result<()> {
        self.call_done(&Request::Append { key: key.into(), item: item.into() })
    }

    fn call_done(&mut self, request: &Request) -> Result<()> {
        match self.forward(request)? {
            Response::Done => Ok(()),
            other => Err(self.client.unexpected(&other)),
        }
    }

    /// One call inside the atom.
    fn forward(&mut self, request: &Request) -> Result<Response> {
        self.client.call_inside(request)
    }
}

/// `ttl` in microseconds (the server refuses one out of a lease's bounds).
fn micros(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX)
}
