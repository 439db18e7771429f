//! The compression dictionary: samples of the first deltas, a small dictionary trained early
//! and the final one later, each written to the log before any record uses it.

use std::sync::atomic::Ordering;

use crate::codec::proto;
use crate::codec::{self, StoreRecord};
use crate::config::Durability;
use crate::limits;
use crate::store::Store;

impl Store {
    /// Keeps encoded deltas until enough are seen, then has a dictionary trained and written
    /// to the log before any record uses it: a small one early, the final one later (records
    /// keep naming the dictionary they were compressed with, so both stay readable). Training
    /// takes tens of milliseconds, so a store with a background thread hands the samples to
    /// it instead of making one atom's completion wait (see `docs/ARCHITECTURE.md`, "Codec").
    pub(crate) fn sample_for_dictionary(&self, sample: impl FnOnce() -> Vec<u8>) {
        if self.shared.training_done.load(Ordering::Acquire) {
            return;
        }
        let (samples, bytes) = {
            let mut training = self.shared.training.lock();
            let segment_bytes = self.shared.log.config().segment_bytes;
            let (wanted, bytes) = match training.stage {
                TrainingStage::First => (limits::DICTIONARY_FIRST_SAMPLES, first_dictionary_bytes(segment_bytes)),
                TrainingStage::Final => (limits::DICTIONARY_TRAINING_SAMPLES, final_dictionary_bytes(segment_bytes)),
                TrainingStage::Done => return,
            };
            let sample = sample();
            if training.bytes + sample.len() <= limits::DICTIONARY_TRAINING_BYTES_MAX {
                training.bytes += sample.len();
                training.samples.push(sample);
            }
            if training.samples.len() < wanted {
                return;
            }
            if training.stage == TrainingStage::First {
                // The final dictionary learns from these samples too.
                training.stage = TrainingStage::Final;
                (training.samples.clone(), bytes)
            } else {
                training.stage = TrainingStage::Done;
                self.shared.training_done.store(true, Ordering::Release);
                training.bytes = 0;
                (std::mem::take(&mut training.samples), bytes)
            }
        };
        match &self.worker {
            Some(worker) => {
                self.shared.training.lock().pending = Some((samples, bytes));
                worker.wake();
            }
            None => self.train_dictionary(&samples, bytes),
        }
    }

    /// Trains the dictionary whose samples were handed to the background thread, if any.
    pub(crate) fn train_pending_dictionary(&self) {
        let pending = self.shared.training.lock().pending.take();
        if let Some((samples, bytes)) = pending {
            self.train_dictionary(&samples, bytes);
        }
    }

    /// Trains a dictionary of at most `bytes` from `samples`, appends it durably, and only
    /// then lets records be compressed with it.
    fn train_dictionary(&self, samples: &[Vec<u8>], bytes: usize) {
        // Training failure (samples too alike or too few) only means no new dictionary:
        // records stay compressed with the one before, or without one.
        let Some(dictionary) = codec::train_dictionary(samples, bytes) else { return };
        let id = self.shared.index.read().next_dictionary;
        let record = StoreRecord::Dictionary(proto::CompressionDictionary { id, dictionary: dictionary.clone() });
        // IMPORTANT: the dictionary is durable before any record compressed with it exists.
        match self.append(&record, Durability::Sync) {
            Ok(_) => {
                self.shared.index.write().next_dictionary = id + 1;
                self.shared.codec.add_dictionary(id, &dictionary);
            }
            // Records go on without it (compressed with the one before, or plain, and smaller
            // at rest after cold compression). The next open trains again from the stage the
            // log's dictionaries show.
            Err(error) => {
                self.shared.log.metrics_handle().record_maintenance_failure();
                tracing::warn!(%error, id, "compression dictionary not written");
            }
        }
    }
}

/// Room a dictionary record needs in a segment besides the dictionary itself: the segment
/// header, the frame header and record length, the envelope and the protobuf fields, rounded up.
const DICTIONARY_RECORD_SLACK: u64 = 1024;

/// The size of the final dictionary for segments of `segment_bytes`: `DICTIONARY_BYTES`, or
/// less when a record that large would not fit in one segment before its reserve (it could
/// never be written, and the store would silently keep compressing with the first, smaller
/// dictionary).
pub(crate) fn final_dictionary_bytes(segment_bytes: u64) -> usize {
    let room = segment_bytes.saturating_sub(limits::segment_reserve_bytes(segment_bytes));
    let fits = usize::try_from(room.saturating_sub(DICTIONARY_RECORD_SLACK)).unwrap_or(usize::MAX);
    limits::DICTIONARY_BYTES.min(fits)
}

/// The size of the first dictionary: `DICTIONARY_FIRST_BYTES`, at most half the final one's.
pub(crate) fn first_dictionary_bytes(segment_bytes: u64) -> usize {
    limits::DICTIONARY_FIRST_BYTES.min(final_dictionary_bytes(segment_bytes) / 2)
}

/// Samples of encoded deltas kept until the store's compression dictionary is trained.
pub(crate) struct Training {
    samples: Vec<Vec<u8>>,
    bytes: usize,
    stage: TrainingStage,
    /// Samples handed to the background thread, with the dictionary size to train from them.
    pending: Option<(Vec<Vec<u8>>, usize)>,
}

/// Which dictionary a store trains next: a small first one after
/// `DICTIONARY_FIRST_SAMPLES` records, then the final one after `DICTIONARY_TRAINING_SAMPLES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TrainingStage {
    First,
    Final,
    Done,
}

impl Training {
    pub fn new(stage: TrainingStage) -> Self {
        Self { samples: Vec::new(), bytes: 0, stage, pending: None }
    }

    /// Nothing left to train (the final dictionary exists, or the store is read-only).
    pub fn done() -> Self {
        Self::new(TrainingStage::Done)
    }

    /// Whether nothing is left to sample.
    pub fn is_done(&self) -> bool {
        self.stage == TrainingStage::Done
    }
}
