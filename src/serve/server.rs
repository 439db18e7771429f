//! [`Server`]: the process that holds a store's single-writer lock serves other processes
//! over a Unix domain socket, one thread per client, each call through the [`Store`]'s own
//! API (so every lease grant and every fenced end passes the one process's check).

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::Shutdown;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use crate::channel::Exchange;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::limits::{SERVE_CLIENTS_MAX, SERVE_RECEIVE_MESSAGES_MAX, SERVE_SOCKET_PATH_BYTES_MAX};
use crate::serve::SOCKET_FILE_NAME;
use crate::serve::frame::{Frame, protocol, read_frame, write_frame};
use crate::serve::protocol::{PROTOCOL_VERSION, Request, Response};
use crate::store::{AtomFailure, AtomId, AtomOutput, RunSpec, Store};

/// A store's server: serves [`Client`](crate::serve::Client)s on a Unix domain socket until
/// [`Server::stop`] (or drop).
pub struct Server {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

/// What the accept thread and the connection threads share.
struct Shared {
    store: Arc<Store>,
    path: PathBuf,
    stopping: AtomicBool,
    connections: Mutex<Connections>,
}

/// The connections being served: a clone of each stream (to shut it down on stop) and the
/// threads serving them.
#[derive(Default)]
struct Connections {
    next: u64,
    open: HashMap<u64, UnixStream>,
    threads: Vec<JoinHandle<()>>,
}

impl Store {
    /// Serves this store to other processes on the Unix domain socket at `path` (`None`: the
    /// store directory's [`SOCKET_FILE_NAME`]): each [`Client`](crate::serve::Client) creates
    /// runs, takes leases and executes leased atoms through this process, which holds the
    /// store's lock. A socket file a killed server left at `path` is replaced (the store's lock
    /// proves no other server of this store lives).
    ///
    /// ```no_run
    /// # fn main() -> continuum::Result<()> {
    /// use std::sync::Arc;
    /// let store = Arc::new(continuum::Store::open("/var/lib/agents")?);
    /// let server = store.serve(None)?; // clients connect to /var/lib/agents/continuum.sock
    /// // ... until the process stops serving:
    /// server.stop();
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a path longer than
    /// [`SERVE_SOCKET_PATH_BYTES_MAX`] bytes, or one that holds a file other than a socket;
    /// [`Error::Io`] when the socket cannot be bound.
    pub fn serve(self: &Arc<Self>, path: Option<&Path>) -> Result<Server> {
        let path = path.map_or_else(|| self.shared.log.dir().join(SOCKET_FILE_NAME), Path::to_path_buf);
        let listener = bind(&path)?;
        let shared = Arc::new(Shared {
            store: Arc::clone(self),
            path,
            stopping: AtomicBool::new(false),
            connections: Mutex::new(Connections::default()),
        });
        let accepting = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("continuum-serve".into())
            .spawn(move || accept_loop(&accepting, &listener))
            .map_err(|error| Error::io("spawn the accept thread", &shared.path, error))?;
        Ok(Server { shared, accept: Some(accept) })
    }
}

impl Server {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Clients being served now.
    pub fn client_count(&self) -> usize {
        self.shared.connections.lock().open.len()
    }

    /// Stops serving: accepts no more clients, closes every connection (an atom a client has
    /// in flight fails retryably, nothing of its output recorded), joins the threads and
    /// removes the socket file.
    pub fn stop(mut self) {
        self.stop_serving();
    }

    fn stop_serving(&mut self) {
        let Some(accept) = self.accept.take() else { return };
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wakes the accept thread, blocked in `accept`, to see the flag. If the socket file was
        // removed meanwhile, nothing can reach the thread any more: it is left blocked, and
        // ends with the process.
        if UnixStream::connect(&self.shared.path).is_ok() {
            let _ = accept.join();
        }
        let threads = {
            let mut connections = self.shared.connections.lock();
            for stream in connections.open.values() {
                let _ = stream.shutdown(Shutdown::Both);
            }
            std::mem::take(&mut connections.threads)
        };
        for thread in threads {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.shared.path);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_serving();
    }
}

/// Binds the socket at `path`, replacing a socket file a dead server left there.
fn bind(path: &Path) -> Result<UnixListener> {
    let bytes = path.as_os_str().len();
    if bytes == 0 || bytes > SERVE_SOCKET_PATH_BYTES_MAX {
        let reason = format!("a socket path has 1 to {SERVE_SOCKET_PATH_BYTES_MAX} bytes, not {bytes}");
        return Err(Error::InvalidArgument { reason });
    }
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|error| Error::io("remove a stale socket", path, error))?;
        }
        Ok(_) => {
            let reason = format!("{} exists and is not a socket", path.display());
            return Err(Error::InvalidArgument { reason });
        }
        Err(error) if error.kind() == ErrorKind::NotFound => {}
        Err(error) => return Err(Error::io("inspect the socket path", path, error)),
    }
    UnixListener::bind(path).map_err(|error| Error::io("bind the socket", path, error))
}

fn accept_loop(shared: &Arc<Shared>, listener: &UnixListener) {
    for incoming in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        match incoming {
            Ok(stream) => admit(shared, stream),
            // Out of descriptors, say: the clients already served go on; try again shortly.
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Starts a thread serving `stream`, or refuses it past [`SERVE_CLIENTS_MAX`] clients.
fn admit(shared: &Arc<Shared>, mut stream: UnixStream) {
    let mut connections = shared.connections.lock();
    let (done, running): (Vec<_>, Vec<_>) = connections.threads.drain(..).partition(JoinHandle::is_finished);
    connections.threads = running;
    for thread in done {
        let _ = thread.join();
    }
    if connections.open.len() >= SERVE_CLIENTS_MAX {
        let limit = SERVE_CLIENTS_MAX as u64;
        let refusal = Error::LimitExceeded { what: "clients of the store's server".into(), limit };
        let _ = answer(&mut stream, Response::Error(refusal));
        return;
    }
    let Ok(kept) = stream.try_clone() else { return };
    let id = connections.next;
    connections.next += 1;
    connections.open.insert(id, kept);
    let serving = Arc::clone(shared);
    let spawned = std::thread::Builder::new().name(format!("continuum-serve-{id}")).spawn(move || {
        serve_connection(&serving.store, stream);
        serving.connections.lock().open.remove(&id);
    });
    match spawned {
        Ok(thread) => connections.threads.push(thread),
        Err(_) => drop(connections.open.remove(&id)),
    }
}

/// Writes one response; one too long for a frame goes as its [`Error::LimitExceeded`].
fn answer(stream: &mut UnixStream, response: Response) -> Result<()> {
    let frame = match response.encode() {
        Ok(frame) => frame,
        Err(error) => Response::Error(error).encode()?,
    };
    write_frame(stream, &frame)
}

/// Reads the next request: `None` when the connection is over (closed, broken, or bytes that
/// are no request, which are answered with [`Error::Protocol`] first).
fn next_request(stream: &mut UnixStream) -> Option<Request> {
    let decoded = match read_frame(stream) {
        Ok(Frame::Message(message)) => Request::decode(&message),
        Ok(Frame::Closed) => return None,
        Err(error) => Err(error),
    };
    match decoded {
        Ok(request) => Some(request),
        Err(error) => {
            let _ = answer(stream, Response::Error(error));
            None
        }
    }
}

/// Serves one client: its hello, then one response per request until it closes.
fn serve_connection(store: &Store, mut stream: UnixStream) {
    let hello = match next_request(&mut stream) {
        Some(Request::Hello { version: PROTOCOL_VERSION }) => Response::Hello { version: PROTOCOL_VERSION },
        Some(Request::Hello { version }) => {
            Response::Error(Error::ProtocolVersion { client: version, server: PROTOCOL_VERSION })
        }
        Some(_) => Response::Error(protocol("a connection opens with a hello")),
        None => return,
    };
    let welcomed = matches!(hello, Response::Hello { .. });
    if answer(&mut stream, hello).is_err() || !welcomed {
        return;
    }
    while let Some(request) = next_request(&mut stream) {
        let response = match request {
            Request::ExecuteLeased { lease, agent, key, parents } => {
                match execute_leased(store, &mut stream, &lease, (&agent, &key, &parents)) {
                    Some(response) => response,
                    None => return,
                }
            }
            request => call(store, request).unwrap_or_else(Response::Error),
        };
        if answer(&mut stream, response).is_err() {
            return;
        }
    }
}

/// Answers one call outside an atom.
fn call(store: &Store, request: Request) -> Result<Response> {
    Ok(match request {
        Request::CreateRun { name, pipeline, pipeline_version, environment } => {
            let spec = RunSpec { environment, ..RunSpec::new(name).pipeline(pipeline, pipeline_version) };
            Response::Run(store.create_run(spec)?)
        }
        Request::RunId { name } => Response::MaybeRun(store.run_id(&name)),
        Request::AcquireLease { run, holder, ttl_us } => {
            Response::Lease(store.acquire_lease(run, &holder, Duration::from_micros(ttl_us))?)
        }
        Request::RenewLease { lease, ttl_us } => {
            Response::Lease(store.renew_lease(&lease, Duration::from_micros(ttl_us))?)
        }
        Request::ReleaseLease { lease } => {
            store.release_lease(lease)?;
            Response::Done
        }
        Request::LeaseOf { run } => Response::MaybeLease(store.lease_of(run)?),
        Request::RecordAtom { run, agent, key, parents, output } => {
            Response::AtomId(store.record_atom(run, &agent, &key, &parents, "", &output)?)
        }
        Request::Atom { atom } => Response::Atom(Box::new(store.atom(atom)?)),
        Request::ReadState { run, key } => Response::State(store.read_state(run, key)?),
        Request::Hello { .. } => return Err(protocol("a hello after the first message")),
        _ => return Err(protocol("an atom's request outside a leased atom")),
    })
}

/// Runs a leased atom whose work is the client's: `Begun`, then the client's exchange
/// requests against the [`Exchange`], until it completes or fails the atom. `None` when the
/// client went away inside the atom: the atom failed retryably (nothing of its output is
/// recorded, and the run's next holder executes it again), and the connection is over.
fn execute_leased(
    store: &Store,
    stream: &mut UnixStream,
    lease: &Lease,
    (agent, key, parents): (&str, &str, &[AtomId]),
) -> Option<Response> {
    let mut gone = false;
    let work = |exchange: &mut Exchange<'_>| {
        let outcome = relay(stream, exchange);
        gone = outcome.is_none();
        outcome.unwrap_or_else(|| {
            Err(AtomFailure { message: "the client went away inside the atom".into(), retryable: true })
        })
    };
    let outcome = store.execute_leased(lease, agent, key, parents, work);
    if gone {
        return None;
    }
    Some(match outcome {
        Ok(exchanged) => Response::Exchanged(Box::new(exchanged)),
        Err(error) => Response::Error(error),
    })
}

/// The atom's work, done by the client: `None` when the connection ended first.
fn relay(stream: &mut UnixStream, exchange: &mut Exchange<'_>) -> Option<std::result::Result<AtomOutput, AtomFailure>> {
    answer(stream, Response::Begun { atom: exchange.atom() }).ok()?;
    loop {
        let response = match next_request(stream)? {
            Request::Complete { output } => return Some(Ok(output)),
            Request::Fail { failure } => return Some(Err(failure)),
            request => exchange_call(exchange, request).unwrap_or_else(Response::Error),
        };
        answer(stream, response).ok()?;
    }
}

/// Answers one exchange request inside a leased atom.
fn exchange_call(exchange: &mut Exchange<'_>, request: Request) -> Result<Response> {
    Ok(match request {
        Request::Send { channel, payload } => {
            exchange.send(&channel, payload)?;
            Response::Done
        }
        Request::Receive { channel, consumer, max } => {
            let max = check_receive_max(max)?;
            Response::Messages(exchange.receive(&channel, &consumer, max)?)
        }
        Request::Read { key } => Response::State(exchange.read(key)?),
        Request::Put { key, value } => {
            exchange.put(key, value)?;
            Response::Done
        }
        Request::Add { key, amount } => {
            exchange.add(key, amount)?;
            Response::Done
        }
        Request::Append { key, item } => {
            exchange.append(key, item)?;
            Response::Done
        }
        _ => return Err(protocol("a call outside the atom's exchange inside a leased atom")),
    })
}

/// A remote receive's `max`, refused above [`SERVE_RECEIVE_MESSAGES_MAX`] (its answer must fit a frame).
pub(crate) fn check_receive_max(max: u32) -> Result<usize> {
    let max = max as usize;
    if max == 0 || max > SERVE_RECEIVE_MESSAGES_MAX {
        let reason =
            format!("a receive through the socket asks for 1 to {SERVE_RECEIVE_MESSAGES_MAX} messages, not {max}");
        return Err(Error::InvalidArgument { reason });
    }
    Ok(max)
}
