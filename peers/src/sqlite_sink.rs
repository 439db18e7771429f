//! SQLite as a checkpointer uses it (LangGraph's `SqliteSaver`): one shared connection in WAL
//! mode, one row per atom, the primary key a checkpointer would look atoms up by, and one
//! transaction per acknowledged write.

use std::path::Path;
use std::sync::Mutex;

use continuum::Delta;
use prost::Message;
use rusqlite::{Connection, params};

use crate::{AtomRef, AtomSink, Mode, Names, Result, Resumed};

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS atoms (
    run TEXT NOT NULL,
    agent TEXT NOT NULL,
    atom_id INTEGER NOT NULL,
    status TEXT NOT NULL,
    delta BLOB NOT NULL,
    PRIMARY KEY (run, agent, atom_id)
)";
const INSERT: &str = "INSERT INTO atoms (run, agent, atom_id, status, delta) VALUES (?1, ?2, ?3, 'completed', ?4)";
const SELECT_AGENT: &str = "SELECT delta FROM atoms WHERE run = ?1 AND agent = ?2 ORDER BY atom_id";

/// One SQLite database file (`atoms.db`, with its `-wal` and `-shm`).
pub(crate) struct SqliteSink {
    /// One connection, shared behind a lock, as `SqliteSaver` shares its connection.
    connection: Mutex<Connection>,
    names: Names,
}

impl SqliteSink {
    /// Opens the database: WAL mode; `synchronous=FULL` for durable writes, `NORMAL` for
    /// buffered ones (a commit reaches the OS, the WAL is synced at checkpoints), `OFF` while
    /// loading a data set (synced by [`AtomSink::sync`]).
    pub(crate) fn open(dir: &Path, mode: Mode) -> Result<Self> {
        let connection = Connection::open(dir.join("atoms.db"))?;
        let synchronous = match mode {
            Mode::Durable => "FULL",
            Mode::Buffered => "NORMAL",
            Mode::Load => "OFF",
        };
        connection.pragma_update(None, "journal_mode", "WAL")?;
        connection.pragma_update(None, "synchronous", synchronous)?;
        connection.execute(SCHEMA, [])?;
        Ok(Self { connection: Mutex::new(connection), names: Names::new() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (its own transaction rolls
        // back), so a poisoned lock is still usable.
        self.connection.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl AtomSink for SqliteSink {
    fn append(&self, atom: &AtomRef<'_>) -> Result<()> {
        let (run, agent) = self.names.of(atom.agent)?;
        let connection = self.lock();
        let mut insert = connection.prepare_cached(INSERT)?;
        // Autocommit: the statement is its own transaction, committed (and, with FULL,
        // synced) before it returns.
        insert.execute(params![run, agent, atom.atom_id, atom.encoded])?;
        Ok(())
    }

    fn append_batch(&self, atoms: &[AtomRef<'_>]) -> Result<()> {
        let mut connection = self.lock();
        let transaction = connection.transaction()?;
        {
            let mut insert = transaction.prepare_cached(INSERT)?;
            for atom in atoms {
                let (run, agent) = self.names.of(atom.agent)?;
                insert.execute(params![run, agent, atom.atom_id, atom.encoded])?;
            }
        }
        transaction.commit()?;
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        // A full checkpoint copies the WAL into the database file and syncs both.
        let connection = self.lock();
        connection.pragma_update(None, "synchronous", "FULL")?;
        connection.query_row("PRAGMA wal_checkpoint(FULL)", [], |_| Ok(()))?;
        Ok(())
    }

    fn resume(&self, agent: u32) -> Result<Resumed> {
        let (run, agent) = self.names.of(agent)?;
        let connection = self.lock();
        let mut select = connection.prepare_cached(SELECT_AGENT)?;
        let mut rows = select.query(params![run, agent])?;
        let mut atoms = 0;
        while let Some(row) = rows.next()? {
            let blob = row.get_ref(0)?.as_blob().map_err(rusqlite::Error::from)?;
            let delta = Delta::decode(blob)?;
            std::hint::black_box(&delta);
            atoms += 1;
        }
        Ok(Resumed { atoms })
    }

    fn close(self: Box<Self>) -> Result<()> {
        let connection = self.connection.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        connection.close().map_err(|(_, error)| error)?;
        Ok(())
    }
}
