//! The shared thread pool that decoding work runs on: the index fold at open and context
//! rebuilds (`replay`).

use std::sync::OnceLock;

use crate::limits;

/// The shared pool rebuilds decode on: one thread per core, at most `REPLAY_THREADS_MAX`.
pub(crate) fn replay_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads(cores.min(limits::REPLAY_THREADS_MAX))
            .thread_name(|i| format!("continuum-replay-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}
