//! Several processes sharing one store (`docs/ARCHITECTURE.md`, "Several processes"): the
//! process that holds the store's single-writer lock serves the others over a Unix domain
//! socket ([`Store::serve`](crate::Store::serve) → [`Server`]), and they call it through a
//! [`Client`], whose methods mirror the store's. Clients never open the store; the lock is
//! never broken, so every lease grant and every fenced end passes the one process's check.
//!
//! Each call is one request frame and one response frame (`docs/FORMAT.md`, "Local socket
//! protocol"). A leased atom is a conversation: the server begins it under the lease and
//! answers `Begun`, the client's work runs in the client with a [`RemoteExchange`], and the
//! client's `Complete` or `Fail` ends it under the lease's fence. A client that goes away
//! inside an atom fails it retryably, recording nothing of its output, so the run's next
//! holder executes it again.

mod client;
mod frame;
mod protocol;
mod server;

pub use client::{Client, RemoteExchange};
pub use protocol::PROTOCOL_VERSION;
pub use server::Server;

/// The socket's file name in the store directory when [`Store::serve`](crate::Store::serve)
/// is given no path.
pub const SOCKET_FILE_NAME: &str = "continuum.sock";

#[cfg(test)]
mod tests;
