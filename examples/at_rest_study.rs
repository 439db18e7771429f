//! Measures what compressing blocks of plain records *at rest* would store per atom, against
//! what the store stores today (each record compressed on its own with the store's trained
//! dictionary): the figures behind `docs/BENCHMARKS.md` §6, "Space".
//!
//! A store of 12,000 realistic atoms is written on tmpfs (or the temp directory); the records
//! of the atoms after the dictionary is trained are decoded back to plain protobuf bodies,
//! then compressed in blocks of 16, 64 and 256 KiB at zstd levels 3, 9 and 19, with and
//! without a dictionary trained on the first 4,000 of them. Each block counts 16 bytes of
//! framing.
//!
//! `cargo run --release --example at_rest_study`

use std::time::Instant;

use continuum::codec::StoreRecord;
use continuum::synthetic::Transcript;
use continuum::{AtomOutput, Lsn, RunSpec, SnapshotPolicy, Store};
use prost::Message;

const ATOMS: usize = 12_000;
/// Atoms measured: those after the store's final dictionary (trained after 2,000 deltas).
const MEASURED: usize = 9_900;

fn main() {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.expect("temp dir");
    let store = Store::builder(dir.path())
        .snapshot_policy(SnapshotPolicy::NEVER)
        .background(false)
        .open()
        .expect("open the store");
    let run = store.create_run(RunSpec::new("space")).expect("run");
    let mut transcript = Transcript::new(42);
    let mut parents = Vec::new();
    for i in 0..ATOMS {
        let atom = store.begin_atom(run, "researcher", &format!("step-{i}"), &parents, "").expect("begin");
        let output = AtomOutput { delta: transcript.next_delta(500), result: format!("ok {i}").into_bytes() };
        store.complete_atom(atom, &output).expect("complete");
        parents = vec![atom];
    }
    let next = store.log().next_lsn().get();
    let (mut stored, mut plain) = (0usize, Vec::new());
    for lsn in next - 2 * MEASURED as u64..next {
        let bytes = store.log().read(Lsn::new(lsn)).expect("read").expect("a record");
        stored += bytes.len();
        plain.push(match store.decode_record(&bytes).expect("decode").record {
            StoreRecord::AtomStarted(started) => started.encode_to_vec(),
            StoreRecord::AtomCompleted(completed) => completed.encode_to_vec(),
            other => panic!("only atoms here, not {other:?}"),
        });
    }
    let per_atom = |bytes: usize| bytes as f64 / MEASURED as f64;
    println!("{MEASURED} atoms: records as stored today {:.1} bytes/atom (frames not counted)", per_atom(stored));
    println!("plain bodies {:.1} bytes/atom", per_atom(plain.iter().map(Vec::len).sum()));
    let samples: Vec<&[u8]> = plain.iter().take(4_000).map(Vec::as_slice).collect();
    let dictionary = zstd::dict::from_samples(&samples, 64 * 1024).expect("train");
    for block in [16usize << 10, 64 << 10, 256 << 10] {
        for level in [3, 9, 19] {
            for with_dictionary in [false, true] {
                let mut compressor = if with_dictionary {
                    zstd::bulk::Compressor::with_dictionary(level, &dictionary)
                } else {
                    zstd::bulk::Compressor::new(level)
                }
                .expect("compressor");
                let started = Instant::now();
                let (mut total, mut buffer) = (0usize, Vec::new());
                for record in &plain {
                    buffer.extend_from_slice(&(record.len() as u32).to_le_bytes());
                    buffer.extend_from_slice(record);
                    if buffer.len() >= block {
                        total += compressor.compress(&buffer).expect("compress").len() + 16;
                        buffer.clear();
                    }
                }
                if !buffer.is_empty() {
                    total += compressor.compress(&buffer).expect("compress").len() + 16;
                }
                let micros = started.elapsed().as_secs_f64() * 1e6 / MEASURED as f64;
                let label = format!("block {:>3} KiB, level {level:>2}, dictionary {with_dictionary}", block >> 10);
                println!("{label:<45} {:>7.1} bytes/atom  {micros:>7.2} µs/atom", per_atom(total));
            }
        }
    }
}
