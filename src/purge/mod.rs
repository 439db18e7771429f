//! Layer 5, what the store keeps and gives back: the purge plan (`plan.rs`: the one
//! computation of what is live; `messages.rs`: which channel messages every live consumer has
//! consumed), retention (`retention.rs`: policy snapshots, the last K per
//! agent, expired runs), compaction (`compaction.rs`: rewriting segments to give dead space
//! back), and the background thread that runs them (`background.rs`).

pub(crate) mod background;
pub(crate) mod compaction;
pub(crate) mod messages;
pub(crate) mod plan;
pub(crate) mod retention;

pub use compaction::{CompactionReport, SpaceReport};
