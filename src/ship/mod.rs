//! Shipping a store to S3-compatible object storage, restoring it on another host, and fencing
//! the owner it was taken from (`docs/ARCHITECTURE.md`, "Object storage"; feature
//! `object-store`).
//!
//! A store opened with [`StoreBuilder::ship_to`](crate::StoreBuilder::ship_to) uploads each
//! sealed segment and each snapshot file once, in the background, and lists them in one
//! manifest object per store, changed only by conditional writes. Optionally it also ships the
//! active segment's prefix every [`Remote::ship_interval`]. [`Store::restore_from`](crate::Store::restore_from)
//! takes the store over on another host (the manifest's epoch + 1, by a conditional write,
//! first), downloads what the manifest lists, verifies it and opens the store there; the
//! previous owner's next manifest write fails its condition, and its store refuses every
//! append from then on with [`Error::Fenced`].
//!
//! ```
//! use continuum::{AtomOutput, RunSpec, Store, ship::Remote};
//!
//! # fn main() -> continuum::Result<()> {
//! let bucket = Remote::in_memory("agents/store-1");
//! let first = tempfile::tempdir().expect("a temporary directory");
//! let store = Store::builder(first.path()).segment_bytes(4096).ship_to(bucket.clone().owner("host-a")).open()?;
//! let run = store.create_run(RunSpec::new("research"))?;
//! let output = AtomOutput { delta: Default::default(), result: b"done".to_vec() };
//! for i in 0..50 {
//!     store.record_atom(run, "planner", &format!("step-{i}"), &[], "", &output)?;
//! }
//! store.ship_now()?; // the sealed segments are in the bucket
//!
//! // Host A is gone: host B takes the store over and continues it.
//! let second = tempfile::tempdir().expect("a temporary directory");
//! let (restored, report) = Store::restore_from(bucket.owner("host-b"), second.path())?;
//! assert_eq!(report.epoch, 2);
//! assert!(restored.run_id("research").is_some());
//! // Host A's store is fenced at its next shipping cycle.
//! assert!(matches!(store.ship_now(), Err(continuum::Error::Fenced { .. })));
//! # Ok(())
//! # }
//! ```

mod claim;
mod layout;
mod manifest;
mod restore;
mod shipper;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

pub use object_store;
use object_store::ObjectStore;
pub use restore::RestoreReport;
pub(crate) use shipper::Shipper;
pub use shipper::ShippingStatus;

use crate::error::{Error, Result};
use crate::limits;

/// Where a store ships to: an object store, the prefix (folder) of this store's objects in it,
/// this owner's name, and how often to ship.
#[derive(Clone)]
pub struct Remote {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) prefix: String,
    pub(crate) owner: String,
    pub(crate) options: ShipOptions,
}

/// How often a store ships ([`Remote`]'s settings).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShipOptions {
    pub poll: Duration,
    pub ship_interval: Option<Duration>,
    pub grace: Duration,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("store", &self.store.to_string())
            .field("prefix", &self.prefix)
            .field("owner", &self.owner)
            .field("options", &self.options)
            .finish()
    }
}

impl Remote {
    /// `store`, with this store's objects under `prefix` (one prefix per store).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Self {
        Remote {
            store,
            prefix: prefix.trim_matches('/').to_owned(),
            owner: default_owner(),
            options: ShipOptions {
                poll: Duration::from_millis(limits::SHIP_POLL_MS_DEFAULT),
                ship_interval: None,
                grace: Duration::from_millis(limits::SHIP_GRACE_MS_DEFAULT),
            },
        }
    }

    /// An in-memory object store (for tests and examples): clones share its objects.
    pub fn in_memory(prefix: &str) -> Self {
        Remote::new(Arc::new(object_store::memory::InMemory::new()), prefix)
    }

    /// An S3 bucket configured from the usual environment variables (`AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT` for S3-compatible servers,
    /// `AWS_ALLOW_HTTP=true` for a plain-HTTP endpoint...).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the configuration is incomplete or invalid.
    pub fn s3_from_env(bucket: &str, prefix: &str) -> Result<Self> {
        let builder = tuned(object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket));
        let store = builder.build().map_err(|error| Error::InvalidConfig { reason: error.to_string() })?;
        Ok(Remote::new(Arc::new(store), prefix))
    }

    /// An S3-compatible server at `endpoint` (`http://127.0.0.1:8333`), with explicit
    /// credentials (empty ones for a server that allows anonymous access).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the configuration is invalid.
    pub fn s3(endpoint: &str, bucket: &str, prefix: &str, access_key: &str, secret_key: &str) -> Result<Self> {
        let mut builder = tuned(object_store::aws::AmazonS3Builder::new())
            .with_endpoint(endpoint)
            .with_bucket_name(bucket)
            .with_region("us-east-1")
            .with_allow_http(endpoint.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
        if access_key.is_empty() {
            builder = builder.with_skip_signature(true);
        } else {
            builder = builder.with_access_key_id(access_key).with_secret_access_key(secret_key);
        }
        let store = builder.build().map_err(|error| Error::InvalidConfig { reason: error.to_string() })?;
        Ok(Remote::new(Arc::new(store), prefix))
    }

    /// This owner's name, recorded in the manifest for people (default: host name and pid).
    #[must_use]
    pub fn owner(mut self, name: &str) -> Self {
        self.owner = name.to_owned();
        self
    }

    /// How often the shipping thread looks for newly sealed segments and snapshots, and checks
    /// that the store is still its own (default 1 s). A failed cycle is retried after a wait
    /// that doubles from this up to 30 s.
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.options.poll = interval.max(Duration::from_millis(1));
        self
    }

    /// Ships the active segment's records too, at most this often (default: off, only sealed
    /// segments are shipped). On, it bounds what a lost host loses: the records of the last
    /// `interval` (plus one cycle's upload); off, a lost host loses its whole active segment.
    #[must_use]
    pub fn ship_interval(mut self, interval: Option<Duration>) -> Self {
        self.options.ship_interval = interval;
        self
    }

    /// How long an object no manifest lists stays in the bucket before retention deletes it
    /// (default 1 h): a reader of an older manifest has that long to download what it lists.
    #[must_use]
    pub fn grace(mut self, grace: Duration) -> Self {
        self.options.grace = grace;
        self
    }

    /// The object store.
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The prefix of this store's objects.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Runs `future` to completion on the runtime shipping runs its object store calls on:
    /// what a tool that calls the object store itself uses, since an HTTP client's pooled
    /// connections belong to the runtime that opened them.
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        runtime().block_on(future)
    }
}

/// `builder` with shipping's retries: [`limits::SHIP_REQUEST_RETRIES`] within
/// [`limits::SHIP_RETRY_TIMEOUT_MS`] (the client's default, 10 within 3 minutes, would hold a
/// close or a restore that long on a bucket out of reach; the shipping thread backs off on its
/// own).
fn tuned(builder: object_store::aws::AmazonS3Builder) -> object_store::aws::AmazonS3Builder {
    builder.with_retry(object_store::RetryConfig {
        backoff: object_store::BackoffConfig::default(),
        max_retries: limits::SHIP_REQUEST_RETRIES,
        retry_timeout: Duration::from_millis(limits::SHIP_RETRY_TIMEOUT_MS),
    })
}

/// Runs `work` on the runtime's blocking threads (hashing, compression, file writes), beside the
/// transfers in flight; `what` names it if its thread panicked.
pub(crate) async fn blocking<T: Send + 'static>(
    what: &'static str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| Error::io(what, "", std::io::Error::other(error.to_string())))
}

/// The process's runtime for object store calls: two I/O threads drive every connection, and
/// each caller's thread runs its own future ([`Remote::block_on`]).
///
/// # Panics
/// If the OS refuses the runtime's threads when it is first needed.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("continuum-io")
            .enable_all()
            .build()
            .expect("the object store runtime's threads start")
    })
}

/// `host-pid`, the default owner name.
fn default_owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    format!("{}-{}", if host.is_empty() { "host" } else { host }, std::process::id())
}

/// Proves that `shared`'s directory owns `remote`'s prefix (creating the manifest the first
/// time, and the directory's claim with it), then starts the shipping thread.
///
/// # Errors
/// [`Error::Fenced`] when another host owns the prefix; [`Error::InvalidArgument`] when it holds
/// another store; [`Error::ObjectStore`] when the bucket fails; [`Error::Io`] writing the claim.
pub(crate) fn start(shared: &Arc<crate::store::Shared>, remote: Remote) -> Result<Shipper> {
    let (dir, storage) = (shared.log.dir(), shared.log.storage());
    let local = claim::read(storage.as_ref(), dir)?;
    let store = remote.store.as_ref();
    let owned = remote.block_on(claim::prove(store, &remote.prefix, &remote.owner, shared.store_id, local))?;
    if local.is_none() {
        claim::write(storage.as_ref(), dir, owned.claim)?;
    }
    Shipper::start(Arc::clone(shared), remote, owned)
}

impl crate::Store {
    /// What shipping has done so far; `None` for a store opened without
    /// [`StoreBuilder::ship_to`](crate::StoreBuilder::ship_to).
    pub fn shipping_status(&self) -> Option<ShippingStatus> {
        self.shipper.as_ref().map(Shipper::status)
    }

    /// Runs a shipping cycle now and waits for it: when it returns `Ok`, every segment sealed
    /// and every snapshot written before the call (and, with [`Remote::ship_interval`] on,
    /// every record appended before it) is in the bucket and listed in its manifest.
    ///
    /// # Errors
    /// [`Error::Fenced`] when another host took the store over; [`Error::ObjectStore`] when the
    /// bucket fails (the thread retries); [`Error::InvalidArgument`] without shipping.
    pub fn ship_now(&self) -> Result<()> {
        match &self.shipper {
            Some(shipper) => shipper.ship_now(),
            None => Err(Error::InvalidArgument { reason: "the store does not ship: StoreBuilder::ship_to".into() }),
        }
    }
}
