//! A durable message queue on SQLite, as an agent framework without continuum would build
//! channels: a `messages` table, a consumer-offset row per (channel, consumer), and the agent's
//! atom row, all written in the one transaction of the agent's step, so that after a crash a
//! message exists iff the step that sent it committed and an offset advances iff the step that
//! consumed committed (the guarantees of continuum's channels). WAL mode with
//! `synchronous=FULL`: a step is durable when it returns, as continuum's default `Sync` is.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::Result;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS atoms (
    run TEXT NOT NULL,
    agent TEXT NOT NULL,
    atom_id INTEGER NOT NULL,
    status TEXT NOT NULL,
    delta BLOB NOT NULL,
    PRIMARY KEY (run, agent, atom_id)
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    channel TEXT NOT NULL,
    sender TEXT NOT NULL,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_channel ON messages (channel, id);
CREATE TABLE IF NOT EXISTS offsets (
    channel TEXT NOT NULL,
    consumer TEXT NOT NULL,
    offset INTEGER NOT NULL,
    PRIMARY KEY (channel, consumer)
);";
const SELECT_OFFSET: &str = "SELECT offset FROM offsets WHERE channel = ?1 AND consumer = ?2";
const SELECT_MESSAGES: &str = "SELECT id, payload FROM messages WHERE channel = ?1 AND id > ?2 ORDER BY id LIMIT ?3";
const INSERT_ATOM: &str = "INSERT INTO atoms (run, agent, atom_id, status, delta) VALUES (?1, ?2, ?3, 'completed', ?4)";
const INSERT_MESSAGE: &str = "INSERT INTO messages (channel, sender, payload) VALUES (?1, ?2, ?3)";
const UPSERT_OFFSET: &str = "INSERT INTO offsets (channel, consumer, offset) VALUES (?1, ?2, ?3)
    ON CONFLICT (channel, consumer) DO UPDATE SET offset = excluded.offset";
const COUNT_PENDING: &str = "SELECT count(*) FROM messages WHERE channel = ?1 AND id > ?2";

/// One agent's step: the atom it records, the message it sends, and the channel it consumes.
#[derive(Clone, Copy, Debug)]
pub struct Step<'a> {
    /// The run the atom belongs to.
    pub run: &'a str,
    /// The agent, which is also the consumer of `inbox`.
    pub agent: &'a str,
    /// The atom's id within its agent.
    pub atom_id: u64,
    /// The atom's encoded delta.
    pub delta: &'a [u8],
    /// The channel the agent consumes.
    pub inbox: &'a str,
    /// The channel it sends `payload` on.
    pub outbox: &'a str,
    /// The message it sends.
    pub payload: &'a [u8],
    /// At most this many messages are received.
    pub receive_max: usize,
}

/// The queue's database (`queue.db`, with its `-wal` and `-shm`), one connection shared behind
/// a lock, as LangGraph's `SqliteSaver` shares its connection.
pub struct SqliteQueue {
    connection: Mutex<Connection>,
}

impl SqliteQueue {
    /// Opens (creating) the queue in `dir`: WAL mode, `synchronous=FULL`.
    ///
    /// # Errors
    /// SQLite's errors.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let connection = Connection::open(dir.join("queue.db"))?;
        connection.pragma_update(None, "journal_mode", "WAL")?;
        connection.pragma_update(None, "synchronous", "FULL")?;
        connection.execute_batch(SCHEMA)?;
        Ok(Self { connection: Mutex::new(connection) })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (its transaction rolls back).
        self.connection.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs one step in one durable transaction: receives up to `receive_max` messages of the
    /// inbox past the agent's offset, records the atom, sends the payload and advances the
    /// offset. Returns the received messages (id, payload), oldest first.
    ///
    /// # Errors
    /// SQLite's errors; nothing of the step is recorded then.
    pub fn step(&self, step: &Step<'_>) -> Result<Vec<(i64, Vec<u8>)>> {
        let mut connection = self.lock();
        let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let received = {
            let offset: i64 = transaction
                .prepare_cached(SELECT_OFFSET)?
                .query_row(params![step.inbox, step.agent], |row| row.get(0))
                .optional()?
                .unwrap_or(0);
            let limit = i64::try_from(step.receive_max).unwrap_or(i64::MAX);
            let mut select = transaction.prepare_cached(SELECT_MESSAGES)?;
            let received = select
                .query_map(params![step.inbox, offset, limit], |row| Ok((row.get(0)?, row.get(1)?)))?
                .collect::<rusqlite::Result<Vec<(i64, Vec<u8>)>>>()?;
            let atom_id = i64::try_from(step.atom_id).unwrap_or(i64::MAX);
            transaction.prepare_cached(INSERT_ATOM)?.execute(params![step.run, step.agent, atom_id, step.delta])?;
            transaction.prepare_cached(INSERT_MESSAGE)?.execute(params![step.outbox, step.agent, step.payload])?;
            if let Some((last, _)) = received.last() {
                transaction.prepare_cached(UPSERT_OFFSET)?.execute(params![step.inbox, step.agent, last])?;
            }
            received
        };
        // IMPORTANT: with `synchronous=FULL` the commit returns once the WAL is synced.
        transaction.commit()?;
        Ok(received)
    }

    /// How many messages of `channel` `consumer` has not consumed.
    ///
    /// # Errors
    /// SQLite's errors.
    pub fn pending(&self, channel: &str, consumer: &str) -> Result<u64> {
        let connection = self.lock();
        let offset: i64 =
            connection.query_row(SELECT_OFFSET, params![channel, consumer], |row| row.get(0)).optional()?.unwrap_or(0);
        let count: i64 = connection.query_row(COUNT_PENDING, params![channel, offset], |row| row.get(0))?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Closes the database.
    ///
    /// # Errors
    /// SQLite's errors.
    pub fn close(self) -> Result<()> {
        let connection = self.connection.into_inner().unwrap_or_else(PoisonError::into_inner);
        connection.close().map_err(|(_, error)| error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_is_received_once_and_offsets_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("dir");
        let step = |queue: &SqliteQueue, agent: &str, atom_id: u64, inbox: &str, outbox: &str| {
            let step = Step {
                run: "r",
                agent,
                atom_id,
                delta: b"d",
                inbox,
                outbox,
                payload: agent.as_bytes(),
                receive_max: 10,
            };
            queue.step(&step).expect("step")
        };
        let queue = SqliteQueue::open(dir.path()).expect("open");
        assert!(step(&queue, "a", 1, "to-a", "to-b").is_empty());
        assert!(step(&queue, "a", 2, "to-a", "to-b").is_empty());
        let received = step(&queue, "b", 1, "to-b", "to-a");
        assert_eq!(received.iter().map(|(_, p)| p.as_slice()).collect::<Vec<_>>(), [b"a", b"a"]);
        assert_eq!(queue.pending("to-b", "b").expect("pending"), 0);
        queue.close().expect("close");
        let queue = SqliteQueue::open(dir.path()).expect("reopen");
        assert!(step(&queue, "b", 2, "to-b", "to-a").is_empty(), "consumed once");
        assert_eq!(queue.pending("to-a", "a").expect("pending"), 2);
    }
}
